package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/oauthas"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// browser is the Stdout of `source login` in these tests: it plays the operator's browser,
// following every URL printed on a line of its own with an HTTP client (the test
// authorization server approves at once and redirects to the loopback listener).
type browser struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	pending []byte
	opened  int
}

func (b *browser) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	b.pending = append(b.pending, p...)
	for {
		i := bytes.IndexByte(b.pending, '\n')
		if i < 0 {
			break
		}
		line := string(b.pending[:i])
		b.pending = b.pending[i+1:]
		if strings.HasPrefix(line, "http://") || strings.HasPrefix(line, "https://") {
			b.opened++
			go func() {
				if resp, err := http.Get(line); err == nil {
					resp.Body.Close()
				}
			}()
		}
	}
	return len(p), nil
}

func (b *browser) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// loginRun runs mcpsync with args against the ledger at dbURL (no Temporal), with stdout
// going to out.
func loginRun(t *testing.T, dbURL string, out *browser, args ...string) (stderr string, code cli.ExitCode) {
	t.Helper()
	var errb bytes.Buffer
	code = cli.Run(context.Background(), cli.Env{Stdout: out, Stderr: &errb, Config: config.Env{
		TemporalAddress: closedAddr(t), Namespace: "default", DatabaseURL: dbURL,
	}}, args)
	return errb.String(), code
}

