package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A Temporal TLS setting from the environment that cannot be used fails the command that
// connects with one line naming the setting (exit 1: it is the environment, not the command
// line), and never prints TEMPORAL_API_KEY (issue 17 item 1).
func TestTemporalConnBadEnv(t *testing.T) {
	const key = "tk_live_cli-s3cr3t-api-key"
	st := ledger.New(pgtest.NewPool(t))
	if _, _, err := st.AddSource(t.Context(), ledger.SourceSpec{Name: "s", Transport: ledger.TransportHTTP, URL: "http://127.0.0.1:1/mcp"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		conn config.TemporalConn
		want []string
	}{
		{"cert without key", config.TemporalConn{TLSCert: filepath.Join(dir, "c.pem"), APIKey: key}, []string{"TEMPORAL_TLS_CERT", "without its key"}},
		{"missing CA", config.TemporalConn{TLSCA: filepath.Join(dir, "none.pem"), APIKey: key}, []string{"TEMPORAL_TLS_CA", "none.pem", "cannot be read"}},
		{"CA not PEM", config.TemporalConn{TLSCA: notPEM}, []string{"TEMPORAL_TLS_CA", notPEM, "no PEM certificate"}},
		{"TEMPORAL_TLS not a boolean", config.TemporalConn{TLS: "yes please", APIKey: key}, []string{"TEMPORAL_TLS", "true or false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Store: st, Config: config.Env{
				TemporalAddress: closedAddr(t), Namespace: "default", DatabaseURL: "postgres://unused", Temporal: tc.conn,
			}}, []string{"reconcile", "s"})
			stderr := errb.String()
			if code != cli.ExitFailure || strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, key) {
				t.Errorf("exit %d, stderr %q: want exit 1 and one line without the API key", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q lacks %q", stderr, w)
				}
			}
		})
	}
}
