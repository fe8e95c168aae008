package gateway

import (
	"context"
	"net/http"
)

// Test hooks of auth.go (kept apart from export_test.go, which other files' hooks use).

// Protect is (*Gateway).protect: h behind the bearer-token check.
func Protect(g *Gateway, h http.Handler) http.Handler { return g.protect(h) }

// PrincipalFrom is principalFrom.
func PrincipalFrom(ctx context.Context) (principal, tokenID string, ok bool) {
	return principalFrom(ctx)
}

// MountMetadata is (*Gateway).mountMetadata.
func MountMetadata(g *Gateway, mux *http.ServeMux) { g.mountMetadata(mux) }
