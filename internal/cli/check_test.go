package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/authmcp"
)

// `mcpsync source check` (issue 14, item 9): one connection as a worker would make, no ledger
// and no worker. These tests run it with a ledger and Temporal that are not there.

// checkRun runs `mcpsync source check args...` with no stack reachable.
func checkRun(t *testing.T, args ...string) (stdout, stderr string, code cli.ExitCode) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var out, errb bytes.Buffer
	code = cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Config: config.Env{
		TemporalAddress: addr, Namespace: "default",
		DatabaseURL: "postgres://mcpsync@" + addr + "/mcpsync?sslmode=disable&connect_timeout=2",
	}}, append([]string{"source", "check"}, args...))
	return out.String(), errb.String(), code
}

// checkJSON is the JSON `source check --json` prints.
type checkJSON struct {
	Transport       string `json:"transport"`
	Target          string `json:"target"`
	ProtocolVersion string `json:"protocolVersion"`
	ServerName      string `json:"serverName"`
	ServerVersion   string `json:"serverVersion"`
	Resources       bool   `json:"resources"`
	Subscribe       bool   `json:"subscribe"`
	ListChanged     bool   `json:"listChanged"`
	ResourceCount   int    `json:"resourceCount"`
	Pages           int    `json:"pages"`
	Truncated       string `json:"truncated,omitempty"`
}

func TestSourceCheckAuthenticatedServer(t *testing.T) {
	three := map[string]string{"demo://auth/a": "a", "demo://auth/b": "b", "demo://auth/c": "c"}
	srv := authmcp.New(t, authmcp.Options{Name: "checked", Version: "2.0.0", Tokens: []string{"check-token"}, Resources: three, PageSize: 1})
	mtls := authmcp.New(t, authmcp.Options{ClientCert: true, Headers: map[string]string{"X-Tenant": "acme"}})
	t.Setenv("CHECK_TOKEN", "check-token")
	t.Setenv("CHECK_TENANT", "acme")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("Bearer check-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	receipt := func(url, name, version string, count, pages int) checkJSON {
		return checkJSON{Transport: "http", Target: url, ProtocolVersion: "2025-11-25", ServerName: name, ServerVersion: version,
			Resources: true, Subscribe: true, ListChanged: true, ResourceCount: count, Pages: pages}
	}
	for _, tc := range []struct {
		name string
		args []string
		want checkJSON
	}{
		{"bearer-env, three pages", []string{"--url", srv.URL, "--bearer-env", "CHECK_TOKEN"}, receipt(srv.URL, "checked", "2.0.0", 3, 3)},
		{"bearer-file", []string{"--url", srv.URL, "--bearer-file", tokenFile}, receipt(srv.URL, "checked", "2.0.0", 3, 3)},
		{"mTLS and header-env", []string{"--url", mtls.URL, "--ca-file", mtls.CAFile, "--cert-file", mtls.ClientCertFile,
			"--key-file", mtls.ClientKeyFile, "--header-env", "X-Tenant=CHECK_TENANT"}, receipt(mtls.URL, "authmcp", "1.0.0", 2, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := checkRun(t, append(tc.args, "--json")...)
			if code != cli.ExitOK || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			var got checkJSON
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("stdout %q: %v", out, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("receipt (-want +got):\n%s", diff)
			}
		})
	}

	out, errOut, code := checkRun(t, "--url", srv.URL, "--bearer-env", "CHECK_TOKEN")
	want := "ok: http " + srv.URL + "\n" +
		"  protocol     2025-11-25\n" +
		"  server       checked 2.0.0\n" +
		"  resources    subscribe: yes, listChanged: yes\n" +
		"  listed       3 resources in 3 pages\n"
	if code != cli.ExitOK || errOut != "" {
		t.Fatalf("human form: exit %d, stderr %q", code, errOut)
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("human form (-want +got):\n%s", diff)
	}
}

// A failed check is exit 1 and one line: what failed, with the server's challenge for an
// authentication failure, and never a secret.
func TestSourceCheckFailures(t *testing.T) {
	srv := authmcp.New(t, authmcp.Options{Tokens: []string{"good"}})
	tlsSrv := authmcp.New(t, authmcp.Options{TLS: true})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	t.Setenv("CHECK_WRONG", "wrong-token-value")
	challenge := `Bearer resource_metadata="` + srv.ResourceMetadataURL + `"`
	for _, tc := range []struct {
		name   string
		args   []string
		prefix string // the stderr line starts with it
		absent string // and does not contain it
	}{
		{"no token", []string{"--url", srv.URL},
			"mcpsync source check: authentication failed: HTTP 401: " + challenge + " (no bearer token)", ""},
		{"wrong token", []string{"--url", srv.URL, "--bearer-env", "CHECK_WRONG"},
			"mcpsync source check: authentication failed: HTTP 401: " + challenge + " (unknown token: invalid token)", "wrong-token-value"},
		{"unset variable", []string{"--url", srv.URL, "--bearer-env", "CHECK_SURELY_UNSET"},
			`mcpsync source check: source "check": bearer token: environment variable CHECK_SURELY_UNSET is not set`, ""},
		{"unreachable server", []string{"--url", closed + "/mcp?tenant=t1"},
			"mcpsync source check: connect to " + closed + "/mcp?tenant=t1: ", ""},
		{"unknown CA", []string{"--url", tlsSrv.URL}, "mcpsync source check: connect to " + tlsSrv.URL + ": ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := checkRun(t, tc.args...)
			if code != cli.ExitFailure {
				t.Errorf("exit %d, want %d (stderr %q)", code, cli.ExitFailure, errOut)
			}
			line, ok := strings.CutSuffix(errOut, "\n")
			if !ok || strings.Contains(line, "\n") || out != "" {
				t.Errorf("stderr %q is not exactly one line (stdout %q)", errOut, out)
			}
			if !strings.HasPrefix(line, tc.prefix) {
				t.Errorf("stderr %q does not start with %q", line, tc.prefix)
			}
			if tc.absent != "" && strings.Contains(errOut, tc.absent) {
				t.Errorf("stderr %q shows %q", errOut, tc.absent)
			}
		})
	}
	if tlsLine := func() string { _, e, _ := checkRun(t, "--url", tlsSrv.URL); return e }(); !strings.Contains(tlsLine, "certificate signed by unknown authority") {
		t.Errorf("unknown CA: stderr %q does not say why", tlsLine)
	}
}

