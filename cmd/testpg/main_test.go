package main_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// build compiles testpg into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testpg")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// clusterDir returns a directory the postgres OS user can reach, removed after the test.
func clusterDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/tmp", "testpg-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "pg")
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestRunPassesURLAndExitCode(t *testing.T) {
	bin := build(t)
	tests := []struct {
		name string
		dir  func(t *testing.T) string
		// kept: the data stays in the requested directory after exit; otherwise it was
		// relocated under /tmp (root, unreachable directory) and must be gone.
		kept bool
	}{
		{name: "reachable directory", dir: clusterDir, kept: true},
		{name: "private directory", dir: func(t *testing.T) string { return filepath.Join(t.TempDir(), "pg") }, kept: os.Geteuid() != 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "answer")
			script := `psql "$MCPSYNC_TEST_DATABASE_URL" -tAc 'SELECT 41 + 1' > ` + out + `; exit 3`
			dir := tt.dir(t)
			cmd := exec.CommandContext(ctxFor(t), bin, "run", "--dir", dir, "--", "sh", "-c", script)
			combined, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 3 {
				t.Fatalf("testpg run: %v, want exit code 3; output:\n%s", err, combined)
			}
			answer, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(answer)) != "42" {
				t.Errorf("the command's query through MCPSYNC_TEST_DATABASE_URL answered %q, want 42", answer)
			}
			m := readyLine.FindStringSubmatch(string(combined))
			if m == nil {
				t.Fatalf("no ready line in output:\n%s", combined)
			}
			dataDir := m[3]
			_, statErr := os.Stat(filepath.Join(dataDir, "PG_VERSION"))
			switch {
			case tt.kept && (dataDir != dir || statErr != nil):
				t.Errorf("data in %s (stat: %v), want it kept in %s", dataDir, statErr, dir)
			case !tt.kept && (dataDir == dir || !errors.Is(statErr, os.ErrNotExist)):
				t.Errorf("relocated data in %s still there after exit (stat: %v)", dataDir, statErr)
			}
		})
	}
}

var readyLine = regexp.MustCompile(`testpg: ready: (\S+) \(pid (\d+), data ([^)]+)\)`)

func TestStartWritesURLAndStopsOnSIGTERM(t *testing.T) {
	bin := build(t)
	portFile := filepath.Join(t.TempDir(), "url")
	cmd := exec.Command(bin, "start", "--dir", clusterDir(t), "--port-file", portFile)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	var url string
	var pid int
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if m := readyLine.FindStringSubmatch(sc.Text()); m != nil {
			url = m[1]
			pid, _ = strconv.Atoi(m[2])
			break
		}
	}
	if url == "" {
		t.Fatalf("testpg start never reported ready (scan error: %v)", sc.Err())
	}
	go func() { // keep draining so the child never blocks on a full pipe
		for sc.Scan() {
		}
	}()
	written, err := os.ReadFile(portFile)
	if err != nil {
		t.Fatalf("port file: %v", err)
	}
	if strings.TrimSpace(string(written)) != url {
		t.Errorf("port file holds %q, ready line says %q", written, url)
	}
	conn, err := pgx.Connect(ctxFor(t), url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	conn.Close(context.Background())

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("testpg start after SIGTERM: %v, want exit 0", err)
	}
	if _, err := os.Stat(portFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("port file still there after stop (stat: %v)", err)
	}
	if !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		t.Errorf("postgres PID %d still exists after testpg stopped", pid)
	}
}
