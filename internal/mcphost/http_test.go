package mcphost_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"

	"github.com/mcpsync/mcpsync/internal/harness/authmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// Issue 14, item 1: authenticated HTTP sources, through DefaultTransport, an MCP client
// connect and resources/read against a real go-sdk server behind its auth middleware.

const readmeURI = "demo://auth/readme"

func httpSource(url string, c ledger.Connection) ledger.Source {
	return ledger.Source{SourceSpec: ledger.SourceSpec{Name: "authed", Transport: ledger.TransportHTTP, URL: url, Connection: c}}
}

// connectSource connects to src the way a session does; the session is closed by the test.
func connectSource(t *testing.T, tr mcp.Transport) (*mcp.ClientSession, error) {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "http-test", Version: "0"}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: mcphost.ProtocolVersion})
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

// readVia connects to src through DefaultTransport and reads readmeURI.
func readVia(t *testing.T, src ledger.Source) (string, mcp.Transport, error) {
	t.Helper()
	tr, err := mcphost.DefaultTransport(t.Context(), src)
	if err != nil {
		return "", nil, err
	}
	cs, err := connectSource(t, tr)
	if err != nil {
		return "", tr, err
	}
	res, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: readmeURI})
	if err != nil {
		return "", tr, err
	}
	return res.Contents[0].Text, tr, nil
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHTTPSourceAuthenticates(t *testing.T) {
	want := authmcp.DefaultResources[readmeURI]
	tokenSrv := authmcp.New(t, authmcp.Options{Tokens: []string{"tok-env-1", "tok-file-2"}})
	headerSrv := authmcp.New(t, authmcp.Options{Headers: map[string]string{"X-Tenant": "acme-42", "X-Team": "blue"}})
	tlsSrv := authmcp.New(t, authmcp.Options{TLS: true, Tokens: []string{"tok-tls"}})
	mtlsSrv := authmcp.New(t, authmcp.Options{ClientCert: true})
	t.Setenv("AUTHMCP_TOKEN", "tok-env-1")
	t.Setenv("AUTHMCP_PREFIXED", "Bearer tok-env-1")
	t.Setenv("AUTHMCP_TENANT", "acme-42")
	t.Setenv("AUTHMCP_TLS_TOKEN", "tok-tls")
	tokenFile := writeFile(t, "token", "tok-file-2\n")
	prefixedFile := writeFile(t, "token-prefixed", "  Bearer   tok-file-2 \n")
	for _, tc := range []struct {
		name string
		src  ledger.Source
	}{
		{"bearer-env", httpSource(tokenSrv.URL, ledger.Connection{BearerEnv: "AUTHMCP_TOKEN"})},
		{"bearer-env with Bearer prefix", httpSource(tokenSrv.URL, ledger.Connection{BearerEnv: "AUTHMCP_PREFIXED"})},
		{"bearer-file", httpSource(tokenSrv.URL, ledger.Connection{BearerFile: tokenFile})},
		{"bearer-file with Bearer prefix", httpSource(tokenSrv.URL, ledger.Connection{BearerFile: prefixedFile})},
		{"header-env and literal header", httpSource(headerSrv.URL, ledger.Connection{
			Headers:   []ledger.Header{{Name: "X-Team", Value: "blue"}},
			HeaderEnv: []ledger.HeaderRef{{Name: "X-Tenant", Env: "AUTHMCP_TENANT"}}})},
		{"TLS with ca-file and bearer", httpSource(tlsSrv.URL, ledger.Connection{CAFile: tlsSrv.CAFile, BearerEnv: "AUTHMCP_TLS_TOKEN"})},
		{"mTLS", httpSource(mtlsSrv.URL, ledger.Connection{CAFile: mtlsSrv.CAFile, CertFile: mtlsSrv.ClientCertFile, KeyFile: mtlsSrv.ClientKeyFile})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, tr, err := readVia(t, tc.src)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if got != want {
				t.Errorf("read %q, want %q", got, want)
			}
			if ae := mcphost.AuthFailure(tr, nil); ae != nil {
				t.Errorf("AuthFailure after a successful session = %v, want nil", ae)
			}
		})
	}
}

