package mcphost_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"

	"github.com/mcpsync/mcpsync/internal/harness/oauthas"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// oauthStack starts an authorization server with a confidential client "svc" (secret
// "svc-secret") and a public client "cli", and an MCP server that trusts it.
func oauthStack(t *testing.T, life time.Duration) (*oauthas.AuthServer, *oauthas.ResourceServer) {
	t.Helper()
	as, err := oauthas.StartAuthServer(oauthas.Options{AccessTokenLifetime: life,
		Clients: []oauthas.Client{{ID: "svc", Secret: "svc-secret"}, {ID: "cli"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(as.Close)
	rs := oauthas.StartResourceServer(as, oauthas.ResourceOptions{})
	t.Cleanup(rs.Close)
	return as, rs
}

func oauthSource(url string, o *ledger.OAuthConfig) ledger.Source {
	return ledger.Source{SourceSpec: ledger.SourceSpec{Name: "secured", Transport: ledger.TransportHTTP, URL: url,
		Connection: ledger.Connection{OAuth: o}}}
}

// connectLikeHost connects as the host's session does: on a connect context that ends right
// after the connect (session.go), so that nothing may keep using it.
func connectLikeHost(t *testing.T, src ledger.Source) (*mcp.ClientSession, error) {
	t.Helper()
	tr, err := mcphost.DefaultTransport(context.Background(), src)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "oauth-test", Version: "0"}, nil).
		Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: mcphost.ProtocolVersion})
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func listOnce(t *testing.T, cs *mcp.ClientSession) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cs.ListResources(ctx, nil)
	return err
}

// TestOAuthUnauthenticated: the protected server refuses a source without credentials with an
// *AuthError carrying the 401 and its challenge.
func TestOAuthUnauthenticated(t *testing.T) {
	_, rs := oauthStack(t, time.Hour)
	_, err := connectLikeHost(t, oauthSource(rs.URL, nil))
	ae, ok := errors.AsType[*mcphost.AuthError](err)
	if !ok || ae.Status != http.StatusUnauthorized || !strings.Contains(ae.Challenge, "resource_metadata") {
		t.Fatalf("connect without a token: got %v, want an *AuthError 401 with the resource_metadata challenge", err)
	}
}

