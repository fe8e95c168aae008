package mcphost

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/auth/extauth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// oauthTimeout bounds every request to an OAuth authorization server (metadata, token,
// registration): token renewal runs on a context that outlives the request that started it,
// so the client's own timeout is what ends a hung authorization server.
const oauthTimeout = 30 * time.Second

// oauthHandler returns the OAuth handler of a source configured with OAuth, nil otherwise
// (issue 14 item 1). client is the source's HTTP client (its TLS settings reach the
// authorization server too; its headers do not, see authTransport).
//
//   - client credentials: the go-sdk's extauth handler (protected-resource and authorization
//     server metadata discovery, token endpoint auth method from the metadata) with the
//     client secret read now from its variable or file; its tokens are renewed on expiry on a
//     context that does not end with the request that first asked for one (ccHandler).
//   - authorization code: the tokens `mcpsync source login` stored in the source's token file,
//     refreshed on expiry and written back (tokenFileHandler). The worker never runs the
//     browser flow: without a usable token the server's 401 becomes an *AuthError that tells
//     the operator to run `mcpsync source login NAME`.
func oauthHandler(_ context.Context, src ledger.Source, client *http.Client) (auth.OAuthHandler, error) {
	o := src.Connection.OAuth
	if o == nil {
		return nil, nil
	}
	oc := oauthClient(client)
	switch o.Flow {
	case ledger.OAuthClientCredentials:
		if o.ClientKeyFile != "" {
			key, err := readClientKey(o.ClientKeyFile)
			if err != nil {
				return nil, fmt.Errorf("source %q: %w", src.Name, err)
			}
			return &jwtCCHandler{source: src.Name, clientID: o.ClientID, key: key, scopes: o.Scopes, client: oc}, nil
		}
		secret, err := OAuthClientSecret(o)
		if err != nil {
			return nil, fmt.Errorf("source %q: %w", src.Name, err)
		}
		if secret == "" {
			return nil, fmt.Errorf("source %q: OAuth client credentials need a client secret (--oauth-client-secret-env or --oauth-client-secret-file) or a key (--oauth-client-key-file)", src.Name)
		}
		inner, err := extauth.NewClientCredentialsHandler(&extauth.ClientCredentialsHandlerConfig{
			Credentials: &oauthex.ClientCredentials{ClientID: o.ClientID, ClientSecretAuth: &oauthex.ClientSecretAuth{ClientSecret: secret}},
			HTTPClient:  oc,
		})
		if err != nil {
			return nil, fmt.Errorf("source %q: OAuth client credentials: %w", src.Name, err)
		}
		return &ccHandler{source: src.Name, inner: inner, scopes: o.Scopes, secret: secret}, nil
	case ledger.OAuthAuthorizationCode:
		secret, err := OAuthClientSecret(o)
		if err != nil {
			return nil, fmt.Errorf("source %q: %w", src.Name, err)
		}
		return newTokenFileHandler(src.Name, o.TokenFile, oc, secret), nil
	default:
		return nil, fmt.Errorf("source %q: unknown OAuth flow %q", src.Name, o.Flow)
	}
}

// oauthClient is the HTTP client of OAuth requests: the source's client (TLS settings) with a
// timeout, or a default client with one.
func oauthClient(client *http.Client) *http.Client {
	if client == nil {
		return &http.Client{Timeout: oauthTimeout}
	}
	c := *client
	if c.Timeout == 0 {
		c.Timeout = oauthTimeout
	}
	return &c
}

// OAuthClientSecret reads the client secret o refers to (its environment variable or file),
// "" when it names none. Errors name the variable or the path, never the value.
func OAuthClientSecret(o *ledger.OAuthConfig) (string, error) {
	switch {
	case o.ClientSecretEnv != "":
		v, ok := os.LookupEnv(o.ClientSecretEnv)
		if !ok {
			return "", fmt.Errorf("OAuth client secret: environment variable %s is not set on this host", o.ClientSecretEnv)
		}
		if v = strings.TrimSpace(v); v == "" {
			return "", fmt.Errorf("OAuth client secret: environment variable %s is empty", o.ClientSecretEnv)
		}
		return v, nil
	case o.ClientSecretFile != "":
		v, err := readSecretFile(o.ClientSecretFile)
		if err != nil {
			return "", fmt.Errorf("OAuth client secret: %w", err)
		}
		if v = strings.TrimSpace(v); v == "" {
			return "", fmt.Errorf("OAuth client secret: file %s is empty", o.ClientSecretFile)
		}
		return v, nil
	}
	return "", nil
}

