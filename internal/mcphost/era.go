package mcphost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// The two MCP eras a source can speak (issue 13). ProtocolLegacy has protocol sessions,
// initialize and an acknowledged resources/subscribe; ProtocolModern is stateless
// (server/discover), subscribes by subscriptions/listen and lets results carry a TTL.
const (
	ProtocolLegacy = ledger.ProtocolLegacy
	ProtocolModern = ledger.ProtocolModern
)

// Era policy of `--protocol auto` (issue 13 item 1): the newest revision both sides speak.
// auto connects asking for 2026-07-28: the go-sdk sends server/discover and, when the server
// does not serve it (a legacy server answers -32601, a stateful HTTP handler refuses it), falls
// back to initialize at 2025-11-25 on the same connection by itself. A pinned revision is
// used alone and checked. Connect records what was negotiated either way
// (cs.InitializeResult().ProtocolVersion). On a 2026-07-28 session resource subscriptions ride
// on subscriptions/listen streams (listenhost.go).

// EraError is a connect that did not reach the revision the source pinned: the server does
// not speak it. It is a configuration error (the source's health is FAILED with its text):
// reconnecting will not change the answer until the server or the source changes.
type EraError struct {
	// Want is the pinned revision; Got is what the server negotiated instead ("" when it
	// refused outright); Err is the server's refusal, if any.
	Want, Got string
	Err       error
}

func (e *EraError) Error() string {
	switch {
	case e.Got != "":
		return fmt.Sprintf("the source pins MCP %s (--protocol) but the server negotiated %s: it does not speak %s", e.Want, e.Got, e.Want)
	case e.Err != nil:
		return fmt.Sprintf("the source pins MCP %s (--protocol) but the server refused it: %v", e.Want, e.Err)
	}
	return fmt.Sprintf("the source pins MCP %s (--protocol) but the server does not speak it", e.Want)
}

func (e *EraError) Unwrap() error { return e.Err }

// Connect opens a client session on a transport from newTransport as the protocol choice
// says (ledger.Connection.Protocol: "", auto, 2025-11-25 or 2026-07-28) and returns it with
// the transport it runs on. A pinned revision the server does not negotiate is an *EraError
// (the session is closed). auto takes the newest revision both sides speak (see the era
// policy above); the revision negotiated is cs.InitializeResult().ProtocolVersion either way.
func Connect(ctx context.Context, client *mcp.Client, choice string, newTransport func() (mcp.Transport, error)) (*mcp.ClientSession, mcp.Transport, error) {
	switch choice {
	case "", ledger.ProtocolAuto:
		tr, err := newTransport()
		if err != nil {
			return nil, nil, err
		}
		cs, err := client.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolModern})
		return cs, tr, err
	case ProtocolLegacy, ProtocolModern:
		tr, err := newTransport()
		if err != nil {
			return nil, nil, err
		}
		cs, err := connectPinned(ctx, client, tr, choice)
		return cs, tr, err
	default:
		return nil, nil, &EraError{Want: choice, Err: errors.New("unknown protocol choice")}
	}
}

// connectPinned connects at exactly version: the go-sdk falls back from 2026-07-28 to
// initialize by itself, and a server may answer initialize with another revision, so the
// negotiated version is checked.
func connectPinned(ctx context.Context, client *mcp.Client, tr mcp.Transport, version string) (*mcp.ClientSession, error) {
	cs, err := client.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		if refusedEra(err) {
			return nil, &EraError{Want: version, Err: err}
		}
		return nil, err
	}
	if got := negotiated(cs); got != version {
		_ = cs.Close()
		return nil, &EraError{Want: version, Got: got}
	}
	return cs, nil
}

// negotiated is the revision a connected session speaks.
func negotiated(cs *mcp.ClientSession) string {
	if ir := cs.InitializeResult(); ir != nil {
		return ir.ProtocolVersion
	}
	return ""
}

// IsModern reports whether a negotiated revision is of the 2026-07-28 era.
func IsModern(version string) bool { return version >= ProtocolModern }

// refusedEra reports whether a connect failed because the server answered the handshake with
// a refusal (a JSON-RPC error, or a revision the client does not speak), as opposed to a
// transport failure or a timeout.
//
// Only codes a server answers a handshake it does not serve with count (invalid request,
// method not found, invalid params, unsupported protocol version): the go-sdk reports a
// transport that failed (connection refused, HTTP 401) as a JSON-RPC error too (-32005,
// "rejected by transport"), and that is no refusal of the revision.
func refusedEra(err error) bool {
	if werr, ok := errors.AsType[*jsonrpc.Error](err); ok {
		switch werr.Code {
		case jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams, codeUnsupportedProtocolVersion:
			return true
		}
		return false
	}
	return strings.Contains(strings.ToLower(err.Error()), "unsupported protocol version")
}

