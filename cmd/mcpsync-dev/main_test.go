package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain lets the test binary play a process that holds a port until its stdin closes, as
// a leftover mcpsync-dev's PostgreSQL does.
func TestMain(m *testing.M) {
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
