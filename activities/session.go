package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/tracing"
)

// Session runs session-bound MCP calls on the live session this worker's host holds. A call
// carrying another session generation fails non-retryably with StaleSession; reads never come
// from a client-side cache (sessions are pinned to protocol 2025-11-25).
type Session struct {
	Host  *mcphost.Host
	Store *ledger.Store

	// inflight are the reads the fast path (LocalRead) handed off while they were still in
	// flight, by request ID: MCPRead with that request ID joins the read instead of sending
	// another one.
	mu       sync.Mutex
	inflight map[string]*pendingRead
}

// Register registers every session-bound activity under its contract name; register them on
// the host's own task queue.
func (a *Session) Register(r Registry) {
	r.RegisterActivityWithOptions(a.MCPSubscribe, activity.RegisterOptions{Name: contract.ActMCPSubscribe})
	r.RegisterActivityWithOptions(a.MCPUnsubscribe, activity.RegisterOptions{Name: contract.ActMCPUnsubscribe})
	r.RegisterActivityWithOptions(a.MCPRead, activity.RegisterOptions{Name: contract.ActMCPRead})
}

func (a *Session) conn(sourceID, gen int64) (*mcphost.Conn, error) {
	c, err := a.Host.Conn(sourceID, gen)
	if err != nil {
		return nil, staleSession(err)
	}
	return c, nil
}

func staleSession(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypeStaleSession, err)
}

// ErrorClass says how a failed session-bound MCP call is handled.
type ErrorClass int

// Error classes, from Classify.
const (
	// ClassTransient: retried (internal and implementation-defined server errors, timeouts,
	// transport hiccups).
	ClassTransient ErrorClass = iota
	// ClassPermanent: a retry on the same session cannot fix it (malformed request, unknown
	// method, invalid params).
	ClassPermanent
	// ClassNotFound: the server says the resource does not exist (see IsNotFound).
	ClassNotFound
	// ClassSessionEnded: the connection ended under the call; the session is stale.
	ClassSessionEnded
)

// String names the class.
func (c ErrorClass) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	case ClassNotFound:
		return "not-found"
	case ClassSessionEnded:
		return "session-ended"
	}
	return fmt.Sprintf("ErrorClass(%d)", int(c))
}

// Classify classifies an MCP call's error. A JSON-RPC error the server sent is permanent when
// its code is a JSON-RPC 2.0 request error (-32700, -32600, -32601, -32602) and not-found when
// IsNotFound says so; every other code (-32603, the -32000…-32099 server range) is transient.
// A closed connection or a missing HTTP session is ClassSessionEnded; anything else (a
// timeout, a transport failure) is transient.
func Classify(err error) ErrorClass {
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
		return ClassSessionEnded
	}
	if IsNotFound(err) {
		return ClassNotFound
	}
	var werr *jsonrpc.Error
	if errors.As(err, &werr) {
		switch werr.Code {
		case jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
			return ClassPermanent
		}
	}
	return ClassTransient
}

