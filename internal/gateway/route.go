package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Era routing (issue 15 item 1). One path serves both protocol eras from two streamable
// handlers on the same per-principal *mcp.Server: a stateful handler negotiates 2025-11-25
// (initialize, Mcp-Session-Id, resources/subscribe, the standalone GET stream) and rejects
// 2026-07-28 requests, while a stateless one serves 2026-07-28 (server/discover,
// subscriptions/listen) and answers GET with 405. A 2026-07-28 request carries its version
// in the Mcp-Protocol-Version header (the transport requires it to equal the version in
// _meta), so:
//   - POST without Mcp-Session-Id whose Mcp-Protocol-Version is 2026-07-28 or later → stateless;
//   - everything else (initialize, requests of a 2025-11-25 session, GET, DELETE) → stateful.
// A go-sdk client of the default era first sends server/discover with the 2026-07-28 header
// and so stays on the stateless handler; a 2025-11-25 client never sends that header.

const (
	routeVersionHeader = "Mcp-Protocol-Version"
	routeSessionHeader = "Mcp-Session-Id"
	// statelessEra is the first protocol version served by the stateless handler.
	statelessEra = "2026-07-28"
)

// route sends r to the handler of its protocol era.
func (g *Gateway) route(w http.ResponseWriter, r *http.Request) {
	if statelessRequest(r) {
		g.stateless.ServeHTTP(w, r)
		return
	}
	g.stateful.ServeHTTP(w, r)
}

// statelessRequest reports whether r belongs to the 2026-07-28 era (dates in YYYY-MM-DD form
// order as strings).
func statelessRequest(r *http.Request) bool {
	v := r.Header.Get(routeVersionHeader)
	return r.Method == http.MethodPost && r.Header.Get(routeSessionHeader) == "" && v != "" && v >= statelessEra
}

// limitBody bounds a request body to Options.MaxRequestBytes (issue 15 item 6): a larger
// body, announced by Content-Length or found while reading, gets 413 with a line that says
// the limit, before authentication or any MCP handling, so nothing was done for it. A body
// within the bound is read whole and handed on.
func (g *Gateway) limitBody(h http.Handler) http.Handler {
	max := g.opts.MaxRequestBytes
	tooLarge := func(w http.ResponseWriter) {
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("request body too large: the gateway accepts at most %d bytes per request", max),
			http.StatusRequestEntityTooLarge)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			tooLarge(w)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
			var mbe *http.MaxBytesError
			switch {
			case errors.As(err, &mbe):
				tooLarge(w)
				return
			case err != nil:
				http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, r)
	})
}
