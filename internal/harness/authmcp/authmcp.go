// Package authmcp is a real MCP server behind authentication, for tests of authenticated HTTP
// sources (issue 14, item 1): a go-sdk streamable HTTP server with a few text resources,
// wrapped in the go-sdk's bearer-token middleware (auth.RequireBearerToken, whose 401 carries
// WWW-Authenticate with resource_metadata), serving its protected-resource metadata (RFC
// 9728), optionally requiring extra headers, and optionally served over TLS with a CA it
// generates (crypto/x509) and a required client certificate (mTLS). It binds 127.0.0.1 on a
// free port only.
//
// The OAuth tests reuse it: Options.Verifier checks tokens issued by their authorization
// server, Options.AuthorizationServers lists it in the metadata, and Options.Mux mounts more
// routes on the same listener.
package authmcp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// Options configure a Server. The zero value is a plain-HTTP server that asks for no
// credentials and serves DefaultResources.
type Options struct {
	// Name and Version are the server's serverInfo ("authmcp", "1.0.0" if empty).
	Name, Version string
	// Resources are the served resources, URI → text/plain content (DefaultResources if nil).
	Resources map[string]string
	// Tokens are the bearer tokens accepted (each verified as valid for the next hour, with
	// the scopes of Scopes). Ignored when Verifier is set. With neither, no token is asked.
	Tokens []string
	// Verifier, if set, decides which bearer tokens are accepted (it must return an error
	// wrapping auth.ErrInvalidToken for a bad one).
	Verifier auth.TokenVerifier
	// PageSize is the number of resources per resources/list page (the go-sdk's default if
	// zero).
	PageSize int
	// Scopes are required of every token; a token without them gets 403 insufficient scope.
	Scopes []string
	// AuthorizationServers are listed in the protected-resource metadata.
	AuthorizationServers []string
	// Headers must be present on every request with exactly these values; a request without
	// them is answered 401 with WWW-Authenticate error="invalid_request" naming the header.
	Headers map[string]string
	// TLS serves HTTPS with a server certificate for 127.0.0.1 signed by a CA generated at
	// Start (its PEM in Server.CAFile).
	TLS bool
	// ClientCert (implies TLS) requires a client certificate signed by that CA; one is
	// written to Server.ClientCertFile / ClientKeyFile.
	ClientCert bool
	// Dir is where the PEM files are written (required with TLS or ClientCert).
	Dir string
	// Mux, if set, may add routes next to the MCP endpoint; base is the server's base URL.
	Mux func(base string, mux *http.ServeMux)
}

// DefaultResources are the resources served when Options.Resources is nil.
var DefaultResources = map[string]string{
	"demo://auth/readme": "only for authenticated clients\n",
	"demo://auth/notes":  "notes behind a token\n",
}

// Server is a running authenticated MCP server. Close stops it.
type Server struct {
	// Base is the server's base URL (scheme, 127.0.0.1 and port); URL is its MCP endpoint
	// (Base + "/mcp").
	Base, URL string
	// ResourceMetadataURL is where the protected-resource metadata is served; the 401's
	// WWW-Authenticate names it.
	ResourceMetadataURL string
	// CAFile is the PEM of the CA that signed the server (and client) certificates; empty
	// without TLS. ClientCertFile and ClientKeyFile are a client certificate and its key
	// signed by that CA; empty without ClientCert.
	CAFile, ClientCertFile, ClientKeyFile string
	// MCP is the MCP server behind the endpoint.
	MCP *mcp.Server

	hts      *httptest.Server
	rejected atomic.Int64
	served   atomic.Int64
	mu       sync.Mutex
	texts    map[string]string
}

