package discovery

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/mcpsync/mcpsync"
)

// maxTranslatedBody bounds the request and JSON response bodies TranslateEmptyCursorsHTTP
// reads whole; larger ones pass unchanged.
const maxTranslatedBody = 8 << 20

// TranslateEmptyCursorsHTTP is [TranslateEmptyCursors] for the go-sdk's streamable HTTP
// client transport (mcp.StreamableClientTransport.HTTPClient): it returns a copy of base (nil:
// a zero http.Client) whose transport rewrites each POSTed 2026-07-28 resources/list or
// resources/templates/list request (cursor EmptyCursor goes out as "") and its answer, JSON
// or server-sent events (a present, empty nextCursor comes back as EmptyCursor). Other
// exchanges pass unchanged.
func TranslateEmptyCursorsHTTP(base *http.Client) *http.Client {
	c := &http.Client{}
	if base != nil {
		*c = *base
	}
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	c.Transport = &emptyCursorRoundTripper{next: rt}
	return c
}

type emptyCursorRoundTripper struct{ next http.RoundTripper }

// RoundTrip rewrites a 2026-07-28 list request and its response.
func (t *emptyCursorRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || req.GetBody == nil || LegacyRequest(req.Header) {
		return t.next.RoundTrip(req)
	}
	body, err := req.GetBody()
	if err != nil {
		return t.next.RoundTrip(req)
	}
	data, err := io.ReadAll(io.LimitReader(body, maxTranslatedBody+1))
	_ = body.Close()
	if err != nil || len(data) > maxTranslatedBody || !bytes.Contains(data, []byte(`"resources/`)) {
		return t.next.RoundTrip(req)
	}
	var msg map[string]json.RawMessage
	var method string
	if json.Unmarshal(data, &msg) != nil || json.Unmarshal(msg["method"], &method) != nil ||
		(method != methodListResources && method != methodListTemplates) || len(msg["id"]) == 0 {
		return t.next.RoundTrip(req)
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &params) != nil || !modernMeta(params["_meta"]) {
		return t.next.RoundTrip(req)
	}
	var cursor string
	if raw, ok := params["cursor"]; ok && json.Unmarshal(raw, &cursor) == nil && cursor == EmptyCursor {
		params["cursor"] = json.RawMessage(`""`)
		p, err1 := json.Marshal(params)
		msg["params"] = p
		out, err2 := json.Marshal(msg)
		if err1 == nil && err2 == nil {
			req = req.Clone(req.Context())
			req.Body = io.NopCloser(bytes.NewReader(out))
			req.ContentLength = int64(len(out))
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
		}
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return resp, err
	}
	id := msg["id"]
	switch ct := resp.Header.Get("Content-Type"); {
	case strings.HasPrefix(ct, "application/json"):
		data, rerr := io.ReadAll(io.LimitReader(resp.Body, maxTranslatedBody+1))
		_ = resp.Body.Close()
		if rerr == nil && len(data) <= maxTranslatedBody {
			if out, ok := emptyNextCursor(data, id); ok {
				data = out
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(data))
		resp.ContentLength = int64(len(data))
		resp.Header.Del("Content-Length")
	case strings.HasPrefix(ct, "text/event-stream"):
		resp.Body = &sseTranslator{src: resp.Body, r: bufio.NewReader(resp.Body), id: id}
	}
	return resp, nil
}

// sseTranslator rewrites the data lines of a server-sent event stream that answer id.
type sseTranslator struct {
	src io.Closer
	r   *bufio.Reader
	id  json.RawMessage
	buf []byte
	err error
}

func (s *sseTranslator) Read(p []byte) (int, error) {
	for len(s.buf) == 0 && s.err == nil {
		line, err := s.r.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			trimmed := bytes.TrimSpace(data)
			if out, ok := emptyNextCursor(trimmed, s.id); ok {
				line = append(append([]byte("data: "), out...), line[len(line)-trailingNewlines(line):]...)
			}
		}
		s.buf, s.err = line, err
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	if len(s.buf) == 0 && s.err != nil {
		return n, s.err
	}
	return n, nil
}

func (s *sseTranslator) Close() error { return s.src.Close() }

func trailingNewlines(b []byte) int {
	n := 0
	for n < len(b) && (b[len(b)-1-n] == '\n' || b[len(b)-1-n] == '\r') {
		n++
	}
	return n
}

// emptyNextCursor rewrites a JSON-RPC response to id whose result carries "nextCursor": ""
// so that it carries EmptyCursor; it reports whether it did.
func emptyNextCursor(data []byte, id json.RawMessage) ([]byte, bool) {
	if !mayHaveEmptyNextCursor(data) {
		return nil, false
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(data, &msg) != nil || !sameJSON(msg["id"], id) {
		return nil, false
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(msg["result"], &result) != nil {
		return nil, false
	}
	var next *string
	if raw, ok := result["nextCursor"]; !ok || json.Unmarshal(raw, &next) != nil || next == nil || *next != "" {
		return nil, false
	}
	result["nextCursor"], _ = json.Marshal(EmptyCursor)
	r, err1 := json.Marshal(result)
	msg["result"] = r
	out, err2 := json.Marshal(msg)
	if err1 != nil || err2 != nil {
		return nil, false
	}
	return out, true
}

// mayHaveEmptyNextCursor reports whether data holds the key "nextCursor" followed by an empty
// string, whatever JSON whitespace lies between: only then is a message worth decoding. Every
// page of a list but the last carries a non-empty nextCursor, so without this check each page
// would be decoded twice more than the go-sdk decodes it.
func mayHaveEmptyNextCursor(data []byte) bool {
	key := []byte(`"nextCursor"`)
	for {
		i := bytes.Index(data, key)
		if i < 0 {
			return false
		}
		data = data[i+len(key):]
		rest := bytes.TrimLeft(data, " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			if bytes.HasPrefix(bytes.TrimLeft(rest[1:], " \t\r\n"), []byte(`""`)) {
				return true
			}
		}
	}
}

// sameJSON reports whether two JSON-RPC IDs (strings or numbers) are equal.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	switch x.(type) {
	case string, float64:
		return x == y
	}
	return false
}

// LegacyRequest reports whether an MCP HTTP request's Mcp-Protocol-Version header names a
// revision before 2026-07-28: such a request is neither a listen nor a 2026-07-28 list, so the
// transport taps pass it on without reading its body (the go-sdk sends the header on every
// request after initialize; a request without it is read).
func LegacyRequest(h http.Header) bool {
	v := h.Get("Mcp-Protocol-Version")
	return v != "" && v < mcpsync.ProtocolVersion20260728
}
