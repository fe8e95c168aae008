package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/testpki"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// TestMain runs main itself when the test binary is started as mcpsync-worker by runWorker.
func TestMain(m *testing.M) {
	if os.Getenv("MCPSYNC_WORKER_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// runWorker runs mcpsync-worker (this test binary as main) with env added to the test's
// environment until it exits, and returns its exit code and what it said on stderr as itself
// (lines starting "mcpsync-worker:" and lines continuing one, which start with a tab), not the
// log lines.
func runWorker(t *testing.T, env ...string) (int, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), "MCPSYNC_WORKER_AS_MAIN=1"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := 0
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var said []string
	for _, line := range strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n") {
		if strings.HasPrefix(line, "mcpsync-worker:") || strings.HasPrefix(line, "\t") {
			said = append(said, line)
		}
	}
	return code, said
}

// A ledger database that does not answer ends the worker with exit 1 and one line naming it,
// its password masked: pgx's message, one line per connection attempt (two for 127.0.0.1
// under the default sslmode=prefer), is folded into that line.
func TestUnreachableDatabaseOneLine(t *testing.T) {
	addr := closedAddr(t)
	code, said := runWorker(t, "MCPSYNC_GATEWAY_ADDR=off",
		"DATABASE_URL=postgres://mcpsync:s3cret-pw@"+addr+"/mcpsync?connect_timeout=2")
	if code != 1 || len(said) != 1 {
		t.Fatalf("exit %d, stderr says %q; want exit 1 and one mcpsync-worker line", code, said)
	}
	msg := said[0]
	for _, w := range []string{"database postgres://mcpsync:***@" + addr, "unreachable", "connection refused"} {
		if !strings.Contains(msg, w) {
			t.Errorf("%q lacks %q", msg, w)
		}
	}
	if n := strings.Count(msg, "connection refused"); n != 1 || strings.Contains(msg, "s3cret-pw") {
		t.Errorf("%q: want the refusal once and no password", msg)
	}
}

// A gateway or metrics address no listener would take is bad input: exit 2 and one line
// naming the variable, before the database is contacted (DATABASE_URL points at a closed
// port, which would end the worker with exit 1). An empty value serves none and is no error.
func TestBadListenAddressRefusedFirst(t *testing.T) {
	db := "DATABASE_URL=postgres://mcpsync@" + closedAddr(t) + "/mcpsync?sslmode=disable&connect_timeout=2"
	for _, tc := range []struct {
		name string
		env  []string
		code int
		want string
	}{
		{"gateway without port", []string{"MCPSYNC_GATEWAY_ADDR=nonsense"}, 2, `MCPSYNC_GATEWAY_ADDR="nonsense": want host:port`},
		{"gateway port out of range", []string{"MCPSYNC_GATEWAY_ADDR=127.0.0.1:99999"}, 2, `MCPSYNC_GATEWAY_ADDR="127.0.0.1:99999": want host:port`},
		{"metrics without port", []string{"MCPSYNC_GATEWAY_ADDR=off", "MCPSYNC_METRICS_ADDR=metrics"}, 2, `MCPSYNC_METRICS_ADDR="metrics": want host:port`},
		{"both off", []string{"MCPSYNC_GATEWAY_ADDR=off", "MCPSYNC_METRICS_ADDR="}, 1, "unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, said := runWorker(t, append(tc.env, db)...)
			if code != tc.code || len(said) != 1 || !strings.Contains(said[0], tc.want) {
				t.Fatalf("exit %d, stderr says %q; want exit %d and one line with %q", code, said, tc.code, tc.want)
			}
		})
	}
}

// A bad Temporal TLS flag is bad input: one line naming the flag, exit 2, before anything is
// contacted; usable flags, or none, pass (issue 17 item 1).
func TestTemporalTLSFlags(t *testing.T) {
	for _, k := range []string{"TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CA", "TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_TLS", "TEMPORAL_API_KEY"} {
		t.Setenv(k, "")
	}
	dir := t.TempDir()
	p := testpki.New(t, dir, "w")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"none", nil, 0, nil},
		{"CA", []string{"--temporal-tls-ca", p.CA}, 0, nil},
		{"mTLS", []string{"--temporal-tls-cert", p.Cert, "--temporal-tls-key", p.Key, "--temporal-tls-ca", p.CA}, 0, nil},
		{"cert without key", []string{"--temporal-tls-cert", p.Cert}, 2, []string{"--temporal-tls-cert", "without its key", "--temporal-tls-key"}},
		{"missing CA", []string{"--temporal-tls-ca", filepath.Join(dir, "none.pem")}, 2, []string{"--temporal-tls-ca", "none.pem", "cannot be read"}},
		{"CA not PEM", []string{"--temporal-tls-ca", notPEM}, 2, []string{"--temporal-tls-ca", "no PEM certificate"}},
		{"TLS off with a CA", []string{"--temporal-tls=false", "--temporal-tls-ca", p.CA}, 2, []string{"--temporal-tls (TEMPORAL_TLS) is false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := config.FromEnv()
			fs := flag.NewFlagSet("mcpsync-worker", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			env.TemporalFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			code := checkTemporalFlags(fs, env.Temporal, &stderr)
			msg := stderr.String()
			if code != tc.code || (code != 0 && strings.Count(msg, "\n") != 1) {
				t.Fatalf("exit %d, stderr %q; want exit %d and one line", code, msg, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
		})
	}
}

// MCPSYNC_NOTIFICATION_DELIVERY takes "update" (also unset) or "signal"; anything else is bad
// input: one line naming the variable, exit 2.
func TestNotificationDelivery(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  mcphost.Delivery
		code  int
	}{
		{"", mcphost.DeliverUpdate, 0},
		{"update", mcphost.DeliverUpdate, 0},
		{"signal", mcphost.DeliverSignal, 0},
		{"signals", 0, 2},
		{"UPDATE", 0, 2},
	} {
		t.Run(tc.value, func(t *testing.T) {
			var stderr bytes.Buffer
			d, code := checkDelivery(tc.value, &stderr)
			msg := stderr.String()
			if code != tc.code || d != tc.want {
				t.Fatalf("%q: delivery %v exit %d, want %v exit %d (stderr %q)", tc.value, d, code, tc.want, tc.code, msg)
			}
			if code != 0 && (strings.Count(msg, "\n") != 1 || !strings.Contains(msg, deliveryEnv) || !strings.Contains(msg, "update or signal")) {
				t.Errorf("stderr %q: want one line naming %s and its values", msg, deliveryEnv)
			}
		})
	}
}
