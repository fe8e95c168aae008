package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/cli"
)

// TestMain runs main itself when the test binary is started as mcpsync by TestProcessExitCode.
func TestMain(m *testing.M) {
	if os.Getenv("MCPSYNC_STARTER_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// The process exits with the code cli.Run returns, and bad input is one line on stderr,
// with no stack running (TEMPORAL_ADDRESS and DATABASE_URL point at a closed port).
func TestProcessExitCode(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tests := []struct {
		args   []string
		code   cli.ExitCode
		stderr string
	}{
		{[]string{"help"}, cli.ExitOK, ""},
		{nil, cli.ExitUsage, "mcpsync: missing command (see mcpsync help)\n"},
		{[]string{"frobnicate"}, cli.ExitUsage, "mcpsync: unknown command \"frobnicate\" (see mcpsync help)\n"},
		{[]string{"get", "demo", "notauri"}, cli.ExitUsage, "mcpsync get: uri \"notauri\": no scheme\n"},
		{[]string{"source", "list"}, cli.ExitFailure, "mcpsync source list: ledger database unreachable"},
	}
	for _, tt := range tests {
		cmd := exec.Command(os.Args[0], tt.args...)
		cmd.Env = append(os.Environ(), "MCPSYNC_STARTER_AS_MAIN=1", "TEMPORAL_ADDRESS="+addr,
			"DATABASE_URL=postgres://mcpsync@"+addr+"/mcpsync?sslmode=disable&connect_timeout=2")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if cli.ExitCode(code) != tt.code {
			t.Errorf("mcpsync %v: exit %d, want %d (stderr %q)", tt.args, code, tt.code, stderr.String())
		}
		if got := stderr.String(); !strings.HasPrefix(got, tt.stderr) || strings.Count(got, "\n") > 1 || (tt.stderr == "") != (got == "") {
			t.Errorf("mcpsync %v: stderr %q, want one line starting %q", tt.args, got, tt.stderr)
		}
	}
}