func TestHTTPSourceAuthFailures(t *testing.T) {
	tokenSrv := authmcp.New(t, authmcp.Options{Tokens: []string{"good-token"}})
	// A verifier that grants no scope, against a server that requires one: 403.
	scopeSrv := authmcp.New(t, authmcp.Options{Scopes: []string{"mcp:read"},
		Verifier: func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
			return &auth.TokenInfo{Expiration: time.Now().Add(time.Hour)}, nil
		}})
	headerSrv := authmcp.New(t, authmcp.Options{Headers: map[string]string{"X-Tenant": "acme-42"}})
	t.Setenv("AUTHMCP_BAD_TOKEN", "wrong-token-secret-value")
	t.Setenv("AUTHMCP_ANY_TOKEN", "any-token")
	t.Setenv("AUTHMCP_WRONG_TENANT", "other-tenant")
	for _, tc := range []struct {
		name string
		src  ledger.Source
		want mcphost.AuthError
	}{
		{"no token", httpSource(tokenSrv.URL, ledger.Connection{}), mcphost.AuthError{Status: 401,
			Challenge: `Bearer resource_metadata="` + tokenSrv.ResourceMetadataURL + `"`, Detail: "no bearer token"}},
		{"wrong token", httpSource(tokenSrv.URL, ledger.Connection{BearerEnv: "AUTHMCP_BAD_TOKEN"}), mcphost.AuthError{Status: 401,
			Challenge: `Bearer resource_metadata="` + tokenSrv.ResourceMetadataURL + `"`, Detail: "unknown token: invalid token"}},
		{"insufficient scope", httpSource(scopeSrv.URL, ledger.Connection{BearerEnv: "AUTHMCP_ANY_TOKEN"}), mcphost.AuthError{Status: 403,
			Challenge: `Bearer resource_metadata="` + scopeSrv.ResourceMetadataURL + `", scope="mcp:read"`, Detail: "insufficient scope"}},
		{"wrong header", httpSource(headerSrv.URL, ledger.Connection{HeaderEnv: []ledger.HeaderRef{{Name: "X-Tenant", Env: "AUTHMCP_WRONG_TENANT"}}}),
			mcphost.AuthError{Status: 401, Challenge: `Bearer error="invalid_request", error_description="header X-Tenant missing or wrong"`,
				Detail: "missing or wrong header X-Tenant"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, tr, err := readVia(t, tc.src)
			if err == nil {
				t.Fatal("connected without valid credentials")
			}
			var ae *mcphost.AuthError
			if !errors.As(err, &ae) {
				t.Fatalf("connect error %q (%T) holds no *AuthError", err, err)
			}
			if diff := cmp.Diff(tc.want, *ae); diff != "" {
				t.Errorf("AuthError (-want +got):\n%s", diff)
			}
			if got := mcphost.AuthFailure(tr, nil); got == nil || got.Status != tc.want.Status {
				t.Errorf("AuthFailure(tr, nil) = %v, want the recorded HTTP %d", got, tc.want.Status)
			}
			if strings.Contains(err.Error(), "wrong-token-secret-value") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func TestHTTPSourceTLSFailures(t *testing.T) {
	tlsSrv := authmcp.New(t, authmcp.Options{TLS: true})
	mtlsSrv := authmcp.New(t, authmcp.Options{ClientCert: true})
	other := authmcp.New(t, authmcp.Options{TLS: true}) // another CA
	for _, tc := range []struct {
		name string
		src  ledger.Source
		want string
	}{
		{"system roots do not know the test CA", httpSource(tlsSrv.URL, ledger.Connection{}), "certificate signed by unknown authority"},
		{"another CA", httpSource(tlsSrv.URL, ledger.Connection{CAFile: other.CAFile}), "certificate signed by unknown authority"},
		{"mTLS without a client certificate", httpSource(mtlsSrv.URL, ledger.Connection{CAFile: mtlsSrv.CAFile}), "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, tr, err := readVia(t, tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("connect error = %v, want one containing %q", err, tc.want)
			}
			if ae := mcphost.AuthFailure(tr, err); ae != nil {
				t.Errorf("a TLS failure reported as an authentication failure: %v", ae)
			}
		})
	}
}

// The token is read at each connect: a rotated file or variable is used by the next session.
func TestHTTPSourceRereadsSecretsAtEachConnect(t *testing.T) {
	srv := authmcp.New(t, authmcp.Options{Tokens: []string{"rotated-2"}})
	file := writeFile(t, "token", "rotated-1")
	src := httpSource(srv.URL, ledger.Connection{BearerFile: file})
	if _, _, err := readVia(t, src); !isAuthError(err) {
		t.Fatalf("old token: err = %v, want an *AuthError", err)
	}
	if err := os.WriteFile(file, []byte("rotated-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readVia(t, src); err != nil {
		t.Fatalf("rotated token: %v", err)
	}
	t.Setenv("AUTHMCP_ROTATING", "rotated-1")
	src = httpSource(srv.URL, ledger.Connection{BearerEnv: "AUTHMCP_ROTATING"})
	if _, _, err := readVia(t, src); !isAuthError(err) {
		t.Fatalf("old token: err = %v, want an *AuthError", err)
	}
	t.Setenv("AUTHMCP_ROTATING", "rotated-2")
	if _, _, err := readVia(t, src); err != nil {
		t.Fatalf("rotated token: %v", err)
	}
}

func isAuthError(err error) bool {
	var ae *mcphost.AuthError
	return errors.As(err, &ae)
}

// Missing secrets are errors that name where the secret was looked for, before any request.
func TestHTTPSourceMissingSecrets(t *testing.T) {
	dir := t.TempDir()
	empty := writeFile(t, "empty", " \n")
	notPEM := writeFile(t, "ca.pem", "not a certificate")
	t.Setenv("AUTHMCP_EMPTY", "")
	t.Setenv("AUTHMCP_SPACED", "two words")
	for _, tc := range []struct {
		name string
		c    ledger.Connection
		want string
	}{
		{"unset bearer variable", ledger.Connection{BearerEnv: "AUTHMCP_SURELY_UNSET_VAR"},
			`source "authed": bearer token: environment variable AUTHMCP_SURELY_UNSET_VAR is not set`},
		{"empty bearer variable", ledger.Connection{BearerEnv: "AUTHMCP_EMPTY"},
			`source "authed": bearer token: environment variable AUTHMCP_EMPTY is empty`},
		{"token with a blank", ledger.Connection{BearerEnv: "AUTHMCP_SPACED"},
			`source "authed": bearer token: environment variable AUTHMCP_SPACED holds a blank or control character inside the token`},
		{"missing bearer file", ledger.Connection{BearerFile: filepath.Join(dir, "nope")},
			`source "authed": bearer token: open ` + filepath.Join(dir, "nope") + `: no such file or directory`},
		{"empty bearer file", ledger.Connection{BearerFile: empty}, `source "authed": bearer token: file ` + empty + ` is empty`},
		{"unset header variable", ledger.Connection{HeaderEnv: []ledger.HeaderRef{{Name: "X-Key", Env: "AUTHMCP_SURELY_UNSET_VAR"}}},
			`source "authed": header X-Key: environment variable AUTHMCP_SURELY_UNSET_VAR is not set`},
		{"missing CA file", ledger.Connection{CAFile: filepath.Join(dir, "ca.pem")},
			`source "authed": --ca-file: open ` + filepath.Join(dir, "ca.pem") + `: no such file or directory`},
		{"CA file without PEM", ledger.Connection{CAFile: notPEM}, `source "authed": --ca-file ` + notPEM + ` holds no PEM certificate`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mcphost.DefaultTransport(t.Context(), httpSource("http://127.0.0.1:1/mcp", tc.c))
			if err == nil || err.Error() != tc.want {
				t.Fatalf("DefaultTransport error = %v, want %q", err, tc.want)
			}
		})
	}
}

// The challenge and body a server sends are kept bounded and without the credential this
// client sent, even when the server echoes it; a malformed response that quotes it is masked
// too.
func TestAuthErrorNeverCarriesTheToken(t *testing.T) {
	const token = "s3cr3t-token-value"
	echo := func(ctl string) *httptest.Server {
		hts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", error_description="token `+
				strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")+` expired`+ctl+`", realm="https://u:p@example.com/x?api_key=k"`)
			http.Error(w, "you sent "+r.Header.Get("Authorization")+strings.Repeat(" pad", 100), http.StatusUnauthorized)
		}))
		t.Cleanup(hts.Close)
		return hts
	}
	t.Setenv("AUTHMCP_ECHOED", token)

	_, _, err := readVia(t, httpSource(echo("\u202e!").URL, ledger.Connection{BearerEnv: "AUTHMCP_ECHOED"}))
	var ae *mcphost.AuthError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want an *AuthError", err)
	}
	wantChallenge := `Bearer error="invalid_token", error_description="token *** expired !", realm="https://u:***@example.com/x?api_key=***"`
	if ae.Challenge != wantChallenge {
		t.Errorf("Challenge = %q, want %q", ae.Challenge, wantChallenge)
	}
	if !strings.HasPrefix(ae.Detail, "you sent Bearer *** pad") || len(ae.Detail) > 200+len("…") {
		t.Errorf("Detail = %q, want the masked echo bounded to 200 bytes", ae.Detail)
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("error shows the token: %v", err)
	}

	// An escape character makes the header malformed: net/http's error quotes the line.
	_, _, err = readVia(t, httpSource(echo("\x1b[2J").URL, ledger.Connection{BearerEnv: "AUTHMCP_ECHOED"}))
	if err == nil || !strings.Contains(err.Error(), "malformed MIME header") {
		t.Fatalf("err = %v, want net/http's malformed header error", err)
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("error shows the token: %v", err)
	}
}

