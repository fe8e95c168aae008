package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary play mcpsync-dev itself, or a process that holds a port until
// its stdin closes, as a leftover mcpsync-dev's PostgreSQL does.
func TestMain(m *testing.M) {
	if os.Getenv("MCPSYNC_DEV_AS_MAIN") == "1" { // TestBadInputBeforeAnythingStarts
		main()
		return
	}
	if os.Getenv("MCPSYNC_DEV_TEST_LISTEN") != "" {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A port held by another process (here: this test) is reported in one line naming the port,
// the flag that moves it, the PID that holds it and how to stop that process.
func TestPortHeldMessage(t *testing.T) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	err = checkPorts([]portFlag{{"--ui-port", port}})
	if err == nil {
		t.Fatalf("port %d held by this test: checkPorts passed", port)
	}
	msg := err.Error()
	pid := os.Getpid()
	for _, want := range []string{
		fmt.Sprintf("port %d", port),
		fmt.Sprintf("PID %d", pid),
		fmt.Sprintf("kill %d", pid),
		"--ui-port",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message %q is more than one line", msg)
	}
	if err := checkPorts([]portFlag{{"--ui-port", freePort(t)}}); err != nil {
		t.Errorf("free port: %v", err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// A port held by a child of an mcpsync process (a leftover mcpsync-dev's PostgreSQL) names
// both and says to stop the mcpsync process, which stops its child.
func TestPortHeldByChildOfLeftover(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe)
	child.Env = append(os.Environ(), "MCPSYNC_DEV_TEST_LISTEN=1")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); child.Wait() }()
	var port int
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if _, scanErr := fmt.Sscanf(line, "%d", &port); err != nil || scanErr != nil {
		t.Fatalf("child's port: %q %v %v", line, err, scanErr)
	}
	msg := checkPorts([]portFlag{{"--pg-port", port}}).Error()
	h, ok := portHolder(port)
	if !ok || h.PID != child.Process.Pid {
		t.Skipf("this system does not show who holds port %d (%+v): %s", port, h, msg)
	}
	// The test binary is named mcpsync-dev.test: it plays the leftover mcpsync-dev.
	for _, want := range []string{
		fmt.Sprintf("PID %d", child.Process.Pid),
		fmt.Sprintf("started by PID %d", os.Getpid()),
		fmt.Sprintf("kill %d", os.Getpid()),
		"left over",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}
}

// dev.env holds DATABASE_URL with the dev database's password: it is written readable by its
// owner only (mode 0600), even over an earlier file or a leftover temporary file that was
// world-readable, and it still reads back in a POSIX shell (issue 14 item 3).
func TestDevEnvFileMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dev.env")
	for _, leftover := range []string{path, path + ".tmp"} {
		if err := os.WriteFile(leftover, []byte("OLD=1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const url = "postgres://postgres:p4ss-w0rd_x@127.0.0.1:55432/mcpsync?sslmode=disable"
	if err := writeEnv(path, [][2]string{{"DATABASE_URL", url}, {"TEMPORAL_ADDRESS", "127.0.0.1:7233"}}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("dev.env mode %o, want 600", got)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	out, err := exec.Command("sh", "-c", `. "$1" && printf %s "$DATABASE_URL"`, "sh", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != url {
		t.Errorf("sourced DATABASE_URL = %q, want %q", out, url)
	}
}

// A port flag outside 1-65535 is bad input, refused in one line naming the flag before any
// port is tried; ports in range pass.
func TestPortFlagRange(t *testing.T) {
	for _, tc := range []struct {
		p    portFlag
		want string
	}{
		{portFlag{"--frontend-port", 7233}, ""},
		{portFlag{"--ui-port", 65535}, ""},
		{portFlag{"--pg-port", 1}, ""},
		{portFlag{"--frontend-port", 70000}, "bad --frontend-port 70000: want a port from 1 to 65535"},
		{portFlag{"--ui-port", -1}, "bad --ui-port -1: want a port from 1 to 65535"},
		{portFlag{"--pg-port", 0}, "bad --pg-port 0: want a port from 1 to 65535"},
	} {
		err := checkPortRange([]portFlag{{"--ui-port", 8233}, tc.p})
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("checkPortRange(%v) = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// Bad flags end mcpsync-dev with exit 2 and one line naming the flag before anything starts:
// a data directory that is a file is refused before PostgreSQL is initialised (it was, under
// /tmp, and left there, before Temporal failed on the directory with exit 1), a port out of
// range is not tried. (Whether /tmp gained a cluster is not checked here: tests of other
// packages running at the same time make clusters there.)
func TestBadInputBeforeAnythingStarts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ports := []string{"--frontend-port", fmt.Sprint(freePort(t)), "--ui-port", fmt.Sprint(freePort(t)), "--pg-port", fmt.Sprint(freePort(t))}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"data dir is a file", []string{"--data-dir", file}, "mcpsync-dev: bad --data-dir " + file + ": "},
		{"data dir under a file", []string{"--data-dir", filepath.Join(file, "x")}, "mcpsync-dev: bad --data-dir " + filepath.Join(file, "x") + ": "},
		{"port out of range", []string{"--data-dir", dir, "--frontend-port", "70000"}, "mcpsync-dev: bad --frontend-port 70000: want a port from 1 to 65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append(append([]string{}, ports...), tc.args...)...)
			cmd.Env = append(os.Environ(), "MCPSYNC_DEV_AS_MAIN=1", "DATABASE_URL=")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			exit, ok := err.(*exec.ExitError)
			msg := stderr.String()
			if !ok || exit.ExitCode() != 2 || !strings.HasPrefix(msg, tc.want) || strings.Count(msg, "\n") != 1 {
				t.Fatalf("%v: stderr %q; want exit 2 and one line starting %q", err, msg, tc.want)
			}
		})
	}
}