// ccHandler is the go-sdk's client-credentials handler made safe for a long-lived session:
//   - extauth.ClientCredentialsHandler builds its token source on the context of the request
//     that got the first 401 (clientcredentials.Config.TokenSource keeps that context for
//     every renewal), so once that request — typically the connect — is over, renewal fails
//     with "context canceled". Authorize gets a context without cancellation instead
//     (context.WithoutCancel keeps its values); oauthTimeout bounds each request.
//   - extauth writes its token source in Authorize and reads it in TokenSource without a lock;
//     mu serializes them.
//   - extauth requests the scopes of the challenge or the resource metadata; configured scopes
//     are put first as the challenge's scope, which extauth then uses.
//
// A failure to obtain a token is an *AuthError (the server's 401/403) naming why.
type ccHandler struct {
	source string
	inner  *extauth.ClientCredentialsHandler
	scopes []string
	secret string // masked if a server echoes it

	mu sync.Mutex
}

// TokenSource implements auth.OAuthHandler.
func (h *ccHandler) TokenSource(ctx context.Context) (oauth2.TokenSource, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inner.TokenSource(ctx)
}

// Authorize implements auth.OAuthHandler: discovery and a client-credentials token request.
func (h *ccHandler) Authorize(ctx context.Context, req *http.Request, resp *http.Response) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	ae := authErrorOf(req, resp, h.secret)
	if resp.StatusCode == http.StatusForbidden && challengeError(resp) != "insufficient_scope" {
		resp.Body.Close()
		return fmt.Errorf("source %q: the server refuses this client: %w", h.source, ae)
	}
	if len(h.scopes) > 0 {
		resp.Header = resp.Header.Clone()
		resp.Header["Www-Authenticate"] = append([]string{fmt.Sprintf("Bearer scope=%q", strings.Join(h.scopes, " "))}, resp.Header.Values("WWW-Authenticate")...)
	}
	if err := h.inner.Authorize(context.WithoutCancel(ctx), req, resp); err != nil {
		return fmt.Errorf("source %q: OAuth client credentials: %s: %w", h.source, serverText(err.Error(), []string{h.secret}, maxChallengeBytes), ae)
	}
	return nil
}

// authErrorOf is the *AuthError of a 401/403 the OAuth handler is asked about (its
// challenge; the body was read by the transport already); the bearer token the request
// carried and the extra secrets are masked wherever the server echoed them.
func authErrorOf(req *http.Request, resp *http.Response, secrets ...string) *AuthError {
	if a := req.Header.Get("Authorization"); a != "" {
		secrets = append(secrets, a, strings.TrimSpace(strings.TrimPrefix(a, "Bearer ")))
	}
	return &AuthError{Status: resp.StatusCode,
		Challenge: serverText(strings.Join(resp.Header.Values("WWW-Authenticate"), ", "), secrets, maxChallengeBytes)}
}

// challengeError is the error parameter of the response's Bearer challenge ("" if none).
func challengeError(resp *http.Response) string {
	cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return ""
	}
	for _, c := range cs {
		if c.Scheme == "bearer" && c.Params["error"] != "" {
			return c.Params["error"]
		}
	}
	return ""
}

// challengeScope is the scope parameter of the response's Bearer challenge ("" if none).
func challengeScope(resp *http.Response) string {
	cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return ""
	}
	for _, c := range cs {
		if c.Scheme == "bearer" && c.Params["scope"] != "" {
			return c.Params["scope"]
		}
	}
	return ""
}

