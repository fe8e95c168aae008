// The pgbench baseline of the ledger bench, and the database it runs against.

package ledger

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
)

type pgbench struct {
	bin, admin, db string
	clients        int
	duration       time.Duration
}

func (p pgbench) args(extra ...string) ([]string, []string, error) {
	u, err := url.Parse(p.admin)
	if err != nil {
		return nil, nil, fmt.Errorf("admin URL: %w", err)
	}
	args := []string{"-h", u.Hostname()}
	if port := u.Port(); port != "" {
		args = append(args, "-p", port)
	}
	if u.User != nil && u.User.Username() != "" {
		args = append(args, "-U", u.User.Username())
	}
	env := os.Environ()
	if pw, ok := u.User.Password(); ok {
		env = append(env, "PGPASSWORD="+pw)
	}
	if mode := u.Query().Get("sslmode"); mode != "" {
		env = append(env, "PGSSLMODE="+mode)
	}
	return append(append(args, extra...), p.db), env, nil
}

func (p pgbench) exec(ctx context.Context, extra ...string) (string, error) {
	args, env, err := p.args(extra...)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %v: %w\n%s", p.bin, args, err, out)
	}
	return string(out), nil
}

func (p pgbench) init(ctx context.Context, scale int) error {
	_, err := p.exec(ctx, "-i", "-q", "-s", strconv.Itoa(scale))
	return err
}

func (p pgbench) runArgs() []string {
	return []string{"-N", "-c", strconv.Itoa(p.clients), "-j", strconv.Itoa(min(p.clients, runtime.NumCPU())),
		"-T", strconv.Itoa(int(p.duration.Seconds()))}
}

func (p pgbench) command() string {
	return fmt.Sprintf("pgbench %v", p.runArgs())
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

func (p pgbench) run(ctx context.Context) (float64, error) {
	out, err := p.exec(ctx, p.runArgs()...)
	if err != nil {
		return 0, err
	}
	m := tpsLine.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no tps line in pgbench output:\n%s", out)
	}
	return strconv.ParseFloat(m[1], 64)
}

func findPgbench(flagValue string) (string, error) {
	candidates := []string{flagValue}
	if b, err := pgcluster.FindBinaries(); err == nil {
		candidates = append(candidates, filepath.Join(b.Dir, "pgbench"))
	}
	candidates = append(candidates, "/usr/lib/postgresql/15/bin/pgbench")
	if p, err := exec.LookPath("pgbench"); err == nil {
		candidates = append(candidates, p)
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() {
			return c, nil
		}
	}
	return "", errors.New("pgbench not found: install PostgreSQL's client tools or pass -pgbench")
}

func withDatabase(admin, db string) (string, error) {
	u, err := url.Parse(admin)
	if err != nil {
		return "", fmt.Errorf("admin URL: %w", err)
	}
	u.Path = "/" + db
	return u.String(), nil
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