// A 401 on the standalone SSE stream (after a successful initialize) ends the session with an
// error the go-sdk formats with %v, losing the chain; AuthFailure still finds the
// authentication failure.
func TestAuthFailureOnEventStream(t *testing.T) {
	srv := authmcp.New(t, authmcp.Options{})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP }, nil)
	hts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", error_description="stream refused"`)
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hts.Close)
	tr, err := mcphost.DefaultTransport(t.Context(), httpSource(hts.URL, ledger.Connection{}))
	if err != nil {
		t.Fatal(err)
	}
	// The stream is opened right after initialize: the session fails during Connect or soon
	// after, depending on timing.
	cs, err := connectSource(t, tr)
	if err == nil {
		done := make(chan error, 1)
		go func() { done <- cs.Wait() }()
		select {
		case err = <-done:
		case <-time.After(15 * time.Second):
			t.Fatal("session did not end after its event stream was refused")
		}
	}
	ae := mcphost.AuthFailure(tr, err)
	if ae == nil {
		t.Fatalf("AuthFailure(tr, %v) = nil, want the refused stream's 401", err)
	}
	want := mcphost.AuthError{Status: 401, Challenge: `Bearer error="invalid_token", error_description="stream refused"`, Detail: "no"}
	if diff := cmp.Diff(want, *ae); diff != "" {
		t.Errorf("AuthError (-want +got):\n%s", diff)
	}
}