// OAuthTokenFile is the content of a source's OAuth token file (Connection.OAuth.TokenFile,
// mode 0600): the oauth2.Token fields (access_token, token_type, refresh_token, expiry) and
// what refreshing it needs — the token endpoint, the client ID, how the client authenticates
// there, and the client secret only when the authorization server issued it by dynamic
// registration (a configured secret stays in its variable or file).
type OAuthTokenFile struct {
	oauth2.Token
	TokenURL     string   `json:"token_url"`
	ClientID     string   `json:"client_id"`
	ClientSecret string   `json:"client_secret,omitempty"`
	AuthStyle    int      `json:"auth_style,omitempty"`
	Scopes       []string `json:"scopes,omitempty"`
	Issuer       string   `json:"issuer,omitempty"`
}

// ReadOAuthTokenFile reads the token file at path. A file that others than its owner may read
// or write (mode not 0600 or stricter), a malformed file or one without an access token is an
// error naming the path, never a value.
func ReadOAuthTokenFile(path string) (*OAuthTokenFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("OAuth token file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("OAuth token file %s has mode %04o: it must be 0600 (chmod 600 %s)", path, perm, path)
	}
	raw, err := readSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("OAuth token file: %w", err)
	}
	var tf OAuthTokenFile
	if err := json.Unmarshal([]byte(raw), &tf); err != nil {
		return nil, fmt.Errorf("OAuth token file %s is not a token file (%v)", path, redactJSONError(err))
	}
	if tf.AccessToken == "" && tf.RefreshToken == "" {
		return nil, fmt.Errorf("OAuth token file %s holds no token", path)
	}
	if tf.TokenURL == "" || tf.ClientID == "" {
		return nil, fmt.Errorf("OAuth token file %s lacks its token endpoint or client ID", path)
	}
	return &tf, nil
}

// redactJSONError keeps a JSON error's kind without any of the file's content.
func redactJSONError(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("JSON syntax error at byte %d", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %s has the wrong type", te.Field)
	}
	return "malformed JSON"
}

