package chaosmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Empty cursors (MCP 2026-07-28, server/utilities/pagination: "an empty string is a valid
// cursor and thus MUST NOT be treated as the end of results"). The go-sdk cannot carry one:
// its list results and params declare nextCursor and cursor omitempty, so "" never reaches
// the wire and a request with "cursor": "" reads as one without. The server therefore
// rewrites its connections (stdio, in-memory) and its stateless HTTP handler: a 2026-07-28
// list request with a present "cursor": "" reaches handleList as emptyCursorToken, and a
// result whose nextCursor is emptyCursorToken leaves as "nextCursor": "".

// emptyCursorToken is the in-process stand-in for the wire's empty cursor.
const emptyCursorToken = "\x00chaosmcp/empty-cursor\x00"

// SetEmptyCursorAtPage makes the cursor that leads to page n (n ≥ 1, of either list kind) an
// empty string for 2026-07-28 sessions: page n-1 answers "nextCursor": "", and a request with
// "cursor": "" is answered with page n of the last walk that was given it. It works over
// stdio, in-memory transports and the stateless HTTP handler (so [Server.BothErasHandler]).
// Legacy sessions are unaffected (their clients take "" for the end of the list). n ≤ 0 turns
// it off.
func (s *Server) SetEmptyCursorAtPage(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.emptyAt = max(n, 0)
}

// emptyCursorTransport wraps a server transport with the empty-cursor rewriting.
type emptyCursorTransport struct{ t mcp.Transport }

func (e *emptyCursorTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := e.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &emptyCursorConn{Connection: c}, nil
}

// withEmptyCursors wraps t, unless it declares its protocol versions (the wrapper would hide
// that).
func withEmptyCursors(t mcp.Transport) mcp.Transport {
	if _, ok := t.(mcp.ProtocolVersionSupporter); ok {
		return t
	}
	return &emptyCursorTransport{t: t}
}

type emptyCursorConn struct{ mcp.Connection }

// Read turns a present, empty cursor of a 2026-07-28 list request into emptyCursorToken.
func (c *emptyCursorConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	req, ok := msg.(*jsonrpc.Request)
	if err != nil || !ok || (req.Method != methodListResources && req.Method != methodListTemplates) {
		return msg, err
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(req.Params, &params) != nil || !modernMeta(params["_meta"]) {
		return msg, err
	}
	var cursor *string
	if raw, ok := params["cursor"]; !ok || json.Unmarshal(raw, &cursor) != nil || cursor == nil || *cursor != "" {
		return msg, err
	}
	params["cursor"], _ = json.Marshal(emptyCursorToken)
	b, merr := json.Marshal(params)
	if merr != nil {
		return msg, err
	}
	cp := *req
	cp.Params = b
	return &cp, err
}

// Write sends emptyCursorToken in a result's nextCursor as "".
func (c *emptyCursorConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if resp, ok := msg.(*jsonrpc.Response); ok && resp.Error == nil && len(resp.Result) > 0 {
		var result map[string]json.RawMessage
		var next string
		if json.Unmarshal(resp.Result, &result) == nil && json.Unmarshal(result["nextCursor"], &next) == nil && next == emptyCursorToken {
			result["nextCursor"] = json.RawMessage(`""`)
			if b, err := json.Marshal(result); err == nil {
				cp := *resp
				cp.Result = b
				msg = &cp
			}
		}
	}
	return c.Connection.Write(ctx, msg)
}

func modernMeta(raw json.RawMessage) bool {
	var meta map[string]any
	if json.Unmarshal(raw, &meta) != nil {
		return false
	}
	v, _ := meta[mcp.MetaKeyProtocolVersion].(string)
	return v >= ProtocolModern
}

// isModern reports whether the request's session speaks 2026-07-28 or later.
func isModern(req mcp.Request) bool {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok {
		return false
	}
	p := ss.InitializeParams()
	return p != nil && p.ProtocolVersion >= ProtocolModern
}

// emptyCursorHTTP gives a stateless HTTP handler the same empty-cursor rewriting as the
// stdio and in-memory connections: a 2026-07-28 list request's present "cursor": "" reaches
// the server as emptyCursorToken, and the token leaves every response as "".
func emptyCursorHTTP(h http.Handler) http.Handler {
	token, err := json.Marshal(emptyCursorToken)
	if err != nil {
		panic(err) // cannot happen: a constant string
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Body != nil {
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<22))
			if err != nil {
				http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
				return
			}
			body = emptyCursorRequest(body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		h.ServeHTTP(&emptyCursorWriter{ResponseWriter: w, token: token}, r)
	})
}

// emptyCursorRequest rewrites a 2026-07-28 list request whose cursor is present and empty.
func emptyCursorRequest(body []byte) []byte {
	var msg map[string]json.RawMessage
	var method string
	if json.Unmarshal(body, &msg) != nil || json.Unmarshal(msg["method"], &method) != nil ||
		(method != methodListResources && method != methodListTemplates) {
		return body
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &params) != nil || !modernMeta(params["_meta"]) {
		return body
	}
	var cursor *string
	if raw, ok := params["cursor"]; !ok || json.Unmarshal(raw, &cursor) != nil || cursor == nil || *cursor != "" {
		return body
	}
	params["cursor"], _ = json.Marshal(emptyCursorToken)
	p, err1 := json.Marshal(params)
	msg["params"] = p
	out, err2 := json.Marshal(msg)
	if err1 != nil || err2 != nil {
		return body
	}
	return out
}

// emptyCursorWriter writes the JSON-encoded emptyCursorToken as "" (the go-sdk writes each
// message in one Write).
type emptyCursorWriter struct {
	http.ResponseWriter
	token []byte
}

func (w *emptyCursorWriter) Write(b []byte) (int, error) {
	if !bytes.Contains(b, w.token) {
		return w.ResponseWriter.Write(b)
	}
	if _, err := w.ResponseWriter.Write(bytes.ReplaceAll(b, w.token, []byte(`""`))); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *emptyCursorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *emptyCursorWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
