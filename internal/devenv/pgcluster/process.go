package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/redact"
)

func childEnv() []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		// Variables such as PGDATA or PGPORT must not redirect the private cluster.
		if len(kv) >= 2 && kv[:2] == "PG" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (c *Cluster) initdb(ctx context.Context, bins Binaries, runAs *osUser, noSync bool) error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		c.log.Info("reusing PostgreSQL data directory", zap.String("data_dir", c.dataDir))
		return nil
	}
	auth := []string{"-A", "trust"}
	if c.password != "" {
		// Replaced by writeAuthConfig before the server first starts; nothing is trusted.
		auth = []string{"--auth-local=peer", "--auth-host=reject"}
	}
	args := append([]string{"-D", c.dataDir, "-U", Superuser, "-E", "UTF8", "--locale=C"}, auth...)
	if noSync {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, bins.Initdb, args...)
	cmd.Dir = "/"
	cmd.Env = childEnv()
	if runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs.credential()}
	}
	c.log.Info("initialising PostgreSQL data directory", zap.String("data_dir", c.dataDir))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb %s: %w: %s", c.dataDir, err, tail(string(out), 2000))
	}
	return nil
}

func (c *Cluster) spawn(bins Binaries, runAs *osUser, opts Options) error {
	args := []string{
		"-D", c.dataDir,
		"-p", strconv.Itoa(c.port),
		"-k", c.sockDir,
		"-c", "listen_addresses=" + c.host,
		"-c", "log_line_prefix=",
	}
	settings := map[string]string{}
	if opts.NoFsync {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	cmd := exec.Command(bins.Postgres, args...)
	cmd.Dir = "/"
	cmd.Env = childEnv()
	cmd.Stdout = c.out
	cmd.Stderr = c.out
	// Backends inherit the output pipe; do not let a straggler hold Wait forever.
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = postmasterProcAttr()
	if runAs != nil {
		cmd.SysProcAttr.Credential = runAs.credential()
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bins.Postgres, err)
	}
	c.cmd = cmd
	go func() {
		c.exitErr = cmd.Wait()
		close(c.done)
	}()
	return nil
}

// waitReady polls until the server accepts a connection, it exits, ctx ends or timeout passes.
func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 20 * time.Millisecond
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attempt, c.adminConnString())
		cancelAttempt()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("postgres exited before accepting connections (%v); its output:\n%s", c.exitErr, c.out.Tail())
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections on %s:%d within %s (last error: %v); its output:\n%s",
				c.host, c.port, timeout, redact.Err(err), c.out.Tail())
		case <-time.After(delay):
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}