// Start starts a server on 127.0.0.1 with a free port.
func Start(opts Options) (*Server, error) {
	if opts.ClientCert {
		opts.TLS = true
	}
	if opts.TLS && opts.Dir == "" {
		return nil, errors.New("authmcp: TLS needs Options.Dir for the PEM files")
	}
	name, version := opts.Name, opts.Version
	if name == "" {
		name = "authmcp"
	}
	if version == "" {
		version = "1.0.0"
	}
	resources := opts.Resources
	if resources == nil {
		resources = DefaultResources
	}
	s := &Server{texts: maps.Clone(resources)}
	s.MCP = mcp.NewServer(&mcp.Implementation{Name: name, Version: version}, &mcp.ServerOptions{
		PageSize:           opts.PageSize,
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	for _, uri := range slices.Sorted(maps.Keys(s.texts)) {
		s.MCP.AddResource(&mcp.Resource{URI: uri, Name: uri, MIMEType: "text/plain"}, s.read)
	}

	mux := http.NewServeMux()
	s.hts = httptest.NewUnstartedServer(mux)
	s.hts.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshake failures are expected in tests
	scheme := "http"
	if opts.TLS {
		scheme = "https"
	}
	s.Base = scheme + "://" + s.hts.Listener.Addr().String()
	s.URL = s.Base + "/mcp"
	s.ResourceMetadataURL = s.Base + "/.well-known/oauth-protected-resource/mcp"

	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.MCP }, nil)
	verifier := opts.Verifier
	if verifier == nil && len(opts.Tokens) > 0 {
		verifier = tokenSet(opts.Tokens, opts.Scopes)
	}
	if verifier != nil {
		h = auth.RequireBearerToken(verifier, &auth.RequireBearerTokenOptions{
			ResourceMetadataURL: s.ResourceMetadataURL, Scopes: opts.Scopes})(h)
	}
	if len(opts.Headers) > 0 {
		h = requireHeaders(opts.Headers, h)
	}
	mux.Handle("/mcp", s.count(h))
	prm := auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: s.URL, AuthorizationServers: opts.AuthorizationServers, ScopesSupported: opts.Scopes,
		BearerMethodsSupported: []string{"header"}, ResourceName: name,
	})
	mux.Handle("/.well-known/oauth-protected-resource/mcp", prm)
	mux.Handle("/.well-known/oauth-protected-resource", prm)
	if opts.Mux != nil {
		opts.Mux(s.Base, mux)
	}

	if !opts.TLS {
		s.hts.Start()
		return s, nil
	}
	pki, err := newPKI(opts.Dir, opts.ClientCert)
	if err != nil {
		s.hts.Listener.Close()
		return nil, err
	}
	s.CAFile, s.ClientCertFile, s.ClientKeyFile = pki.caFile, pki.clientCertFile, pki.clientKeyFile
	cfg := &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	if opts.ClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AddCert(pki.ca)
	}
	s.hts.TLS = cfg
	s.hts.StartTLS()
	return s, nil
}

// New starts a server for the test tb and stops it when the test ends; Options.Dir defaults
// to a temporary directory of the test.
func New(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	s, err := Start(opts)
	if err != nil {
		tb.Fatalf("authmcp: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Close stops the server and closes its connections.
func (s *Server) Close() {
	s.hts.CloseClientConnections()
	s.hts.Close()
}

// Rejected is the number of requests to the MCP endpoint answered 401 or 403.
func (s *Server) Rejected() int64 { return s.rejected.Load() }

// Served is the number of requests to the MCP endpoint answered with anything but 401 or 403.
func (s *Server) Served() int64 { return s.served.Load() }

// Set changes the text of a served resource (it must be one of the resources given at Start).
func (s *Server) Set(uri, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.texts[uri] = text
}

func (s *Server) read(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	s.mu.Lock()
	text, ok := s.texts[req.Params.URI]
	s.mu.Unlock()
	if !ok {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: text}}}, nil
}

// count records whether each request to the endpoint was let through.
func (s *Server) count(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.status == http.StatusUnauthorized || sw.status == http.StatusForbidden {
			s.rejected.Add(1)
		} else {
			s.served.Add(1)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps SSE streaming working through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// tokenSet accepts exactly the given tokens, each as valid for the next hour with scopes.
func tokenSet(tokens, scopes []string) auth.TokenVerifier {
	return func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if !slices.Contains(tokens, token) {
			return nil, fmt.Errorf("unknown token: %w", auth.ErrInvalidToken)
		}
		return &auth.TokenInfo{Scopes: scopes, Expiration: time.Now().Add(time.Hour)}, nil
	}
}

// requireHeaders answers 401 unless every header of want is present with its value.
func requireHeaders(want map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, name := range slices.Sorted(maps.Keys(want)) {
			if r.Header.Get(name) != want[name] {
				w.Header().Set("WWW-Authenticate",
					fmt.Sprintf(`Bearer error="invalid_request", error_description="header %s missing or wrong"`, name))
				http.Error(w, "missing or wrong header "+name, http.StatusUnauthorized)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