// TestOAuthClientCredentials: a client-credentials source discovers the authorization server
// through the protected-resource metadata, gets a token with the secret read from its
// variable, and keeps working after the token expired although the connect context that
// asked for the first token has ended (the token is renewed: extauth alone fails here with
// "context canceled").
func TestOAuthClientCredentials(t *testing.T) {
	// Access tokens live 11 s; the oauth2 package treats a token as expired 10 s early, so
	// the client renews after ~1 s.
	as, rs := oauthStack(t, 11*time.Second)
	t.Setenv("MCPSYNC_TEST_CC_SECRET", "svc-secret")
	src := oauthSource(rs.URL, &ledger.OAuthConfig{Flow: ledger.OAuthClientCredentials, ClientID: "svc", ClientSecretEnv: "MCPSYNC_TEST_CC_SECRET"})
	cs, err := connectLikeHost(t, src)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := listOnce(t, cs); err != nil {
		t.Fatalf("list: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := listOnce(t, cs); err != nil {
		t.Fatalf("list after the token expired: %v", err)
	}
	if n := as.Grants("client_credentials"); n < 2 {
		t.Errorf("client_credentials grants = %d, want at least 2 (a renewal)", n)
	}
	if n := len(rs.Tokens()); n < 2 {
		t.Errorf("distinct tokens accepted = %d, want at least 2", n)
	}
}

// TestOAuthClientCredentialsRefused: a wrong secret is an *AuthError naming the
// authorization server's refusal, without the secret.
func TestOAuthClientCredentialsRefused(t *testing.T) {
	_, rs := oauthStack(t, time.Hour)
	t.Setenv("MCPSYNC_TEST_CC_SECRET", "wrong-secret-value")
	src := oauthSource(rs.URL, &ledger.OAuthConfig{Flow: ledger.OAuthClientCredentials, ClientID: "svc", ClientSecretEnv: "MCPSYNC_TEST_CC_SECRET"})
	_, err := connectLikeHost(t, src)
	ae, ok := errors.AsType[*mcphost.AuthError](err)
	if !ok || ae.Status != http.StatusUnauthorized {
		t.Fatalf("connect with a wrong secret: got %v, want an *AuthError 401", err)
	}
	if !strings.Contains(err.Error(), "invalid_client") || strings.Contains(err.Error(), "wrong-secret-value") {
		t.Errorf("error %q: want the refusal (invalid_client) and no secret", err)
	}
	t.Setenv("MCPSYNC_TEST_CC_SECRET", "")
	if _, err := mcphost.DefaultTransport(context.Background(), src); err == nil || !strings.Contains(err.Error(), "MCPSYNC_TEST_CC_SECRET is empty") {
		t.Errorf("empty secret variable: got %v, want an error naming it", err)
	}
}

// TestOAuthClientCredentialsPrivateKeyJWT: a client-credentials client that authenticates with
// a signed JWT (private_key_jwt) gets a token, renews it with a fresh assertion after expiry,
// and a key the server does not know is an *AuthError (invalid_client).
func TestOAuthClientCredentialsPrivateKeyJWT(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	as, err := oauthas.StartAuthServer(oauthas.Options{AccessTokenLifetime: 11 * time.Second,
		Clients: []oauthas.Client{{ID: "jwt-svc", PublicKey: &key.PublicKey}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(as.Close)
	rs := oauthas.StartResourceServer(as, oauthas.ResourceOptions{})
	t.Cleanup(rs.Close)
	keyFile := func(k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "client-key.pem")
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	src := oauthSource(rs.URL, &ledger.OAuthConfig{Flow: ledger.OAuthClientCredentials, ClientID: "jwt-svc", ClientKeyFile: keyFile(key)})
	cs, err := connectLikeHost(t, src)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := listOnce(t, cs); err != nil {
		t.Fatalf("list after the token expired: %v", err)
	}
	if n := as.Grants("client_credentials"); n < 2 {
		t.Errorf("client_credentials grants = %d, want at least 2 (a renewal)", n)
	}

	src.Connection.OAuth.ClientKeyFile = keyFile(other)
	_, err = connectLikeHost(t, src)
	if ae, ok := errors.AsType[*mcphost.AuthError](err); !ok || ae.Status != http.StatusUnauthorized || !strings.Contains(err.Error(), "invalid_client") {
		t.Fatalf("connect with an unknown key: got %v, want an *AuthError 401 naming invalid_client", err)
	}
}

// login runs mcphost.Login for src and plays the browser: it follows the printed URL with an
// HTTP client (the test authorization server approves at once and redirects to the loopback
// listener).
func login(t *testing.T, src ledger.Source) (*mcphost.LoginResult, error) {
	t.Helper()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "http") {
				resp, err := http.Get(line)
				if err == nil {
					resp.Body.Close()
				}
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return mcphost.Login(ctx, src, mcphost.LoginOptions{Out: pw, Timeout: 20 * time.Second})
}

// TestOAuthAuthorizationCode: `source login` stores the tokens (mode 0600); a worker-side
// connect uses them, refreshes an expired access token and writes it back (still 0600), and
// recovers from an access token the server revoked early by one forced refresh.
func TestOAuthAuthorizationCode(t *testing.T) {
	as, rs := oauthStack(t, 11*time.Second)
	tokenFile := filepath.Join(t.TempDir(), "tokens.json")
	src := oauthSource(rs.URL, &ledger.OAuthConfig{Flow: ledger.OAuthAuthorizationCode, ClientID: "cli", TokenFile: tokenFile})

	res, err := login(t, src)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	if !res.Refresh || res.TokenFile != tokenFile {
		t.Errorf("login result %+v: want a refresh token stored in %s", res, tokenFile)
	}
	first := readTokens(t, tokenFile)
	if as.Grants("authorization_code") != 1 || as.Authorizations() != 1 {
		t.Errorf("authorization_code grants = %d, authorizations = %d; want 1 and 1", as.Grants("authorization_code"), as.Authorizations())
	}

	cs, err := connectLikeHost(t, src)
	if err != nil {
		t.Fatalf("worker connect with the stored tokens: %v", err)
	}
	if err := listOnce(t, cs); err != nil {
		t.Fatalf("list: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := listOnce(t, cs); err != nil {
		t.Fatalf("list after the access token expired: %v", err)
	}
	if as.Grants("refresh_token") < 1 {
		t.Fatalf("refresh_token grants = 0: the expired token was not refreshed")
	}
	second := readTokens(t, tokenFile)
	if second.AccessToken == first.AccessToken || second.RefreshToken == "" {
		t.Fatalf("token file after refresh: access token unchanged or refresh token lost")
	}

	if err := as.RevokeAccess(context.Background(), second.AccessToken); err != nil {
		t.Fatal(err)
	}
	if err := listOnce(t, cs); err != nil {
		t.Fatalf("list after the server revoked the access token: %v", err)
	}
	if third := readTokens(t, tokenFile); third.AccessToken == second.AccessToken {
		t.Errorf("token file still holds the revoked access token")
	}
}

// readTokens reads the token file, which must have mode 0600.
func readTokens(t *testing.T, path string) *mcphost.OAuthTokenFile {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Fatalf("token file mode %04o, want 0600", perm)
	}
	tf, err := mcphost.ReadOAuthTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return tf
}

// TestOAuthTokenFileUnusable: without a usable token the worker never runs a browser flow:
// the connect fails with an *AuthError (the server's 401) whose message says why and to run
// `mcpsync source login NAME`.
func TestOAuthTokenFileUnusable(t *testing.T) {
	as, rs := oauthStack(t, time.Hour)
	dir := t.TempDir()
	write := func(name string, tf *mcphost.OAuthTokenFile, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := mcphost.WriteOAuthTokenFile(p, tf); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := mcphost.OAuthTokenFile{TokenURL: as.URL + "/token", ClientID: "cli"}
	expired := base
	expired.Token = oauth2.Token{AccessToken: "stale-access", TokenType: "Bearer", Expiry: time.Now().Add(-time.Minute)}
	badRefresh := expired
	badRefresh.RefreshToken = "not-a-refresh-token"
	valid := base
	valid.Token = oauth2.Token{AccessToken: "forged-access-token", TokenType: "Bearer", Expiry: time.Now().Add(time.Hour)}
	for _, tc := range []struct {
		name, path, reason string
	}{
		{"no file", filepath.Join(dir, "missing.json"), "there is no token file"},
		{"expired without refresh token", write("expired.json", &expired, 0o600), "expired and there is no refresh token"},
		{"refresh refused", write("refused.json", &badRefresh, 0o600), "refused the refresh token"},
		{"readable by others", write("open.json", &valid, 0o644), "must be 0600"},
		{"token refused by the server", write("forged.json", &valid, 0o600), "the server refused the stored token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := oauthSource(rs.URL, &ledger.OAuthConfig{Flow: ledger.OAuthAuthorizationCode, ClientID: "cli", TokenFile: tc.path})
			_, err := connectLikeHost(t, src)
			ae, ok := errors.AsType[*mcphost.AuthError](err)
			if !ok || ae.Status != http.StatusUnauthorized {
				t.Fatalf("got %v, want an *AuthError 401", err)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.reason) || !strings.Contains(msg, "mcpsync source login secured") {
				t.Errorf("error %q: want %q and the login hint", msg, tc.reason)
			}
			if strings.Contains(err.Error(), "forged-access-token") || strings.Contains(err.Error(), "not-a-refresh-token") {
				t.Errorf("error %q shows a token", err)
			}
		})
	}
	if n := as.Authorizations(); n != 0 {
		t.Errorf("authorization requests = %d: the worker must never start the browser flow", n)
	}
}
