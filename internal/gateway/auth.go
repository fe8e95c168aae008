package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Authentication (issue 15 item 2): every request to the gateway carries
// "Authorization: Bearer TOKEN", TOKEN one that `mcpsync token create` printed. The token is
// checked against the ledger on every HTTP request (ledger.AuthenticateToken: known, not
// expired, not revoked, in one statement), so a revocation holds for the next request the
// moment it commits. A request without a valid token gets HTTP 401 with
// "WWW-Authenticate: Bearer resource_metadata=…" pointing at the RFC 9728 protected-resource
// metadata, which the gateway serves at MetadataPath (and at MetadataPath+Path, the
// path-aware form RFC 9728 §3.1 derives from the resource URL).

// MetadataPath is where the gateway serves its RFC 9728 protected-resource metadata.
const MetadataPath = "/.well-known/oauth-protected-resource"

// extraTokenID is the key of the token's ID in auth.TokenInfo.Extra.
const extraTokenID = "tokenID"

// errNoPrincipal: a handler ran without an authenticated principal (a wiring bug: every route
// to the MCP endpoint passes protect).
var errNoPrincipal = errors.New("gateway: request carries no authenticated principal")

// errTokenRejected is what a client is told about a token that does not authenticate; it
// never says which of unknown, expired or revoked it was.
var errTokenRejected = fmt.Errorf("%w: token unknown, expired or revoked", auth.ErrInvalidToken)

// verifyToken is the auth.TokenVerifier of protect: the ledger's AuthenticateToken, its token
// record turned into an auth.TokenInfo (UserID = principal, Extra["tokenID"] = token ID,
// Expiration = the token's expiry, zero when it has none). A ledger failure is logged and
// answered 500 with a message that says nothing of the token.
func (g *Gateway) verifyToken(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	t, err := g.opts.Store.AuthenticateToken(ctx, token)
	switch {
	case errors.Is(err, ledger.ErrTokenInvalid):
		return nil, errTokenRejected
	case err != nil:
		g.opts.Logger.Warn("gateway: token check failed", zap.Error(err))
		return nil, errors.New("gateway: token check failed; try again")
	}
	ti := &auth.TokenInfo{UserID: t.Principal, Extra: map[string]any{extraTokenID: t.ID}}
	if t.ExpiresAt != nil {
		ti.Expiration = *t.ExpiresAt
	}
	return ti, nil
}

// protect wraps h so that it runs only for a request with a valid bearer token, with the
// token's auth.TokenInfo in the request's context (principalFrom reads it; the streamable
// handler also binds each MCP session to the principal that opened it, and copies the info to
// every request's RequestExtra). Missing, malformed, unknown, expired or revoked tokens get
// 401 and "WWW-Authenticate: Bearer resource_metadata=<this server's metadata URL>".
func (g *Gateway) protect(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.RequireBearerToken(g.verifyToken, &auth.RequireBearerTokenOptions{
			ResourceMetadataURL: baseURL(r) + MetadataPath + Path,
			// Tokens without a TTL have no expiry; AuthenticateToken checks the ones that do.
			AllowMissingExpiration: true,
		})(h).ServeHTTP(w, r)
	})
}

// metadataHandler serves the RFC 9728 protected-resource metadata of the MCP endpoint, its
// resource URL derived from the request (scheme from TLS or X-Forwarded-Proto, the Host
// header), so it is right behind a TLS-terminating proxy too. It lists no authorization
// server: tokens are issued by `mcpsync token create`, not by OAuth. Mount it with
// mountMetadata, or at MetadataPath and MetadataPath+Path.
func (g *Gateway) metadataHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
			Resource:               baseURL(r) + Path,
			BearerMethodsSupported: []string{"header"},
			ResourceName:           "mcpsync gateway",
		}).ServeHTTP(w, r)
	})
}

// mountMetadata registers metadataHandler at MetadataPath and at MetadataPath+Path (the URL
// protect's WWW-Authenticate names).
func (g *Gateway) mountMetadata(mux *http.ServeMux) {
	h := g.metadataHandler()
	mux.Handle(MetadataPath, h)
	mux.Handle(MetadataPath+Path, h)
}

// baseURL is the scheme and host the client reached this server by.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// principalFrom returns the principal and token ID of the bearer token that authenticated
// the request ctx belongs to (a context protect's handler, or something derived from it,
// received); ok is false when ctx carries none.
func principalFrom(ctx context.Context) (principal, tokenID string, ok bool) {
	return principalOfInfo(auth.TokenInfoFromContext(ctx))
}

// principalFromExtra is principalFrom for an MCP request handler, whose context need not be
// the HTTP request's: the streamable handler copies the token info into req.Extra.
func principalFromExtra(extra *mcp.RequestExtra) (principal, tokenID string, ok bool) {
	if extra == nil {
		return "", "", false
	}
	return principalOfInfo(extra.TokenInfo)
}

func principalOfInfo(ti *auth.TokenInfo) (principal, tokenID string, ok bool) {
	if ti == nil || ti.UserID == "" {
		return "", "", false
	}
	tokenID, _ = ti.Extra[extraTokenID].(string)
	return ti.UserID, tokenID, true
}