// TestSourceLogin: `source login NAME` runs the authorization-code flow with PKCE against a
// real authorization server (protected-resource metadata discovery, loopback redirect), stores
// the tokens with mode 0600, and a worker-side connect (`source check`, which connects exactly
// as a worker does) then works with the stored token file alone.
func TestSourceLogin(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	as, err := oauthas.StartAuthServer(oauthas.Options{Clients: []oauthas.Client{{ID: "desktop"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(as.Close)
	rs := oauthas.StartResourceServer(as, oauthas.ResourceOptions{})
	t.Cleanup(rs.Close)
	tokenFile := filepath.Join(t.TempDir(), "secured.tokens.json")
	conn := []string{"--url", rs.URL, "--oauth", "authorization_code", "--oauth-client-id", "desktop", "--oauth-token-file", tokenFile}

	// Before login, a worker-side connect fails with the login hint.
	_, errOut, code := checkRun(t, conn...)
	if code != cli.ExitFailure || !strings.Contains(errOut, "authentication failed: HTTP 401") {
		t.Fatalf("check before login: exit %d, stderr %q; want exit 1 with the 401", code, errOut)
	}

	if errOut, code := loginRun(t, dbURL, &browser{}, append([]string{"source", "add", "secured"}, conn...)...); code != cli.ExitOK {
		t.Fatalf("source add: exit %d: %s", code, errOut)
	}
	out := &browser{}
	errOut, code = loginRun(t, dbURL, out, "source", "login", "secured", "--timeout", "20s")
	if code != cli.ExitOK || errOut != "" {
		t.Fatalf("source login: exit %d, stderr %q, stdout %q", code, errOut, out)
	}
	if out.opened != 1 || !strings.Contains(out.String(), "logged in: source secured, tokens stored in "+tokenFile+" (mode 0600)") {
		t.Errorf("source login printed %q: want one URL to open and the stored line", out)
	}
	if !strings.Contains(out.String(), "code_challenge_method=S256") || !strings.Contains(out.String(), "resource=") {
		t.Errorf("authorization URL %q: want PKCE S256 and the resource parameter", out)
	}
	fi, err := os.Stat(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("token file mode %04o, want 0600", perm)
	}
	tf, err := mcphost.ReadOAuthTokenFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if tf.RefreshToken == "" || tf.ClientID != "desktop" || tf.TokenURL != as.URL+"/token" {
		t.Errorf("token file: refresh token %t, client %q, token URL %q", tf.RefreshToken != "", tf.ClientID, tf.TokenURL)
	}
	if strings.Contains(out.String(), tf.AccessToken) || strings.Contains(out.String(), tf.RefreshToken) {
		t.Errorf("source login printed a token")
	}

	stdout, errOut, code := checkRun(t, append(conn, "--json")...)
	if code != cli.ExitOK {
		t.Fatalf("check with the stored tokens: exit %d, stderr %q", code, errOut)
	}
	var receipt struct {
		ResourceCount int `json:"resourceCount"`
	}
	if err := json.Unmarshal([]byte(stdout), &receipt); err != nil || receipt.ResourceCount != 1 {
		t.Errorf("check output %q: want the one resource listed", stdout)
	}
	if got := rs.Tokens(); len(got) != 1 || got[0] != tf.AccessToken {
		t.Errorf("the resource server accepted %d tokens, want exactly the stored one", len(got))
	}
}

// Bad input to `source login` (exit 2, one line; the dispatcher's rows are in TestBadInput),
// an unknown source and a removed one (exit 3) and a source without the authorization-code
// flow (exit 2).
func TestSourceLoginBadInput(t *testing.T) {
	removedAt := regexp.MustCompile(`at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ `)
	usage := "(usage: mcpsync source login NAME [--timeout 5m] | mcpsync source login --url URL --oauth authorization_code --oauth-token-file PATH [connection flags] [--timeout 5m])"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"x", "y"}, `mcpsync source login: unexpected argument "y" ` + usage},
		{[]string{"x", "--url", "http://127.0.0.1:9/mcp"}, "mcpsync source login: give NAME or the source's flags (--url), not both " + usage},
		{[]string{"x", "--timeout", "0s"}, "mcpsync source login: --timeout must be positive, got 0s"},
		{[]string{"x", "--timeout", "25h"}, "mcpsync source login: --timeout must be at most 24h0m0s, got 25h0m0s"},
		{[]string{"--url", "http://127.0.0.1:9/mcp"}, "mcpsync source login: source login does not use --oauth authorization_code: there is nothing to log in to"},
		{[]string{"--stdio", "server"}, "mcpsync source login: source login does not use --oauth authorization_code: there is nothing to log in to"},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth", "client_credentials", "--oauth-client-id", "c"},
			"mcpsync source login: source login does not use --oauth authorization_code: there is nothing to log in to"},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth", "authorization_code"},
			`mcpsync source login: source "login": OAuth authorization code needs --oauth-token-file`},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth", "authorization_code", "--oauth-token-file", "/t", "--oauth-client-metadata-url", "http://a/b"},
			`mcpsync source login: source "login": --oauth-client-metadata-url "http://a/b" must be an https URL with a path`},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth", "authorization_code", "--oauth-token-file", "/t", "--oauth-client-metadata-url", "https://a/"},
			`mcpsync source login: source "login": --oauth-client-metadata-url "https://a/" must be an https URL with a path`},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth", "authorization_code", "--oauth-token-file", "/t", "--oauth-client-key-file", "/k"},
			`mcpsync source login: source "login": --oauth-client-key-file applies to --oauth client_credentials only`},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth", "client_credentials", "--oauth-client-id", "c", "--oauth-client-key-file", "/k", "--oauth-client-secret-env", "V"},
			`mcpsync source login: source "login": give a client secret or --oauth-client-key-file, not both`},
		{[]string{"--url", "http://127.0.0.1:9/mcp", "--oauth-client-key-file", "/k"},
			"mcpsync source login: --oauth-* flags need --oauth client_credentials or --oauth authorization_code"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errOut, code := run(t, append([]string{"source", "login"}, tc.args...)...)
			if code != cli.ExitUsage {
				t.Errorf("exit %d, want %d", code, cli.ExitUsage)
			}
			if diff := cmp.Diff(tc.want+"\n", errOut); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}

	dbURL := pgtest.NewDB(t)
	if errOut, code := loginRun(t, dbURL, &browser{}, "source", "add", "plain", "--url", "http://127.0.0.1:9/mcp"); code != cli.ExitOK {
		t.Fatalf("source add: exit %d: %s", code, errOut)
	}
	if errOut, code := loginRun(t, dbURL, &browser{}, "source", "add", "gone", "--url", "http://127.0.0.1:9/mcp",
		"--oauth", "authorization_code", "--oauth-token-file", filepath.Join(t.TempDir(), "tokens.json")); code != cli.ExitOK {
		t.Fatalf("source add: exit %d: %s", code, errOut)
	}
	if errOut, code := loginRun(t, dbURL, &browser{}, "source", "remove", "gone", "--wait", "0s"); code != cli.ExitOK {
		t.Fatalf("source remove: exit %d: %s", code, errOut)
	}
	for _, tc := range []struct {
		name string
		code cli.ExitCode
		want string
	}{
		{"nosuch", cli.ExitNotFound, `mcpsync source login: unknown source "nosuch" (see mcpsync source list)`},
		{"gone", cli.ExitNotFound, "mcpsync source login: source gone was removed at TIME (mcpsync source add gone ... adds it again)"},
		{"plain", cli.ExitUsage, "mcpsync source login: source plain does not use --oauth authorization_code: there is nothing to log in to"},
	} {
		errOut, code := loginRun(t, dbURL, &browser{}, "source", "login", tc.name)
		if tc.name == "gone" { // the line names when it was removed
			errOut = removedAt.ReplaceAllString(errOut, "at TIME ")
		}
		if code != tc.code || errOut != tc.want+"\n" {
			t.Errorf("source login %s: exit %d, stderr %q; want exit %d, %q", tc.name, code, errOut, tc.code, tc.want)
		}
	}
}