// WriteOAuthTokenFile writes tf to path atomically with mode 0600: a temporary file in the
// same directory, synced, then renamed over path, so that a reader sees the old or the new
// tokens, never a part.
func WriteOAuthTokenFile(path string, tf *OAuthTokenFile) error {
	data, err := json.MarshalIndent(tf, "", "  ")
	if err != nil {
		return fmt.Errorf("OAuth token file: %w", err)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("OAuth token file: %w", err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("OAuth token file %s: %w", path, err)
	}
	if err := f.Chmod(0o600); err != nil {
		return fail(err)
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("OAuth token file %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("OAuth token file %s: %w", path, err)
	}
	return nil
}

// fileTokenSource is an oauth2.TokenSource over a token file: it returns the stored access
// token while it is valid, refreshes it with the refresh token when it expires (on a context
// of its own: it outlives any request) and writes the refreshed tokens back
// (WriteOAuthTokenFile). When the authorization server refuses the refresh (an OAuth error
// response), it returns no token and no error, with the reason kept: the request then goes
// without credentials, the server answers 401, and the handler's Authorize reports it.
type fileTokenSource struct {
	path   string
	client *http.Client
	secret string // configured client secret ("" for a public client or a registered one)

	mu       sync.Mutex
	tf       *OAuthTokenFile
	unusable string // why there is no usable token ("" while there is one)
	unsaved  bool   // the last refresh is not on disk yet
}

func (s *fileTokenSource) config() *oauth2.Config {
	secret := s.tf.ClientSecret
	if s.secret != "" {
		secret = s.secret
	}
	return &oauth2.Config{ClientID: s.tf.ClientID, ClientSecret: secret, Scopes: s.tf.Scopes,
		Endpoint: oauth2.Endpoint{TokenURL: s.tf.TokenURL, AuthStyle: oauth2.AuthStyle(s.tf.AuthStyle)}}
}

// Token implements oauth2.TokenSource.
func (s *fileTokenSource) Token() (*oauth2.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tf == nil || s.unusable != "" {
		return nil, nil
	}
	if s.tf.Token.Valid() {
		s.saveIfDirty()
		return &s.tf.Token, nil
	}
	if s.tf.RefreshToken == "" {
		s.unusable = "the access token expired and there is no refresh token"
		return nil, nil
	}
	return s.refresh()
}

// refresh exchanges the refresh token; the caller holds mu.
func (s *fileTokenSource) refresh() (*oauth2.Token, error) {
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, s.client)
	tok, err := s.config().TokenSource(ctx, &oauth2.Token{RefreshToken: s.tf.RefreshToken}).Token()
	if err != nil {
		if re, ok := errors.AsType[*oauth2.RetrieveError](err); ok {
			code := re.ErrorCode
			if code == "" && re.Response != nil {
				code = fmt.Sprintf("HTTP %d", re.Response.StatusCode)
			}
			s.unusable = "the authorization server refused the refresh token (" + serverText(code, []string{s.tf.RefreshToken, s.secret}, 100) + ")"
			return nil, nil
		}
		return nil, fmt.Errorf("OAuth token refresh: %w", redact.Err(err))
	}
	next := *s.tf
	next.Token = *tok
	if next.RefreshToken == "" {
		next.RefreshToken = s.tf.RefreshToken
	}
	next.ExpiresIn = 0
	s.tf = &next
	s.unsaved = true
	s.saveIfDirty()
	return &s.tf.Token, nil
}

// saveIfDirty writes a refreshed token back; a failure is retried at the next Token call (the
// token in memory is still good). The caller holds mu.
func (s *fileTokenSource) saveIfDirty() {
	if s.unsaved && WriteOAuthTokenFile(s.path, s.tf) == nil {
		s.unsaved = false
	}
}

// tokenFileHandler is the worker's OAuth handler of an authorization-code source: the tokens
// of its token file (fileTokenSource), no browser flow. On a 401 it reloads the file (a
// `source login` since the connect), then tries one refresh of the token the server refused;
// failing that, and on a 403 insufficient_scope, it returns an *AuthError that says to run
// `mcpsync source login NAME`.
type tokenFileHandler struct {
	source string
	ts     *fileTokenSource
	forced string // the access token a refresh was forced for (at most once per token)
	why    string // why that forced refresh gave no token
}

func newTokenFileHandler(source, path string, client *http.Client, secret string) *tokenFileHandler {
	ts := &fileTokenSource{path: path, client: client, secret: secret}
	ts.load()
	return &tokenFileHandler{source: source, ts: ts}
}

// load (re)reads the token file; the caller holds mu or owns s.
func (s *fileTokenSource) load() {
	tf, err := ReadOAuthTokenFile(s.path)
	if err != nil {
		s.tf, s.unusable = nil, err.Error()
		if errors.Is(err, os.ErrNotExist) {
			s.unusable = "there is no token file " + s.path
		}
		return
	}
	s.tf, s.unusable, s.unsaved = tf, "", false
}

// TokenSource implements auth.OAuthHandler.
func (h *tokenFileHandler) TokenSource(context.Context) (oauth2.TokenSource, error) {
	return h.ts, nil
}

// Authorize implements auth.OAuthHandler.
func (h *tokenFileHandler) Authorize(_ context.Context, req *http.Request, resp *http.Response) error {
	defer resp.Body.Close()
	s := h.ts
	ae := authErrorOf(req, resp, s.secret)
	sent := strings.TrimSpace(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "))
	fail := func(reason string) error {
		return fmt.Errorf("source %q: %s; run `mcpsync source login %s`: %w", h.source, reason, h.source, ae)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if resp.StatusCode == http.StatusForbidden {
		if challengeError(resp) == "insufficient_scope" {
			return fail(fmt.Sprintf("the server needs the scope %q, which the stored token lacks", challengeScope(resp)))
		}
		return fail("the server refuses this token")
	}
	if s.unusable == "" && s.tf != nil && s.tf.AccessToken != sent && s.tf.Token.Valid() {
		return nil // refreshed since this request was sent: retry with the new token
	}
	if !s.unsaved {
		s.load() // a `source login` since the connect wrote new tokens
		if s.tf != nil && s.tf.AccessToken != sent && s.tf.Token.Valid() {
			return nil
		}
	}
	if s.tf != nil && s.tf.RefreshToken != "" && h.forced != s.tf.AccessToken {
		h.forced, h.why = s.tf.AccessToken, "" // at most one forced refresh per access token
		tok, err := s.refresh()
		if err != nil {
			return err // the authorization server is unreachable: not an authentication failure
		}
		if tok != nil {
			return nil
		}
		h.why = s.unusable
	}
	reason := s.unusable
	switch {
	case reason != "":
	case s.tf != nil && h.forced == s.tf.AccessToken && h.why != "":
		reason = h.why
	case !s.tf.Token.Valid() && s.tf.RefreshToken == "":
		reason = "the stored access token expired and there is no refresh token"
	default:
		reason = "the server refused the stored token"
	}
	return fail(reason)
}

// LoginOptions configure Login.
type LoginOptions struct {
	// Out receives the authorization URL to open and progress lines.
	Out io.Writer
	// Timeout bounds the wait for the browser's redirect (default 5 minutes).
	Timeout time.Duration
	// ClientName is the client name sent in dynamic client registration (default "mcpsync").
	ClientName string
}

// LoginResult describes the tokens Login stored.
type LoginResult struct {
	TokenFile  string
	Expiry     time.Time // zero: the server gave no expiry
	Refresh    bool      // a refresh token was issued
	Scopes     []string
	ServerName string
}

// ErrNoAuthorization is returned by Login when the server answered without asking for
// authorization: there is nothing to store.
var ErrNoAuthorization = errors.New("the server did not ask for authorization: no token to store")

// Login runs the OAuth authorization-code flow with PKCE for src (issue 14 item 1, `mcpsync
// source login`) through the go-sdk's auth.AuthorizationCodeHandler — protected-resource and
// authorization-server metadata discovery, the resource parameter, the scopes of the
// challenge or the metadata (or the configured ones), step-up on insufficient_scope — with a
// client ID metadata document, the pre-registered client or dynamic registration, in that
// order, as configured. The redirect goes to a loopback listener on 127.0.0.1 with a free
// port; the URL to open is printed on opts.Out. The tokens are written to the source's token
// file (mode 0600) as soon as the code is exchanged, then the session is proven: connect,
// ping, and list resources when the server has them. A server that never asks for
// authorization gives ErrNoAuthorization.
func Login(ctx context.Context, src ledger.Source, opts LoginOptions) (*LoginResult, error) {
	o := src.Connection.OAuth
	if src.Transport != ledger.TransportHTTP || o == nil || o.Flow != ledger.OAuthAuthorizationCode {
		return nil, fmt.Errorf("source %q does not use OAuth authorization code", src.Name)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.ClientName == "" {
		opts.ClientName = "mcpsync"
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	secret, err := OAuthClientSecret(o)
	if err != nil {
		return nil, err
	}
	client, err := httpClient(ctx, src)
	if err != nil {
		return nil, err
	}
	oc := oauthClient(client)

	cb, err := newLoopbackCallback()
	if err != nil {
		return nil, err
	}
	defer cb.close()

	var (
		mu     sync.Mutex
		stored *OAuthTokenFile
		fts    *fileTokenSource
	)
	cfg := &auth.AuthorizationCodeHandlerConfig{
		RedirectURL: cb.url,
		AuthorizationCodeFetcher: func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			fmt.Fprintf(opts.Out, "Open this URL in a browser to authorize source %s (waiting %s):\n%s\n", src.Name, opts.Timeout, args.URL)
			return cb.wait(ctx, opts.Timeout)
		},
		RequestRefreshToken: true,
		Client:              oc,
		NewTokenSource: func(_ context.Context, c *oauth2.Config, tok *oauth2.Token) (oauth2.TokenSource, error) {
			tf := &OAuthTokenFile{Token: *tok, TokenURL: c.Endpoint.TokenURL, ClientID: c.ClientID,
				AuthStyle: int(c.Endpoint.AuthStyle), Scopes: c.Scopes}
			tf.ExpiresIn = 0
			if c.ClientSecret != "" && c.ClientSecret != secret {
				tf.ClientSecret = c.ClientSecret // issued by dynamic registration: kept only here
			}
			if err := WriteOAuthTokenFile(o.TokenFile, tf); err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			stored = tf
			fts = &fileTokenSource{path: o.TokenFile, client: oc, secret: secret, tf: tf}
			return fts, nil
		},
	}
	if o.ClientMetadataURL != "" {
		cfg.ClientIDMetadataDocumentConfig = &auth.ClientIDMetadataDocumentConfig{URL: o.ClientMetadataURL}
	}
	if o.ClientID != "" {
		pre := &oauthex.ClientCredentials{ClientID: o.ClientID}
		if secret != "" {
			pre.ClientSecretAuth = &oauthex.ClientSecretAuth{ClientSecret: secret}
		}
		cfg.PreregisteredClient = pre
	} else {
		cfg.DynamicClientRegistrationConfig = &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
			RedirectURIs: []string{cb.url}, ClientName: opts.ClientName,
			GrantTypes: []string{"authorization_code", "refresh_token"}, ResponseTypes: []string{"code"},
		}}
	}
	if len(o.Scopes) > 0 {
		scopes := o.Scopes
		cfg.ScopeFilter = func([]string) []string { return scopes }
	}
	handler, err := auth.NewAuthorizationCodeHandler(cfg)
	if err != nil {
		return nil, fmt.Errorf("source %q: OAuth: %w", src.Name, err)
	}

	tr := newHTTPSourceTransport(src, client, handler)
	mc := mcp.NewClient(&mcp.Implementation{Name: "mcpsync", Version: "0.1.0"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := mc.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		return nil, loginErr(src.Name, stored != nil, err)
	}
	defer cs.Close()
	if err := cs.Ping(ctx, nil); err != nil {
		return nil, loginErr(src.Name, stored != nil, err)
	}
	if caps := cs.InitializeResult().Capabilities; caps != nil && caps.Resources != nil {
		if _, err := cs.ListResources(ctx, nil); err != nil {
			return nil, loginErr(src.Name, stored != nil, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if stored == nil {
		return nil, ErrNoAuthorization
	}
	res := &LoginResult{TokenFile: o.TokenFile, Expiry: fts.tf.Expiry, Refresh: fts.tf.RefreshToken != "",
		Scopes: fts.tf.Scopes, ServerName: cs.InitializeResult().ServerInfo.Name}
	if s, ok := fts.tf.Extra("scope").(string); ok && s != "" {
		res.Scopes = strings.Fields(s)
	}
	return res, nil
}

// loginErr describes a failed login; stored says whether tokens were written before.
func loginErr(name string, stored bool, err error) error {
	if stored {
		return fmt.Errorf("source %q: tokens were stored, but the server then refused the session: %w", name, redact.Err(err))
	}
	return fmt.Errorf("source %q: login failed: %w", name, redact.Err(err))
}

// loopbackCallback is the redirect target of Login: an HTTP server on 127.0.0.1 with a free
// port that takes the authorization response (code, state, iss, or error) at /callback.
type loopbackCallback struct {
	url     string
	srv     *http.Server
	results chan callbackResult
}

type callbackResult struct {
	res *auth.AuthorizationResult
	err error
}

func newLoopbackCallback() (*loopbackCallback, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("login: loopback redirect listener: %w", err)
	}
	cb := &loopbackCallback{url: "http://" + ln.Addr().String() + "/callback", results: make(chan callbackResult, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("/callback", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var cr callbackResult
		if e := q.Get("error"); e != "" {
			msg := e
			if d := q.Get("error_description"); d != "" {
				msg += ": " + d
			}
			cr.err = fmt.Errorf("the authorization server refused: %s", serverText(msg, nil, maxChallengeBytes))
			http.Error(w, "mcpsync: authorization refused; see the terminal.", http.StatusOK)
		} else if q.Get("code") == "" {
			http.Error(w, "mcpsync: no authorization code in this request", http.StatusBadRequest)
			return
		} else {
			cr.res = &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "mcpsync: authorization received; you may close this window.\n")
		}
		select {
		case cb.results <- cr:
		default: // a result is already waiting
		}
	})
	cb.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go cb.srv.Serve(ln)
	return cb, nil
}

// wait returns the next authorization response, or an error after timeout.
func (cb *loopbackCallback) wait(ctx context.Context, timeout time.Duration) (*auth.AuthorizationResult, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-cb.results:
		return r.res, r.err
	case <-t.C:
		return nil, fmt.Errorf("no authorization response within %s (the browser was not redirected to %s)", timeout, cb.url)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (cb *loopbackCallback) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	cb.srv.Shutdown(ctx)
}

// jwtCCHandler is the client-credentials handler of a client that authenticates to the token
// endpoint with a signed JWT (private_key_jwt, RFC 7523 section 2.2, the ext-auth SEP-1046
// variant), which the go-sdk's extauth lacks: the same discovery (the go-sdk's oauthex and
// auth metadata functions, in the order the MCP authorization spec gives), then a
// client_credentials request whose client_assertion is signed anew for each token with the
// key read at connect (ES256 for a P-256 key, RS256 for an RSA key). Tokens are renewed on
// expiry on a context of their own.
type jwtCCHandler struct {
	source   string
	clientID string
	key      crypto.Signer
	scopes   []string
	client   *http.Client

	mu sync.Mutex
	ts oauth2.TokenSource
}

// TokenSource implements auth.OAuthHandler.
func (h *jwtCCHandler) TokenSource(context.Context) (oauth2.TokenSource, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ts, nil
}

// Authorize implements auth.OAuthHandler.
func (h *jwtCCHandler) Authorize(ctx context.Context, req *http.Request, resp *http.Response) error {
	defer resp.Body.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	ae := authErrorOf(req, resp)
	if resp.StatusCode == http.StatusForbidden && challengeError(resp) != "insufficient_scope" {
		return fmt.Errorf("source %q: the server refuses this client: %w", h.source, ae)
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("source %q: OAuth client credentials: %s: %w", h.source, serverText(fmt.Sprintf(format, args...), nil, maxChallengeBytes), ae)
	}
	ctx = context.WithoutCancel(ctx)
	prm := discoverResource(ctx, resp, req.URL.String(), h.client)
	if prm == nil {
		return fail("the protected-resource metadata names no authorization server")
	}
	asm, err := auth.GetAuthServerMetadata(ctx, prm.AuthorizationServers[0], h.client)
	if err != nil {
		return fail("authorization server metadata: %v", err)
	}
	if asm == nil {
		asm = &oauthex.AuthServerMeta{Issuer: prm.AuthorizationServers[0], TokenEndpoint: strings.TrimSuffix(prm.AuthorizationServers[0], "/") + "/token"}
	}
	scopes := h.scopes
	if len(scopes) == 0 {
		if s := challengeScope(resp); s != "" {
			scopes = strings.Fields(s)
		} else {
			scopes = prm.ScopesSupported
		}
	}
	src := &assertionSource{h: h, tokenURL: asm.TokenEndpoint, audience: asm.Issuer, scopes: scopes}
	ts := oauth2.ReuseTokenSource(nil, src)
	if _, err := ts.Token(); err != nil {
		return fail("token request: %v", err)
	}
	h.ts = ts
	return nil
}

// assertionSource gets a token with a fresh client assertion each time.
type assertionSource struct {
	h                  *jwtCCHandler
	tokenURL, audience string
	scopes             []string
}

// Token implements oauth2.TokenSource.
func (s *assertionSource) Token() (*oauth2.Token, error) {
	assertion, err := signAssertion(s.h.key, s.h.clientID, s.audience)
	if err != nil {
		return nil, err
	}
	cfg := &clientcredentials.Config{ClientID: s.h.clientID, TokenURL: s.tokenURL, Scopes: s.scopes,
		AuthStyle: oauth2.AuthStyleInParams, EndpointParams: url.Values{
			"client_assertion_type": {"urn:ietf:params:oauth:client-assertion-type:jwt-bearer"},
			"client_assertion":      {assertion},
		}}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), oauth2.HTTPClient, s.h.client), oauthTimeout)
	defer cancel()
	return cfg.Token(ctx)
}

// discoverResource finds the protected-resource metadata of the MCP endpoint mcpURL: the
// challenge's resource_metadata, then the path-based and the root well-known URLs (RFC 9728,
// MCP 2025-11-25), else the 2025-03-26 fallback (the server's origin is the authorization
// server). nil if metadata was found but names no authorization server.
func discoverResource(ctx context.Context, resp *http.Response, mcpURL string, client *http.Client) *oauthex.ProtectedResourceMetadata {
	type cand struct{ meta, resource string }
	var cands []cand
	if cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate")); err == nil {
		for _, c := range cs {
			if u := c.Params["resource_metadata"]; u != "" {
				cands = append(cands, cand{u, mcpURL})
				break
			}
		}
	}
	u, err := url.Parse(mcpURL)
	if err == nil {
		m := *u
		m.RawQuery, m.Fragment = "", ""
		m.Path = "/.well-known/oauth-protected-resource/" + strings.TrimLeft(u.Path, "/")
		cands = append(cands, cand{m.String(), mcpURL})
		m.Path = "/.well-known/oauth-protected-resource"
		root := *u
		root.Path, root.RawQuery, root.Fragment = "", "", ""
		cands = append(cands, cand{m.String(), root.String()})
	}
	for _, c := range cands {
		prm, err := oauthex.GetProtectedResourceMetadata(ctx, c.meta, c.resource, client)
		if err != nil || prm == nil {
			continue
		}
		if len(prm.AuthorizationServers) == 0 {
			return nil
		}
		return prm
	}
	if u == nil {
		return nil
	}
	root := *u
	root.Path, root.RawQuery, root.Fragment = "", "", ""
	return &oauthex.ProtectedResourceMetadata{Resource: mcpURL, AuthorizationServers: []string{root.String()}}
}

// readClientKey reads the PEM private key of private_key_jwt (PKCS #8, SEC 1 EC or PKCS #1
// RSA); errors name the path, never the content.
func readClientKey(path string) (crypto.Signer, error) {
	raw, err := readSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("OAuth client key: %w", err)
	}
	block, _ := pem.Decode([]byte(raw))
	if block == nil {
		return nil, fmt.Errorf("OAuth client key file %s holds no PEM block", path)
	}
	var key any
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("OAuth client key file %s: not a private key (%s)", path, block.Type)
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("OAuth client key file %s: only P-256 EC keys (ES256) are supported", path)
		}
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("OAuth client key file %s: an EC P-256 or RSA key is needed", path)
}

// signAssertion signs a client assertion JWT (RFC 7523): iss and sub the client ID, aud the
// authorization server's issuer, valid for a minute, with a random jti.
func signAssertion(key crypto.Signer, clientID, audience string) (string, error) {
	alg := "RS256"
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		alg = "ES256"
	}
	now := time.Now()
	header, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT"})
	claims, _ := json.Marshal(map[string]any{"iss": clientID, "sub": clientID, "aud": audience,
		"iat": now.Unix(), "exp": now.Add(time.Minute).Unix(), "jti": rand.Text()})
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signing))
	var sig []byte
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, digest[:])
		if err != nil {
			return "", fmt.Errorf("client assertion: %w", err)
		}
		sig = make([]byte, 64)
		r.FillBytes(sig[:32])
		s.FillBytes(sig[32:])
	default:
		var err error
		if sig, err = key.Sign(rand.Reader, digest[:], crypto.SHA256); err != nil {
			return "", fmt.Errorf("client assertion: %w", err)
		}
	}
	return signing + "." + enc.EncodeToString(sig), nil
}
