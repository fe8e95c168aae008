package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/harness/testpki"
)

// --tls-cert, --tls-key and --tls-ca go together and must be usable; a bad combination is one
// line naming the flag (exit 2 in run), and good files give the frontend's TLS option with
// absolute paths (dev.env is read from elsewhere). Issue 17 item 1.
func TestFrontendTLSFlags(t *testing.T) {
	dir := t.TempDir()
	p := testpki.New(t, dir, "dev")
	other := testpki.New(t, dir, "other")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		want          []string
	}{
		{"cert only", p.Cert, "", "", []string{"--tls-cert, --tls-key and --tls-ca go together"}},
		{"no CA", p.Cert, p.Key, "", []string{"go together"}},
		{"missing key", p.Cert, filepath.Join(dir, "none.pem"), p.CA, []string{"--tls-key", "none.pem", "cannot be read"}},
		{"mismatched key", p.Cert, other.Key, p.CA, []string{"--tls-cert", "--tls-key", "not a usable certificate and key"}},
		{"CA not PEM", p.Cert, p.Key, notPEM, []string{"--tls-ca", "not.pem", "no PEM certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := frontendTLS(tc.cert, tc.key, tc.ca)
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || strings.Contains(msg, "TEMPORAL_") {
				t.Errorf("not one line in flag terms: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
		})
	}
	if got, err := frontendTLS("", "", ""); got != nil || err != nil {
		t.Errorf("no flags: %v, %v; want plain text", got, err)
	}
	t.Chdir(dir)
	got, err := frontendTLS("dev-cert.pem", "dev-key.pem", "dev-ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&devtemporal.TLS{CertFile: p.Cert, KeyFile: p.Key, CAFile: p.CA}, got); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
}