// classify turns an MCP call's error into a Temporal error: the session ended under the call
// → StaleSession; a refusal a retry cannot fix (including not-found outside a read) →
// PermanentMCPError; anything else is returned wrapped and retried.
func (a *Session) classify(c *mcphost.Conn, op string, err error) error {
	class := Classify(err)
	if class == ClassSessionEnded {
		return staleSession(fmt.Errorf("%s on generation %d: %w", op, c.Generation(), err))
	}
	if cur, ok := a.Host.Current(c.Source().ID); !ok || cur != c {
		return staleSession(fmt.Errorf("%s on generation %d, which ended: %w", op, c.Generation(), err))
	}
	if class == ClassPermanent || class == ClassNotFound {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("%s: %v", op, err), contract.ErrTypePermanent, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// MCPSubscribe subscribes the subscription's URI on its session (R9): resources/subscribe on
// a 2025-11-25 session (the first holder of the URI on the session sends it), a
// subscriptions/listen stream's acknowledgement on a 2026-07-28 one. The output says whether
// that acknowledgement left the URI out (then the subscription polls, R11); a listen never
// acknowledged in time, or refused, is an error (a failed subscribe).
func (a *Session) MCPSubscribe(ctx context.Context, call contract.SessionCall) (contract.SubscribeOutput, error) {
	c, err := a.conn(call.SourceID, call.SessionGeneration)
	if err != nil {
		return contract.SubscribeOutput{}, err
	}
	res, err := c.Watch(ctx, call.ServerURI, call.SubscriptionID)
	if err != nil {
		return contract.SubscribeOutput{}, boundError(a.classify(c, "subscribe", err))
	}
	return contract.SubscribeOutput{NotAcknowledged: res.NotAcknowledged}, nil
}

// MCPUnsubscribe sends resources/unsubscribe when the subscription is the URI's last holder
// on its session. An error (including a timeout) means the acknowledgement is unknown (R20).
func (a *Session) MCPUnsubscribe(ctx context.Context, call contract.SessionCall) (contract.UnsubscribeOutput, error) {
	c, err := a.conn(call.SourceID, call.SessionGeneration)
	if err != nil {
		return contract.UnsubscribeOutput{}, err
	}
	sent, err := c.Unsubscribe(ctx, call.ServerURI, call.SubscriptionID)
	if err != nil {
		return contract.UnsubscribeOutput{Sent: sent}, boundError(a.classify(c, "resources/unsubscribe", err))
	}
	return contract.UnsubscribeOutput{Acked: true, Sent: sent}, nil
}

// MCPRead performs one resources/read on the session, stores the body in the blob table and
// returns its digest and metadata; a not-found answer is Found=false, not an error. A read of
// the same request ID that the fast path handed off while in flight (LocalRead) is joined:
// its answer is the answer, and no second resources/read is sent.
func (a *Session) MCPRead(ctx context.Context, in contract.ReadInput) (contract.ReadOutput, error) {
	c, err := a.conn(in.SourceID, in.SessionGeneration)
	if err != nil {
		return contract.ReadOutput{}, err
	}
	r := a.takeInflight(in.RequestID, c)
	if r == nil {
		r = startRead(ctx, c, in)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		// Timed out or cancelled: a retry of this activity may still join the read.
		a.putInflight(in.RequestID, r)
		return contract.ReadOutput{}, ctx.Err()
	}
	return a.finishRead(ctx, c, r)
}

// readTimeout bounds one resources/read started by startRead, like MCPRead's start-to-close
// timeout in the workflow.
const readTimeout = 30 * time.Second

// pendingRead is one resources/read in flight; res and err are set once done is closed.
type pendingRead struct {
	c      *mcphost.Conn
	done   chan struct{}
	sentAt time.Time
	res    *mcp.ReadResourceResult
	err    error
}

// startRead sends one resources/read on c in a goroutine of its own, after its URI has been
// quiet (R13, R27), bounded by readTimeout but not by ctx: a read handed off by the fast path
// outlives the local activity that sent it.
func startRead(ctx context.Context, c *mcphost.Conn, in contract.ReadInput) *pendingRead {
	r := &pendingRead{c: c, done: make(chan struct{})}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
	go func() {
		defer cancel()
		defer close(r.done)
		c.AwaitQuiet(rctx, in.ServerURI) // a burst of copies of one notification is covered by this read (R13, R27)
		r.sentAt = time.Now()
		// The read's span and its W3C trace context in _meta (issue 17); no _meta when tracing is off.
		sctx, span := tracing.StartMCPRead(rctx, in.ServerURI, in.Ordinal, in.RequestID)
		r.res, r.err = c.Session().ReadResource(sctx, &mcp.ReadResourceParams{Meta: tracing.Meta(sctx), URI: in.ServerURI})
		tracing.End(span, r.err)
	}()
	return r
}

// handedOffKeep is how long a handed-off read's answer waits for MCPRead to join it.
const handedOffKeep = 2 * time.Minute

// putInflight keeps r for MCPRead of reqID to join, until it is joined or handedOffKeep after
// it answered.
func (a *Session) putInflight(reqID string, r *pendingRead) {
	a.mu.Lock()
	if a.inflight == nil {
		a.inflight = map[string]*pendingRead{}
	}
	a.inflight[reqID] = r
	a.mu.Unlock()
	go func() {
		<-r.done
		time.Sleep(handedOffKeep)
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.inflight[reqID] == r {
			delete(a.inflight, reqID)
		}
	}()
}

// takeInflight returns and forgets the handed-off read of reqID if one is kept and was sent on
// c (a read of another session is never joined, R12); nil if not.
func (a *Session) takeInflight(reqID string, c *mcphost.Conn) *pendingRead {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.inflight[reqID]
	if r == nil || r.c != c {
		return nil
	}
	delete(a.inflight, reqID)
	return r
}

// finishRead turns the answer of a finished read into the activity's result: the body stored
// in the blob table, not-found as Found=false, an answer over the size bound as TooLarge, and
// errors classified (classify).
func (a *Session) finishRead(ctx context.Context, c *mcphost.Conn, r *pendingRead) (contract.ReadOutput, error) {
	out, body, err := a.answerRead(c, r)
	if err != nil || body == nil {
		return out, err
	}
	if out.Digest, err = a.Store.PutBlob(ctx, body, out.MIMEType); err != nil {
		return contract.ReadOutput{}, boundError(err)
	}
	return out, nil
}

// answerRead is finishRead without storing the body: it returns the body of a found answer
// within the size bound (nil otherwise) beside the result, for the fast path to store in the
// acceptance's own transaction (ledger.AcceptRequest.Body). out.Digest is left to the caller,
// which digests the body once, where it stores it or names it.
func (a *Session) answerRead(c *mcphost.Conn, r *pendingRead) (out contract.ReadOutput, body []byte, err error) {
	caps := c.Caps()
	// What the server says about itself and its content is recorded as the ledger stores
	// it (ledger.SafeText): a NUL in it must not fail the accept on every retry.
	// Both are bounded too (ledger.BoundedText): no server string of more than a few KiB
	// reaches a Temporal payload (issue 14 item 6).
	out = contract.ReadOutput{ServerName: ledger.BoundedText(caps.ServerName), ServerVersion: ledger.BoundedText(caps.ServerVersion)}
	out.SentAt = r.sentAt
	res, err := r.res, r.err
	if err != nil {
		if IsNotFound(err) {
			return out, nil, nil
		}
		// The answer was cut off at the transport, before decoding, for exceeding the
		// message bound of the source's --max-bytes (mcphost.MessageLimit, issue 14 item 6):
		// it is too large. Its size is unknown; Size is the message bound it exceeded, which
		// is above MaxBytes.
		if limit, ok := mcphost.MessageTooLarge(err); ok {
			out.Found, out.TooLarge, out.Size, out.MaxBytes = true, true, limit, c.Source().Connection.EffectiveMaxBytes()
			return out, nil, nil
		}
		return contract.ReadOutput{}, nil, boundError(a.classify(c, "resources/read", err))
	}
	// The size bound is checked before anything is stored or encoded (issue 14 item 6): a
	// larger resource is reported as TooLarge, for the acceptance point to record a TOO_LARGE
	// receipt; no blob is written.
	if limit, size := c.Source().Connection.EffectiveMaxBytes(), ContentsSize(res); size > limit {
		out.Found, out.TooLarge, out.Size, out.MaxBytes = true, true, size, limit
		if len(res.Contents) == 1 {
			out.MIMEType = ledger.BoundedText(res.Contents[0].MIMEType)
		}
		return out, nil, nil
	}
	body, mime, err := Body(res)
	if err != nil {
		return contract.ReadOutput{}, nil, boundError(temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypePermanent, err))
	}
	if body == nil {
		body = []byte{} // found, and empty: still a body to store
	}
	out.Found, out.MIMEType, out.Size = true, ledger.BoundedText(mime), int64(len(body))
	return out, body, nil
}

// ContentsSize is the size of a read's contents as the size bound counts it: the bytes of
// every text plus the decoded bytes of every blob (issue 14 item 6).
func ContentsSize(res *mcp.ReadResourceResult) int64 {
	if res == nil {
		return 0
	}
	var n int64
	for _, c := range res.Contents {
		if c == nil {
			continue
		}
		n += int64(len(c.Text)) + int64(len(c.Blob))
	}
	return n
}

// IsNotFound classifies a resources/read error as not-found in either protocol era
// (mcphost.IsNotFound: -32002, -32602 with data.uri or a "not found" message, or the session's
// own *mcphost.NotFoundError).
func IsNotFound(err error) bool { return mcphost.IsNotFound(err) }

// MultiContentsMIME is the MIME type of a body that holds several contents of one read.
const MultiContentsMIME = "application/vnd.mcpsync.contents+json"

// Body returns the bytes mcpsync stores and digests for a read: the text or blob of a single
// content item exactly as served, or, for several items, a JSON array of them.
func Body(res *mcp.ReadResourceResult) ([]byte, string, error) {
	if res == nil || len(res.Contents) == 0 {
		return []byte{}, "", nil
	}
	if len(res.Contents) == 1 {
		c := res.Contents[0]
		if c.Blob != nil {
			return c.Blob, c.MIMEType, nil
		}
		return []byte(c.Text), c.MIMEType, nil
	}
	b, err := json.Marshal(res.Contents)
	if err != nil {
		return nil, "", fmt.Errorf("encoding %d contents: %w", len(res.Contents), err)
	}
	return b, MultiContentsMIME, nil
}
