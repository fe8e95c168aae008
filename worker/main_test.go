package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/testpki"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

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
