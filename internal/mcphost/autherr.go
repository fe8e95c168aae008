package mcphost

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// AuthError is how a session's failure to authenticate reaches the caller: the server
// answered 401 or 403 (issue 14 items 1 and 2: AUTH_FAILED, never a silent loop). Challenge
// is the server's WWW-Authenticate header (its scheme and parameters: error,
// error_description, scope, resource_metadata, realm), Detail the first line of a plain-text
// body; both are bounded, stripped of control characters, with secret-looking URL parts
// masked and the credential this client sent replaced by ***, so neither ever carries a
// token. Callers branch on it with AuthFailure (or errors.As on a connect error).
type AuthError struct {
	Status    int
	Challenge string
	Detail    string
}

// Error implements error: "authentication failed: HTTP 401: <challenge> (<detail>)".
func (e *AuthError) Error() string {
	msg := fmt.Sprintf("authentication failed: HTTP %d", e.Status)
	if e.Challenge != "" {
		msg += ": " + e.Challenge
	}
	if e.Detail != "" {
		msg += " (" + e.Detail + ")"
	}
	return msg
}

// Bounds of the server text an AuthError keeps.
const (
	maxChallengeBytes = 512
	maxDetailBytes    = 200
)

// newAuthError builds the AuthError of a 401/403 response from its headers and the first
// few KiB of its body, which it returns too (the caller closes the body, or puts the bytes
// back in front of it). secrets are the credentials this request carried: they are masked
// wherever the server echoed them.
func newAuthError(resp *http.Response, secrets []string) (*AuthError, []byte) {
	ae := &AuthError{Status: resp.StatusCode}
	ae.Challenge = serverText(strings.Join(resp.Header.Values("WWW-Authenticate"), ", "), secrets, maxChallengeBytes)
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if ct := resp.Header.Get("Content-Type"); ct == "" || strings.HasPrefix(ct, "text/plain") {
		line, _, _ := strings.Cut(string(body), "\n")
		ae.Detail = serverText(line, secrets, maxDetailBytes)
	}
	return ae, body
}

// serverText makes text a server chose safe to keep and show: the credentials in secrets
// masked, secret-looking URL parts masked (redact.Text), control characters and invalid UTF-8
// dropped, blanks collapsed, at most limit bytes (cut on a rune boundary, marked with "…").
func serverText(text string, secrets []string, limit int) string {
	for _, s := range secrets {
		if len(s) >= 4 {
			text = strings.ReplaceAll(text, s, redact.Mask)
		}
	}
	text = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) || (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069) {
			return ' '
		}
		return r
	}, text)
	text = redact.Text(strings.Join(strings.Fields(text), " "))
	if len(text) > limit {
		text = mcpsync.CutAtRune(text, limit) + "…"
	}
	return text
}

// authRecorder remembers the last 401/403 an HTTP source's transport received, per request
// method: a later success of the same method clears it (a POST after an OAuth flow, a GET
// event stream that opens). Session teardown (DELETE) neither records nor clears. It is
// shared by the transport's RoundTripper and the transport itself.
type authRecorder struct {
	mu       sync.Mutex
	byMethod map[string]*AuthError
	last     *AuthError // the most recent of byMethod
}

func (r *authRecorder) record(method string, ae *AuthError) {
	if method == http.MethodDelete {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byMethod == nil {
		r.byMethod = map[string]*AuthError{}
	}
	prev := r.byMethod[method]
	r.byMethod[method] = ae
	switch {
	case ae != nil:
		r.last = ae
	case r.last == prev:
		r.last = nil
		for _, other := range r.byMethod {
			if other != nil {
				r.last = other
			}
		}
	}
}

func (r *authRecorder) get() *AuthError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// AuthFailure reports whether a source's session failed to authenticate: err (from
// client.Connect, a call, or ClientSession.Wait) holds an *AuthError, or tr — the transport
// DefaultTransport returned for an HTTP source — received a 401 or 403 that no success of
// the same request method followed. The second case covers what the go-sdk does not pass on
// as an error chain: the standalone SSE stream refused (the SDK fails the session with %v),
// and the 401 of a source with OAuth (the SDK runs the OAuth flow instead, and its failure is
// the handler's own error). nil if neither.
func AuthFailure(tr mcp.Transport, err error) *AuthError {
	if ae, ok := errors.AsType[*AuthError](err); ok {
		return ae
	}
	if t, ok := tr.(*httpSourceTransport); ok {
		return t.auth.get()
	}
	return nil
}
