// Package devstack runs the deployment `make run` starts as the benchmarks measure it:
// bin/mcpsync-dev (embedded Temporal, Web UI, private PostgreSQL) and bin/mcpsync-worker as
// processes of their own, on free loopback ports, each in its own process group with its
// output in a log file, stopped by the benchmark that started them.
package devstack

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/devenv/ports"
)

// Binaries returns bin as an absolute path once it holds the commands make run starts (make
// build-run compiles them).
func Binaries(bin string) (string, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	for _, name := range []string{"mcpsync", "mcpsync-dev", "mcpsync-worker", "mcpsync-demo-server"} {
		if _, err := os.Stat(filepath.Join(abs, name)); err != nil {
			return "", fmt.Errorf("%w (run make build-run first)", err)
		}
	}
	return abs, nil
}

// Workdir makes the benchmark's temporary directory (mcpsync-<name>-*). With keep it says
// where that is and cleanup leaves it; otherwise cleanup removes it, with the PostgreSQL data
// of the mcpsync-dev named "dev" started in it, which may live outside it
// (pgcluster.Relocated, when run as root). Call cleanup once that mcpsync-dev has stopped.
func Workdir(name string, keep bool) (dir string, cleanup func(), err error) {
	dir, err = os.MkdirTemp("", "mcpsync-"+name+"-")
	if err != nil {
		return "", nil, err
	}
	if keep {
		fmt.Printf("%s: data and logs in %s\n", name, dir)
		return dir, func() {}, nil
	}
	return dir, func() {
		if err := pgcluster.RemoveRelocated(filepath.Join(DataDir(dir, "dev"), "pg")); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
		os.RemoveAll(dir)
	}, nil
}

// Environ is this process's environment without the variables that would point the processes
// it starts at another deployment: DATABASE_URL and TEMPORAL_*, and those starting with any of
// drop.
func Environ(drop ...string) []string {
	prefixes := append([]string{"DATABASE_URL=", "TEMPORAL_"}, drop...)
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(kv, p) })
	})
}

// Retry calls f until it succeeds or timeout has passed, every 500 ms, and returns its last
// error.
func Retry(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// FreePorts picks k distinct ports for mcpsync-dev to bind, outside the kernel's ephemeral
// range (ports.Free): no outgoing connection takes one before mcpsync-dev is up.
func FreePorts(k int) ([]string, error) {
	var out []string
	for len(out) < k {
		p, err := ports.Free("127.0.0.1")
		if err != nil {
			return nil, err
		}
		if s := strconv.Itoa(p); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// DevOptions says where and how StartDev runs mcpsync-dev.
type DevOptions struct {
	// Dir holds its data (Dir/<Name>-data, Dir/data for "dev") and its log (Dir/<Name>.log).
	Dir, Name string
	// Env is its environment (KEY=VALUE); DATABASE_URL unset gives it its own PostgreSQL.
	Env []string
	// Bin is the directory of the mcpsync binaries.
	Bin string
	// Persistence is its --temporal-persistence ("": its default).
	Persistence string
	// ParentPID is passed as --parent-pid: it stops itself when that process ends.
	ParentPID string
	// Prefix starts the lines StartDev prints (the benchmark's name).
	Prefix string
}

// StartDev runs bin/mcpsync-dev on free ports as make run does, and returns it with the
// KEY=VALUE lines of its dev.env once it is ready.
func StartDev(o DevOptions) (*exec.Cmd, []string, error) {
	ports, err := FreePorts(3)
	if err != nil {
		return nil, nil, err
	}
	data := DataDir(o.Dir, o.Name)
	args := []string{"--data-dir", data, "--frontend-port", ports[0], "--ui-port", ports[1], "--pg-port", ports[2], "--parent-pid", o.ParentPID}
	if o.Persistence != "" {
		args = append(args, "--temporal-persistence", o.Persistence)
	}
	dev, err := StartProc(o.Dir, o.Name, o.Env, filepath.Join(o.Bin, "mcpsync-dev"), args...)
	if err != nil {
		return nil, nil, err
	}
	env, err := awaitEnv(filepath.Join(data, "dev.env"), dev, 5*time.Minute)
	if err != nil {
		StopProcs(dev)
		// The data directory goes away without -keep: show why mcpsync-dev stopped.
		if b, rerr := os.ReadFile(filepath.Join(o.Dir, o.Name+".log")); rerr == nil {
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			for _, l := range lines[max(0, len(lines)-20):] {
				fmt.Printf("%s: %s.log: %s\n", o.Prefix, o.Name, l)
			}
		}
		return nil, nil, err
	}
	if b, err := os.ReadFile(filepath.Join(o.Dir, o.Name+".log")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "mcpsync-dev ready") {
				fmt.Printf("%s: %s\n", o.Prefix, l)
			}
		}
	}
	return dev, env, nil
}

// DataDir is the data directory StartDev gives the mcpsync-dev named name in dir.
func DataDir(dir, name string) string {
	if name == "dev" {
		return filepath.Join(dir, "data")
	}
	return filepath.Join(dir, name+"-data")
}

// StartProc starts a command in its own process group, its output in dir/name.log.
func StartProc(dir, name string, env []string, path string, args ...string) (*exec.Cmd, error) {
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	go func() { _ = cmd.Wait(); f.Close() }()
	return cmd, nil
}

// StopProcs asks the processes to stop (SIGTERM), all at once, and kills those still running
// after 30 s, so that stopping never takes longer than that.
func StopProcs(cmds ...*exec.Cmd) {
	for _, c := range cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for range 300 {
		alive := false
		for _, c := range cmds {
			alive = alive || c.Process.Signal(syscall.Signal(0)) == nil
		}
		if !alive {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range cmds {
		_ = c.Process.Kill()
	}
}

// awaitEnv waits for mcpsync-dev's dev.env and returns its KEY=VALUE lines, unquoted.
func awaitEnv(path string, dev *exec.Cmd, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			var out []string
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
				if !ok || strings.HasPrefix(k, "#") {
					continue
				}
				if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
					v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, `'`)
				}
				out = append(out, k+"="+v)
			}
			return out, nil
		}
		if dev.Process.Signal(syscall.Signal(0)) != nil {
			return nil, errors.New("mcpsync-dev exited before it was ready (see its log with -keep)")
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("mcpsync-dev not ready after %s", timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// LastLines is the last k lines of s, newline-terminated.
func LastLines(s string, k int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > k {
		lines = lines[len(lines)-k:]
	}
	return strings.Join(lines, "\n") + "\n"
}

// EnvValue is the value of key in a KEY=VALUE list (the last one wins), "" when absent.
func EnvValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if s, ok := strings.CutPrefix(kv, key+"="); ok {
			v = s
		}
	}
	return v
}