// codeUnsupportedProtocolVersion is mcp.CodeUnsupportedProtocolVersion (2026-07-28).
const codeUnsupportedProtocolVersion = mcp.CodeUnsupportedProtocolVersion

// NotFoundError is a resources/read the server answered with "no such resource" (issue 13
// item 6): -32002 (the older code), or -32602 (2026-07-28's code; under 2025-11-25 only with
// data.uri or a "not found" message, since there -32602 also means malformed params). Its
// Unwrap yields a -32602 *jsonrpc.Error whose data names the URI, then the server's own error,
// so that callers that classify by the JSON-RPC error find not-found whichever form the server
// used.
type NotFoundError struct {
	URI string
	// Code is the code the server answered with.
	Code int64
	Err  error
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("resource %q not found (%d): %v", e.URI, e.Code, e.Err)
}

func (e *NotFoundError) Unwrap() []error {
	data, _ := json.Marshal(map[string]string{"uri": e.URI})
	return []error{&jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resource not found", Data: data}, e.Err}
}

// ProtocolError is an answer that breaks the session's negotiated revision, e.g. a
// 2026-07-28 server answering a resources/read with empty contents, which that revision
// forbids for a missing resource (issue 13 item 6). It is audited (ledger.ReceiptProtocolError)
// and never accepted as a version. Its Unwrap yields a -32600 *jsonrpc.Error so that callers
// that classify by the JSON-RPC code treat it as permanent for this attempt: the next
// backstop or poll read asks again.
type ProtocolError struct {
	Method, URI, Protocol, Problem string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("protocol error from the server (MCP %s, %s %q): %s", e.Protocol, e.Method, e.URI, e.Problem)
}

func (e *ProtocolError) Unwrap() error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: e.Error()}
}

// IsNotFound reports whether err is a not-found answer to a resources/read: a *NotFoundError
// (what a guarded client returns), -32002, or -32602 with data.uri or a "not found" message.
func IsNotFound(err error) bool {
	if _, ok := errors.AsType[*NotFoundError](err); ok {
		return true
	}
	werr, ok := errors.AsType[*jsonrpc.Error](err)
	return ok && legacyNotFound(werr)
}

// legacyNotFound is the not-found rule that holds in every era: -32002, or -32602 with data
// naming the URI or a "not found" message.
func legacyNotFound(werr *jsonrpc.Error) bool {
	switch werr.Code {
	case CodeResourceNotFound:
		return true
	case jsonrpc.CodeInvalidParams:
		if strings.Contains(strings.ToLower(werr.Message), "not found") {
			return true
		}
		var data struct {
			URI string `json:"uri"`
		}
		return len(werr.Data) > 0 && json.Unmarshal(werr.Data, &data) == nil && data.URI != ""
	}
	return false
}

// CodeResourceNotFound is the older MCP not-found code of resources/read.
const CodeResourceNotFound = -32002

// Guard configures GuardClient: where protocol violations are audited (nil: not audited).
type Guard struct {
	Audit func(ctx context.Context, e *ProtocolError)
}

// GuardClient adds the session host's sending middleware to client (issue 13 items 5 and 6):
//
//   - TTL: every list and read result gets TTLMs = 0 before the go-sdk's client cache stores
//     it (the cache stores after the sending middleware), so no cached result ever answers a
//     read that becomes a version or a scan page: every call reaches the server. With it, a
//     result marked cacheScope "private" is not cached either, so nothing is shared across
//     subjects (each source has its own client anyway).
//   - Not found: a resources/read answered -32002, or -32602 on a 2026-07-28 session (or on
//     any session with data.uri or a "not found" message), returns a *NotFoundError.
//   - Empty contents: a 2026-07-28 server answering a resources/read with no contents returns
//     a *ProtocolError, audited through g.Audit.
func GuardClient(client *mcp.Client, g Guard) {
	client.AddSendingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			zeroTTL(res)
			if method != "resources/read" {
				return res, err
			}
			var uri string
			if p, ok := req.GetParams().(*mcp.ReadResourceParams); ok && p != nil {
				uri = p.URI
			}
			protocol := ""
			if cs, ok := req.GetSession().(*mcp.ClientSession); ok && cs != nil {
				protocol = negotiated(cs)
			}
			if err != nil {
				if werr, ok := errors.AsType[*jsonrpc.Error](err); ok &&
					(legacyNotFound(werr) || (IsModern(protocol) && werr.Code == jsonrpc.CodeInvalidParams)) {
					return nil, &NotFoundError{URI: uri, Code: werr.Code, Err: err}
				}
				return res, err
			}
			if rr, ok := res.(*mcp.ReadResourceResult); ok && IsModern(protocol) && (rr == nil || len(rr.Contents) == 0) {
				pe := &ProtocolError{Method: method, URI: uri, Protocol: protocol,
					Problem: "resources/read answered with empty contents (2026-07-28 requires -32602 for a missing resource)"}
				if g.Audit != nil {
					g.Audit(ctx, pe)
				}
				return nil, pe
			}
			return res, err
		}
	})
}

