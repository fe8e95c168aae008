// Package oauthas is an in-process OAuth 2.1 authorization server and an MCP resource server
// protected by it, for tests of authenticated HTTP sources (issue 14 item 1). The
// authorization server is github.com/go-oauth2/oauth2/v4 (client credentials, authorization
// code with PKCE S256 required, refresh tokens, configurable lifetimes, in-memory stores); this
// package adds RFC 8414 metadata, an authorization endpoint that approves at once (no login
// page: a test follows the redirect with an HTTP client) and private_key_jwt client
// authentication (RFC 7523), which the library lacks. The resource server is a
// go-sdk MCP server behind the go-sdk's auth.RequireBearerToken middleware, serving RFC 9728
// protected-resource metadata. Both listen on 127.0.0.1 on free ports; Close stops them.
package oauthas

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"

	oauth2 "github.com/go-oauth2/oauth2/v4"
	oerrors "github.com/go-oauth2/oauth2/v4/errors"
	"github.com/go-oauth2/oauth2/v4/manage"
	"github.com/go-oauth2/oauth2/v4/models"
	"github.com/go-oauth2/oauth2/v4/server"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// Client is a pre-registered OAuth client. A public client (no secret, no key) may use only
// the authorization code flow; its redirect URIs must be loopback (http://127.0.0.1 or
// localhost, any port, RFC 8252). A client with a PublicKey (ECDSA P-256 or RSA) authenticates
// with a signed JWT (private_key_jwt, RFC 7523) and nothing else.
type Client struct {
	ID        string
	Secret    string
	PublicKey crypto.PublicKey
}

// Options configure an authorization server.
type Options struct {
	// Clients are the registered clients.
	Clients []Client
	// AccessTokenLifetime of every issued access token (default one hour).
	AccessTokenLifetime time.Duration
	// Scopes are the scopes_supported of the metadata (optional).
	Scopes []string
}

// AuthServer is a running authorization server.
type AuthServer struct {
	// URL is its issuer (http://127.0.0.1:PORT).
	URL     string
	srv     *httptest.Server
	manager *manage.Manager

	keys map[string]crypto.PublicKey // of the private_key_jwt clients

	mu     sync.Mutex
	grants map[string]int // token requests answered with a token, by grant type
	auths  int            // authorization requests approved
}

// StartAuthServer starts an authorization server.
func StartAuthServer(opts Options) (*AuthServer, error) {
	life := opts.AccessTokenLifetime
	if life <= 0 {
		life = time.Hour
	}
	m := manage.NewDefaultManager()
	m.SetAuthorizeCodeTokenCfg(&manage.Config{AccessTokenExp: life, RefreshTokenExp: 24 * time.Hour, IsGenerateRefresh: true})
	m.SetClientTokenCfg(&manage.Config{AccessTokenExp: life})
	m.SetRefreshTokenCfg(&manage.RefreshingConfig{AccessTokenExp: life, RefreshTokenExp: 24 * time.Hour,
		IsGenerateRefresh: true, IsRemoveAccess: true, IsRemoveRefreshing: true})
	m.MapTokenStorage(&tokenStore{byCode: map[string]oauth2.TokenInfo{}, byAccess: map[string]oauth2.TokenInfo{}, byRefresh: map[string]oauth2.TokenInfo{}})
	cs := clientStore{}
	keys := map[string]crypto.PublicKey{}
	for _, c := range opts.Clients {
		cs[c.ID] = &models.Client{ID: c.ID, Secret: c.Secret, Domain: "http://127.0.0.1", Public: c.Secret == "" && c.PublicKey == nil}
		if c.PublicKey != nil {
			keys[c.ID] = c.PublicKey
		}
	}
	m.MapClientStorage(cs)
	m.SetValidateURIHandler(validateLoopback)

	cfg := server.NewConfig()
	cfg.ForcePKCE = true
	cfg.AllowedCodeChallengeMethods = []oauth2.CodeChallengeMethod{oauth2.CodeChallengeS256}
	cfg.AllowedResponseTypes = []oauth2.ResponseType{oauth2.Code}
	cfg.AllowedGrantTypes = []oauth2.GrantType{oauth2.AuthorizationCode, oauth2.ClientCredentials, oauth2.Refreshing}
	as := &AuthServer{manager: m, grants: map[string]int{}, keys: keys}
	srv := server.NewServer(cfg, m)
	srv.ClientInfoHandler = as.clientInfo
	srv.UserAuthorizationHandler = func(http.ResponseWriter, *http.Request) (string, error) { return "test-user", nil }

	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                           as.URL,
			"authorization_endpoint":                           as.URL + "/authorize",
			"token_endpoint":                                   as.URL + "/token",
			"response_types_supported":                         []string{"code"},
			"grant_types_supported":                            []string{"authorization_code", "client_credentials", "refresh_token"},
			"code_challenge_methods_supported":                 []string{"S256"},
			"token_endpoint_auth_methods_supported":            []string{"client_secret_basic", "client_secret_post", "private_key_jwt", "none"},
			"token_endpoint_auth_signing_alg_values_supported": []string{"ES256", "RS256"},
			"scopes_supported":                                 opts.Scopes,
		})
	})
	mux.HandleFunc("/authorize", func(w http.ResponseWriter, r *http.Request) {
		if err := srv.HandleAuthorizeRequest(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		as.mu.Lock()
		as.auths++
		as.mu.Unlock()
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		srv.HandleTokenRequest(rec, r)
		if rec.status == http.StatusOK {
			as.mu.Lock()
			as.grants[r.PostFormValue("grant_type")]++
			as.mu.Unlock()
		}
	})
	as.srv = httptest.NewServer(mux)
	as.URL = as.srv.URL
	return as, nil
}