// fakeOAuth is an OAuth handler that hands out token once Authorize ran, or fails Authorize.
type fakeOAuth struct {
	token      string
	fail       error
	authorized atomic.Int32
	body       atomic.Value // of the 401 Authorize was given
}

func (f *fakeOAuth) TokenSource(context.Context) (oauth2.TokenSource, error) {
	if f.authorized.Load() == 0 {
		return nil, nil
	}
	return oauth2.StaticTokenSource(&oauth2.Token{AccessToken: f.token, TokenType: "Bearer"}), nil
}

func (f *fakeOAuth) Authorize(_ context.Context, _ *http.Request, resp *http.Response) error {
	body, _ := io.ReadAll(resp.Body)
	f.body.Store(string(body))
	resp.Body.Close()
	if f.fail != nil {
		return f.fail
	}
	f.authorized.Add(1)
	return nil
}

// With an OAuth handler, a 401 reaches the go-sdk as a response so that it runs Authorize and
// retries; the failure is still recorded when Authorize fails.
func TestHTTPSourceOAuthHandlerSeesUnauthorized(t *testing.T) {
	srv := authmcp.New(t, authmcp.Options{Tokens: []string{"oauth-issued"}})
	src := httpSource(srv.URL, ledger.Connection{})

	ok := &fakeOAuth{token: "oauth-issued"}
	tr, err := mcphost.HTTPTransportWithOAuth(t.Context(), src, ok)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := connectSource(t, tr)
	if err != nil {
		t.Fatalf("connect with OAuth: %v", err)
	}
	if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: readmeURI}); err != nil {
		t.Fatalf("read with OAuth: %v", err)
	}
	if ok.authorized.Load() != 1 {
		t.Errorf("Authorize ran %d times, want 1", ok.authorized.Load())
	}
	if body, _ := ok.body.Load().(string); body != "no bearer token\n" {
		t.Errorf("Authorize was given the body %q, want the server's whole body", body)
	}
	if ae := mcphost.AuthFailure(tr, nil); ae != nil {
		t.Errorf("AuthFailure after a successful authorization = %v, want nil", ae)
	}

	failing := &fakeOAuth{fail: errors.New("authorization server unreachable")}
	tr, err = mcphost.HTTPTransportWithOAuth(t.Context(), src, failing)
	if err != nil {
		t.Fatal(err)
	}
	_, err = connectSource(t, tr)
	if err == nil || !strings.Contains(err.Error(), "authorization server unreachable") {
		t.Fatalf("connect error = %v, want the Authorize failure", err)
	}
	ae := mcphost.AuthFailure(tr, err)
	if ae == nil || ae.Status != 401 || !strings.Contains(ae.Challenge, srv.ResourceMetadataURL) {
		t.Errorf("AuthFailure = %v, want the recorded 401 with its challenge", ae)
	}
}

