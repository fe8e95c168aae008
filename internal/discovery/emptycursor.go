package discovery

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
)

const (
	methodListResources = "resources/list"
	methodListTemplates = "resources/templates/list"
)

// TranslateEmptyCursors wraps a client transport (stdio, in-memory, or any whose connection
// is a plain mcp.Connection) so that a *mcp.ClientSession on it can page through an empty
// cursor on a 2026-07-28 session (see [EmptyCursor]):
//
//   - a resources/list or resources/templates/list response whose result carries
//     "nextCursor": "" reaches the session as nextCursor EmptyCursor, for every such request
//     that carried _meta[io.modelcontextprotocol/protocolVersion] >= 2026-07-28 (earlier
//     revisions say only that a missing nextCursor ends the list; there "" is left as the
//     go-sdk reads it, the end);
//   - a list request whose cursor is EmptyCursor goes out with "cursor": "".
//
// Everything else passes unchanged. It does not apply to the go-sdk's streamable HTTP client
// transport, whose connection has methods a wrapper cannot pass on: there an empty cursor
// still reads as the end of the list.
func TranslateEmptyCursors(t mcp.Transport) mcp.Transport {
	return &emptyCursorTransport{t: t}
}

type emptyCursorTransport struct{ t mcp.Transport }

// Connect connects the wrapped transport and wraps its connection.
func (e *emptyCursorTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := e.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &emptyCursorConn{Connection: c, lists: map[jsonrpc.ID]bool{}}, nil
}

type emptyCursorConn struct {
	mcp.Connection
	mu    sync.Mutex
	lists map[jsonrpc.ID]bool // 2026-07-28 list requests awaiting their response
}

// Write notes the 2026-07-28 list requests and puts back the empty cursor they stand for.
func (c *emptyCursorConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() && (req.Method == methodListResources || req.Method == methodListTemplates) {
		var params map[string]json.RawMessage
		if json.Unmarshal(req.Params, &params) == nil && modernMeta(params["_meta"]) {
			c.mu.Lock()
			c.lists[req.ID] = true
			c.mu.Unlock()
			var cursor string
			if raw, ok := params["cursor"]; ok && json.Unmarshal(raw, &cursor) == nil && cursor == EmptyCursor {
				params["cursor"] = json.RawMessage(`""`)
				if b, err := json.Marshal(params); err == nil {
					cp := *req
					cp.Params = b
					msg = &cp
				}
			}
		}
	}
	return c.Connection.Write(ctx, msg)
}

// Read turns a present, empty nextCursor of a noted list response into EmptyCursor.
func (c *emptyCursorConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	resp, ok := msg.(*jsonrpc.Response)
	if err != nil || !ok || !resp.ID.IsValid() {
		return msg, err
	}
	c.mu.Lock()
	noted := c.lists[resp.ID]
	delete(c.lists, resp.ID)
	c.mu.Unlock()
	if !noted || resp.Error != nil || !mayHaveEmptyNextCursor(resp.Result) {
		return msg, err
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(resp.Result, &result) != nil {
		return msg, err
	}
	var next *string
	if raw, ok := result["nextCursor"]; !ok || json.Unmarshal(raw, &next) != nil || next == nil || *next != "" {
		return msg, err
	}
	b, merr := json.Marshal(EmptyCursor)
	if merr != nil {
		return msg, err
	}
	result["nextCursor"] = b
	out, merr := json.Marshal(result)
	if merr != nil {
		return msg, err
	}
	cp := *resp
	cp.Result = out
	return &cp, err
}

// modernMeta reports whether a request's _meta names protocol 2026-07-28 or later.
func modernMeta(raw json.RawMessage) bool {
	var meta map[string]any
	if json.Unmarshal(raw, &meta) != nil {
		return false
	}
	v, _ := meta[mcp.MetaKeyProtocolVersion].(string)
	return v >= mcpsync.ProtocolVersion20260728
}