// Close stops the server.
func (as *AuthServer) Close() { as.srv.Close() }

// Grants is how many token requests of grant type gt ("client_credentials",
// "authorization_code", "refresh_token") got a token.
func (as *AuthServer) Grants(gt string) int {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.grants[gt]
}

// Authorizations is how many authorization requests were approved.
func (as *AuthServer) Authorizations() int {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.auths
}

// RevokeAccess makes an issued access token invalid (as if the server had revoked it early).
func (as *AuthServer) RevokeAccess(ctx context.Context, access string) error {
	return as.manager.RemoveAccessToken(ctx, access)
}

// Verifier is the token verifier of a resource server trusting this authorization server: a
// token it issued that has not expired or been revoked, with its scopes and expiry.
func (as *AuthServer) Verifier() auth.TokenVerifier {
	return func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		ti, err := as.manager.LoadAccessToken(ctx, token)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
		}
		return &auth.TokenInfo{Scopes: strings.Fields(ti.GetScope()), UserID: ti.GetUserID(),
			Expiration: ti.GetAccessCreateAt().Add(ti.GetAccessExpiresIn())}, nil
	}
}

// clientInfo takes the client's credentials from HTTP Basic authentication, the form
// (client_secret_post, or a public client's client_id alone), or a client assertion
// (private_key_jwt). A client registered with a key must authenticate with an assertion.
func (as *AuthServer) clientInfo(r *http.Request) (string, string, error) {
	if r.PostFormValue("client_assertion_type") == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" {
		id, err := as.verifyAssertion(r.PostFormValue("client_assertion"))
		if err != nil {
			return "", "", oerrors.ErrInvalidClient
		}
		return id, "", nil
	}
	id, secret, ok := r.BasicAuth()
	if ok {
		id, _ = url.QueryUnescape(id)
		secret, _ = url.QueryUnescape(secret)
	} else {
		id, secret = r.PostFormValue("client_id"), r.PostFormValue("client_secret")
	}
	if id == "" || as.keys[id] != nil {
		return "", "", oerrors.ErrInvalidClient
	}
	return id, secret, nil
}

// verifyAssertion checks a client assertion (RFC 7523 section 3): signed (ES256 or RS256) by
// the key of the client its iss names, sub equal to iss, aud this server's issuer or token
// endpoint, not expired. It returns the client ID.
func (as *AuthServer) verifyAssertion(jwt string) (string, error) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWT")
	}
	dec := base64.RawURLEncoding
	hb, err1 := dec.DecodeString(parts[0])
	cb, err2 := dec.DecodeString(parts[1])
	sig, err3 := dec.DecodeString(parts[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return "", err
	}
	var header struct{ Alg string }
	var claims struct {
		Iss, Sub string
		Aud      any
		Exp      int64
	}
	if err := errors.Join(json.Unmarshal(hb, &header), json.Unmarshal(cb, &claims)); err != nil {
		return "", err
	}
	key := as.keys[claims.Iss]
	if key == nil || claims.Sub != claims.Iss || time.Unix(claims.Exp, 0).Before(time.Now()) {
		return "", errors.New("unknown client, sub or expired")
	}
	if aud, _ := claims.Aud.(string); aud != as.URL && aud != as.URL+"/token" {
		return "", errors.New("wrong audience")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	switch k := key.(type) {
	case *ecdsa.PublicKey:
		if header.Alg != "ES256" || len(sig) != 64 ||
			!ecdsa.Verify(k, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
			return "", errors.New("bad signature")
		}
	case *rsa.PublicKey:
		if header.Alg != "RS256" || rsa.VerifyPKCS1v15(k, crypto.SHA256, digest[:], sig) != nil {
			return "", errors.New("bad signature")
		}
	default:
		return "", errors.New("unsupported key")
	}
	return claims.Iss, nil
}

// validateLoopback accepts a loopback redirect URI on any port (RFC 8252 section 7.3).
func validateLoopback(_, redirect string) error {
	u, err := url.Parse(redirect)
	if err != nil || u.Scheme != "http" || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
		return oerrors.ErrInvalidRedirectURI
	}
	return nil
}

// clientStore is a fixed set of clients (oauth2.ClientStore).
type clientStore map[string]oauth2.ClientInfo