// A stdio server is checked the same way: the demo server, built for the test.
func TestSourceCheckStdio(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "mcpsync-demo-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/mcpsync/mcpsync/cmd/mcpsync-demo-server")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, errOut, code := checkRun(t, "--stdio", bin, "--json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got checkJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stdout %q: %v", out, err)
	}
	if got.Transport != "stdio" || got.Target != bin || !got.Resources || got.ResourceCount != 3 || got.ProtocolVersion != "2025-11-25" {
		t.Errorf("receipt %+v, want stdio %s with 3 resources over 2025-11-25", got, bin)
	}
}

// Bad input to `source check` (these rows belong with TestBadInput in cli_test.go, which
// another change owns): exit 2 and one line, nothing contacted.
func TestSourceCheckBadInput(t *testing.T) {
	usage := "(usage: mcpsync source check --stdio "
	for _, tc := range []struct {
		args     []string
		want     string
		contains bool // want is a prefix of the line
	}{
		{nil, `mcpsync source check: give --stdio "CMD ARGS" or --url URL ` + usage, true},
		{[]string{"extra", "--url", "http://h"}, `mcpsync source check: unexpected argument "extra" ` + usage, true},
		{[]string{"--bogus"}, "mcpsync source check: flag provided but not defined: -bogus " + usage, true},
		{[]string{"--url", ""}, "mcpsync source check: --url must not be empty", false},
		{[]string{"--url", "ftp://h"}, `mcpsync source check: --url "ftp://h" is not an http:// or https:// URL with a host`, false},
		{[]string{"--url", "http://[::1"}, `mcpsync source check: --url "http://[::1" is not an http:// or https:// URL with a host`, false},
		{[]string{"--url", "http://u:pw@h/"}, `mcpsync source check: http source "check": the URL http://u:***@h/ carries credentials`, true},
		{[]string{"--url", "http://h/mcp?api_key=pw@"}, `mcpsync source check: http source "check": the URL http://h/mcp?api_key=*** carries credentials`, true},
		{[]string{"--url", "http://h", "--stdio", "x"}, "mcpsync source check: give either --stdio or --url, not both", false},
		{[]string{"--url", "http://h", "--timeout", "0s"}, "mcpsync source check: --timeout must be positive, got 0s", false},
		{[]string{"--url", "http://h", "--header", "Authorization: Bearer x"}, `mcpsync source check: source "check": header "Authorization" carries a secret`, true},
		{[]string{"--url", "http://h", "--header", "no colon"}, `mcpsync source check: --header "no colon" must be 'Name: value'`, false},
		{[]string{"--url", "http://h", "--bearer-env", "A", "--bearer-file", "/x"}, `mcpsync source check: source "check": give at most one of`, true},
		{[]string{"--url", "http://h", "--cert-file", "/c.pem"}, `mcpsync source check: source "check": --cert-file and --key-file go together`, false},
		{[]string{"--stdio", "x", "--bearer-env", "A"}, `mcpsync source check: source "check": headers, bearer tokens, OAuth and TLS files apply to --url sources only`, false},
		{[]string{"--url", "http://h", "--json=maybe"}, `mcpsync source check: invalid boolean value "maybe" for -json: parse error ` + usage, true},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errOut, code := checkRun(t, tc.args...)
			if code != cli.ExitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, cli.ExitUsage, errOut)
			}
			line, ok := strings.CutSuffix(errOut, "\n")
			if !ok || strings.Contains(line, "\n") {
				t.Fatalf("stderr %q is not exactly one line", errOut)
			}
			if strings.Contains(line, "pw@") {
				t.Errorf("stderr %q shows the URL's password", line)
			}
			if tc.contains {
				if !strings.HasPrefix(line, tc.want) {
					t.Errorf("stderr %q does not start with %q", line, tc.want)
				}
				return
			}
			if diff := cmp.Diff(tc.want, line); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}
}
