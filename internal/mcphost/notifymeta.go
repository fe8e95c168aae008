package mcphost

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stampNotificationVersion makes a 2026-07-28 notification POST carry its protocol version in
// _meta as well as in the Mcp-Protocol-Version header, as servers may require of every
// message of the era (github.com/mark3labs/mcp-go v1.2.1 answers 400 otherwise). The go-sdk
// v1.8.0 client sends notifications/cancelled — for every listen it ends (Unwatch, an ack
// without any of its URIs, an ack timeout) and every call whose context ends — through its
// connection directly, past the sending middleware, with no _meta; and a 4xx answer to a
// notification POST closes the go-sdk's connection, so one cancelled listen ended the whole
// session and a refused listen became a reconnect loop. data is the POST body; it returns the
// body to send and whether it changed.
func stampNotificationVersion(header http.Header, data []byte) ([]byte, bool) {
	version := header.Get("Mcp-Protocol-Version")
	if version == "" || version < "2026-07-28" || !bytes.Contains(data, []byte(`"method"`)) {
		return data, false
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(data, &msg) != nil || msg["method"] == nil {
		return data, false
	}
	if id, ok := msg["id"]; ok && string(id) != "null" {
		return data, false // a request: the go-sdk's middleware and its own code stamp those
	}
	params := map[string]json.RawMessage{}
	if p := msg["params"]; len(p) > 0 && string(p) != "null" {
		if json.Unmarshal(p, &params) != nil {
			return data, false
		}
	}
	meta := map[string]any{}
	if m := params["_meta"]; len(m) > 0 && string(m) != "null" {
		if json.Unmarshal(m, &meta) != nil {
			return data, false
		}
	}
	if v, _ := meta[mcp.MetaKeyProtocolVersion].(string); v != "" {
		return data, false
	}
	meta[mcp.MetaKeyProtocolVersion] = version
	m, err := json.Marshal(meta)
	if err != nil {
		return data, false
	}
	params["_meta"] = m
	p, err := json.Marshal(params)
	if err != nil {
		return data, false
	}
	msg["params"] = p
	out, err := json.Marshal(msg)
	if err != nil {
		return data, false
	}
	return out, true
}

// withBody returns a copy of req that sends body, and closes req's own body (a RoundTripper
// must).
func withBody(req *http.Request, body []byte) *http.Request {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return r
}