func (cs clientStore) GetByID(_ context.Context, id string) (oauth2.ClientInfo, error) {
	if c, ok := cs[id]; ok {
		return c, nil
	}
	return nil, oerrors.ErrInvalidClient
}

// tokenStore keeps issued codes and tokens in memory (oauth2.TokenStore). The library's own
// memory store is built on buntdb, whose btree dependency clashes with the one Temporal needs.
type tokenStore struct {
	mu                          sync.Mutex
	byCode, byAccess, byRefresh map[string]oauth2.TokenInfo
}

func (ts *tokenStore) Create(_ context.Context, ti oauth2.TokenInfo) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if c := ti.GetCode(); c != "" {
		ts.byCode[c] = ti
		return nil
	}
	if a := ti.GetAccess(); a != "" {
		ts.byAccess[a] = ti
	}
	if r := ti.GetRefresh(); r != "" {
		ts.byRefresh[r] = ti
	}
	return nil
}

func (ts *tokenStore) remove(m map[string]oauth2.TokenInfo, key string) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(m, key)
	return nil
}

func (ts *tokenStore) RemoveByCode(_ context.Context, code string) error {
	return ts.remove(ts.byCode, code)
}

func (ts *tokenStore) RemoveByAccess(_ context.Context, access string) error {
	return ts.remove(ts.byAccess, access)
}

func (ts *tokenStore) RemoveByRefresh(_ context.Context, refresh string) error {
	return ts.remove(ts.byRefresh, refresh)
}

func (ts *tokenStore) get(m map[string]oauth2.TokenInfo, key string) (oauth2.TokenInfo, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return m[key], nil // nil: unknown (the manager reports it as invalid)
}

func (ts *tokenStore) GetByCode(_ context.Context, code string) (oauth2.TokenInfo, error) {
	return ts.get(ts.byCode, code)
}

func (ts *tokenStore) GetByAccess(_ context.Context, access string) (oauth2.TokenInfo, error) {
	return ts.get(ts.byAccess, access)
}

func (ts *tokenStore) GetByRefresh(_ context.Context, refresh string) (oauth2.TokenInfo, error) {
	return ts.get(ts.byRefresh, refresh)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Flush passes a flush on (the MCP handler streams events).
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// ResourceOptions configure a resource server.
type ResourceOptions struct {
	// Scopes every request's token must carry (a token without them gets 403
	// insufficient_scope); they are also the metadata's scopes_supported.
	Scopes []string
	// Resources are text resources served (URI → text); default one, test://hello.
	Resources map[string]string
}

// ResourceServer is a running MCP server protected by an AuthServer.
type ResourceServer struct {
	// URL is the MCP endpoint (http://127.0.0.1:PORT/mcp).
	URL string
	srv *httptest.Server

	mu       sync.Mutex
	tokens   []string // bearer tokens accepted, in order
	refusals int      // requests answered 401/403
}

// StartResourceServer starts an MCP server at /mcp that accepts tokens of as, with RFC 9728
// metadata at /.well-known/oauth-protected-resource/mcp that the 401 challenge points to.
func StartResourceServer(as *AuthServer, opts ResourceOptions) *ResourceServer {
	rs := &ResourceServer{}
	mcpSrv := mcp.NewServer(&mcp.Implementation{Name: "oauthas-resource", Version: "1"}, nil)
	res := opts.Resources
	if res == nil {
		res = map[string]string{"test://hello": "hello"}
	}
	for uri, text := range res {
		mcpSrv.AddResource(&mcp.Resource{URI: uri, Name: uri, MIMEType: "text/plain"},
			func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: text}}}, nil
			})
	}
	mux := http.NewServeMux()
	rs.srv = httptest.NewUnstartedServer(mux)
	rs.srv.Start()
	base := rs.srv.URL
	rs.URL = base + "/mcp"
	mux.Handle("/.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: rs.URL, AuthorizationServers: []string{as.URL}, ScopesSupported: opts.Scopes,
		BearerMethodsSupported: []string{"header"},
	}))
	verify := as.Verifier()
	counting := func(ctx context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		ti, err := verify(ctx, token, r)
		if err == nil {
			rs.mu.Lock()
			rs.tokens = append(rs.tokens, token)
			rs.mu.Unlock()
		}
		return ti, err
	}
	protect := auth.RequireBearerToken(counting, &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: base + "/.well-known/oauth-protected-resource/mcp", Scopes: opts.Scopes})
	h := protect(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcpSrv }, nil))
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		if rec.status == http.StatusUnauthorized || rec.status == http.StatusForbidden {
			rs.mu.Lock()
			rs.refusals++
			rs.mu.Unlock()
		}
	}))
	return rs
}

// Close stops the server.
func (rs *ResourceServer) Close() { rs.srv.Close() }

// Tokens are the distinct bearer tokens the server accepted, in the order first seen.
func (rs *ResourceServer) Tokens() []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, t := range rs.tokens {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// Refusals is how many requests were answered 401 or 403.
func (rs *ResourceServer) Refusals() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.refusals
}
