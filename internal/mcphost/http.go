package mcphost

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// httpTransport connects a streamable HTTP source with a single reconnect retry of its event
// stream, so that a dead or restarted HTTP server ends the session within seconds (the go-sdk
// default of five retries takes ~17 s); keep-alive pings catch a peer that hangs. The HTTP
// client carries the source's headers, bearer token and TLS settings (httpClient) and the
// OAuth handler (oauthHandler) adds its tokens. The transport remembers the last 401/403 it
// received (AuthFailure).
func httpTransport(ctx context.Context, src ledger.Source) (mcp.Transport, error) {
	client, err := httpClient(ctx, src)
	if err != nil {
		return nil, err
	}
	handler, err := oauthHandler(ctx, src, client)
	if err != nil {
		return nil, err
	}
	return newHTTPSourceTransport(src, client, handler), nil
}

// newHTTPSourceTransport is the transport of src over client (from httpClient) with the OAuth
// handler (nil: none). With a handler the SDK must see a 401/403 as a response, to run the
// OAuth flow and retry (go-sdk streamable.go, Write), so the client passes it through
// (still recorded); without one it becomes an *AuthError in the error chain.
func newHTTPSourceTransport(src ledger.Source, client *http.Client, handler auth.OAuthHandler) *httpSourceTransport {
	at := client.Transport.(*authTransport)
	at.passAuthFailures.Store(handler != nil)
	return &httpSourceTransport{
		StreamableClientTransport: &mcp.StreamableClientTransport{Endpoint: src.URL, MaxRetries: 1, HTTPClient: client, OAuthHandler: handler},
		auth:                      at.rec,
	}
}

// httpSourceTransport is the streamable client transport of an HTTP source with the record of
// its last authentication failure (AuthFailure).
type httpSourceTransport struct {
	*mcp.StreamableClientTransport
	auth *authRecorder
}

// httpClient returns the HTTP client of a source: every request carries the source's literal
// headers, its environment headers and its bearer token, all read now (at each connect: a
// rotated token or variable is picked up by the next session), and TLS uses the source's CA
// file (replacing the system roots) and client certificate. A missing variable or an
// unreadable file is an error that names the variable or the path, never a value. A 401 or
// 403 response becomes an error holding an *AuthError (and is recorded for AuthFailure). Every
// other response from the source is bounded, before the go-sdk reads it, to JSON-RPC messages
// of MessageLimit of the source's --max-bytes (limitBody, issue 14 item 6). Its Transport is
// an *authTransport.
func httpClient(_ context.Context, src ledger.Source) (*http.Client, error) {
	c := src.Connection
	bad := func(format string, args ...any) error {
		return fmt.Errorf("source %q: "+format, append([]any{src.Name}, args...)...)
	}
	u, err := url.Parse(src.URL)
	if err != nil {
		return nil, bad("URL: %w", err)
	}
	t := &authTransport{headers: http.Header{}, rec: &authRecorder{}, scheme: u.Scheme, host: u.Host,
		limit: MessageLimit(c.EffectiveMaxBytes()), count: &bodyCounter{}}
	for _, h := range c.Headers {
		t.headers.Set(h.Name, h.Value)
	}
	for _, h := range c.HeaderEnv {
		v, ok := os.LookupEnv(h.Env)
		switch {
		case !ok:
			return nil, bad("header %s: environment variable %s is not set", h.Name, h.Env)
		case v == "":
			return nil, bad("header %s: environment variable %s is empty", h.Name, h.Env)
		case strings.ContainsAny(v, "\r\n\x00"):
			return nil, bad("header %s: environment variable %s holds a line break or NUL", h.Name, h.Env)
		}
		t.headers.Set(h.Name, v)
		t.secrets = append(t.secrets, v)
	}
	var token, from string
	switch {
	case c.BearerEnv != "":
		from = "environment variable " + c.BearerEnv
		v, ok := os.LookupEnv(c.BearerEnv)
		if !ok {
			return nil, bad("bearer token: %s is not set", from)
		}
		token = v
	case c.BearerFile != "":
		from = "file " + c.BearerFile
		v, err := readSecretFile(c.BearerFile)
		if err != nil {
			return nil, bad("bearer token: %w", err)
		}
		token = v
	}
	if from != "" {
		token = strings.TrimSpace(token)
		if scheme, rest, ok := strings.Cut(token, " "); ok && strings.EqualFold(scheme, "bearer") {
			token = strings.TrimSpace(rest)
		}
		switch {
		case token == "":
			return nil, bad("bearer token: %s is empty", from)
		case strings.ContainsFunc(token, func(r rune) bool { return r < 0x21 || r == 0x7f }):
			return nil, bad("bearer token: %s holds a blank or control character inside the token", from)
		}
		t.headers.Set("Authorization", "Bearer "+token)
		t.secrets = append(t.secrets, token)
	}
	base, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return nil, errors.New("http.DefaultTransport is not an *http.Transport")
	}
	t.base = base.Clone()
	if c.CAFile != "" || c.CertFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CAFile != "" {
			pemBytes, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, bad("--ca-file: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pemBytes) {
				return nil, bad("--ca-file %s holds no PEM certificate", c.CAFile)
			}
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, bad("--cert-file %s / --key-file %s: %w", c.CertFile, c.KeyFile, err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		t.base.TLSClientConfig = cfg
	}
	return &http.Client{Transport: t}, nil
}