// zeroTTL sets the TTL of a cacheable result to 0, so that the go-sdk's client cache never
// serves it.
func zeroTTL(res mcp.Result) {
	switch r := res.(type) {
	case *mcp.ReadResourceResult:
		if r != nil {
			r.TTLMs = 0
		}
	case *mcp.ListResourcesResult:
		if r != nil {
			r.TTLMs = 0
		}
	case *mcp.ListResourceTemplatesResult:
		if r != nil {
			r.TTLMs = 0
		}
	case *mcp.ListToolsResult:
		if r != nil {
			r.TTLMs = 0
		}
	case *mcp.ListPromptsResult:
		if r != nil {
			r.TTLMs = 0
		}
	}
}

// auditProtocol records a protocol violation of this session in the ledger
// (ledger.ReceiptProtocolError), numbered per session so that each violation is one receipt.
func (c *Conn) auditProtocol(ctx context.Context, e *ProtocolError) {
	seq := c.violations.Add(1)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := retry(actx, func(ctx context.Context) error {
		return c.host.opts.Store.AuditProtocolViolation(ctx, ledger.ProtocolViolation{
			SourceID: c.source.ID, SessionGeneration: c.gen, Seq: seq, Method: e.Method, URI: e.URI,
			Protocol: e.Protocol, Problem: e.Problem,
		})
	})
	if err != nil {
		c.host.log.Warn("auditing a protocol violation failed", zap.Int64("source", c.source.ID), zap.Error(err))
	}
}

// keepModernAlive pings a 2026-07-28 session every interval until stop is closed, and closes
// the session after two consecutive failed pings (each waited for interval/2), so that a
// server that died is noticed as for a legacy session (the go-sdk runs its keep-alive for
// legacy sessions only, and a stateless HTTP session has no stream whose end would tell). Any
// answer from the server counts as alive, a JSON-RPC error included: a 2026-07-28 server may
// not serve ping at all (the go-sdk's answers -32601), and answering proves it is up. Only a
// failure to reach it (a transport error, the go-sdk's -32005 "rejected by transport", a
// timeout) counts.
//
// 2026-07-28 removed ping, so a server of that revision answers it with an error (and the
// go-sdk's logs each one). Over HTTP that answer is still the only liveness signal a stateless
// session has; over stdio the end of the child's pipe ends the session anyway, so there
// (overHTTP false) the first "method not found" stops the pings.
func keepModernAlive(cs *mcp.ClientSession, interval time.Duration, overHTTP bool, stop <-chan struct{}, log *zap.Logger) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval/2)
		err := cs.Ping(ctx, modernPingParams(cs))
		cancel()
		if err == nil || serverAnswered(err) {
			if werr, ok := errors.AsType[*jsonrpc.Error](err); ok && werr.Code == jsonrpc.CodeMethodNotFound && !overHTTP {
				log.Info("the server does not serve ping (2026-07-28): its end is noticed when its pipe closes")
				return
			}
			failures = 0
			continue
		}
		if failures++; failures >= 2 {
			log.Warn("keep-alive: the server stopped answering; ending the session", zap.Error(err))
			_ = cs.Close()
			return
		}
	}
}

// codeRejectedByTransport is the go-sdk's JSON-RPC code for a request its transport could
// not deliver (internal/jsonrpc2 ErrRejected): no answer from the server.
const codeRejectedByTransport = -32005

// serverAnswered reports whether err is a JSON-RPC error the server itself answered.
func serverAnswered(err error) bool {
	werr, ok := errors.AsType[*jsonrpc.Error](err)
	return ok && werr.Code != codeRejectedByTransport
}

// modernPingParams carries the per-request _meta that a 2026-07-28 server requires on every
// call (protocol version, client capabilities): go-sdk v1.8.0 adds it to its other calls but
// not to Ping, which a stateless HTTP server then rejects ("missing or invalid _meta field"),
// and the keep-alive would end a healthy session.
func modernPingParams(cs *mcp.ClientSession) *mcp.PingParams {
	return &mcp.PingParams{Meta: mcp.Meta{
		mcp.MetaKeyProtocolVersion:    negotiated(cs),
		mcp.MetaKeyClientCapabilities: map[string]any{},
	}}
}