// Headers and the bearer token go to the source's origin only, never to another host the
// client is sent to (a redirect here).
func TestHTTPSourceCredentialsStayOnOrigin(t *testing.T) {
	var leaked atomic.Value
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(r.Header.Get("Authorization") + "|" + r.Header.Get("X-Tenant"))
		http.Error(w, "not here", http.StatusNotFound)
	}))
	t.Cleanup(elsewhere.Close)
	redirector := httptest.NewServer(http.RedirectHandler(elsewhere.URL+"/mcp", http.StatusTemporaryRedirect))
	t.Cleanup(redirector.Close)
	t.Setenv("AUTHMCP_ORIGIN_TOKEN", "origin-token")
	t.Setenv("AUTHMCP_ORIGIN_TENANT", "tenant")
	_, _, err := readVia(t, httpSource(redirector.URL+"/mcp", ledger.Connection{BearerEnv: "AUTHMCP_ORIGIN_TOKEN",
		HeaderEnv: []ledger.HeaderRef{{Name: "X-Tenant", Env: "AUTHMCP_ORIGIN_TENANT"}}}))
	if err == nil {
		t.Fatal("connected through a redirect to a server that is not an MCP server")
	}
	if got, _ := leaked.Load().(string); got != "|" {
		t.Errorf("the other origin received credentials %q, want none", got)
	}
}