// maxSecretFileBytes bounds a bearer token file.
const maxSecretFileBytes = 64 << 10

// readSecretFile reads a secret from a file of at most maxSecretFileBytes; errors name the
// path, never the content.
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("file %s: %w", path, err)
	}
	if len(b) > maxSecretFileBytes {
		return "", fmt.Errorf("file %s is larger than %d bytes", path, maxSecretFileBytes)
	}
	return string(b), nil
}

// authTransport adds a source's headers to every request to the source's own scheme and host
// (never to another origin: not after a redirect, not to an OAuth authorization server that
// shares the client); a header the SDK set itself (Content-Type, Accept, Mcp-Session-Id,
// Mcp-Protocol-Version) is kept as the SDK set it. It turns a 401/403 from the source into an
// *AuthError, remembered in rec. Any other response from the source has its body bounded to
// JSON-RPC messages of at most limit bytes (limitBody).
type authTransport struct {
	base         *http.Transport
	scheme, host string // the source's origin
	headers      http.Header
	secrets      []string // values to mask if a server echoes them
	rec          *authRecorder
	// passAuthFailures returns 401/403 responses as they are (for the OAuth handler) instead
	// of as errors; they are still recorded.
	passAuthFailures atomic.Bool
	limit            int64        // MessageLimit of the source's bound
	count            *bodyCounter // bytes read from bounded bodies
}

// RoundTrip implements http.RoundTripper.
func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sameOrigin := strings.EqualFold(req.URL.Scheme, t.scheme) && strings.EqualFold(req.URL.Host, t.host)
	if !sameOrigin {
		return t.base.RoundTrip(req)
	}
	if len(t.headers) > 0 {
		req = req.Clone(req.Context())
		for name, vals := range t.headers {
			if _, set := req.Header[name]; !set {
				req.Header[name] = vals
			}
		}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		// A malformed response quoted in the error may hold what a hostile server echoed.
		return nil, maskSecrets(err, t.secrets)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		secrets := t.secrets
		if a := req.Header.Get("Authorization"); a != "" {
			secrets = append(secrets[:len(secrets):len(secrets)], a, strings.TrimSpace(strings.TrimPrefix(a, "Bearer ")))
		}
		ae, head := newAuthError(resp, secrets)
		t.rec.record(req.Method, ae)
		if t.passAuthFailures.Load() {
			// The OAuth handler reads the response as the server sent it.
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
			return resp, nil
		}
		resp.Body.Close()
		return nil, ae
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		t.rec.record(req.Method, nil)
	}
	limitBody(req, resp, t.limit, t.count)
	return resp, nil
}

// maskSecrets returns err with every secret in its text replaced by redact.Mask (err itself
// if it holds none); the original stays reachable with errors.Unwrap for errors.Is/As.
func maskSecrets(err error, secrets []string) error {
	msg := err.Error()
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, redact.Mask)
		}
	}
	if msg == err.Error() {
		return err
	}
	return &maskedError{msg: msg, err: err}
}

type maskedError struct {
	msg string
	err error
}

func (e *maskedError) Error() string { return e.msg }
func (e *maskedError) Unwrap() error { return e.err }

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the pooled connections.
func (t *authTransport) CloseIdleConnections() { t.base.CloseIdleConnections() }
