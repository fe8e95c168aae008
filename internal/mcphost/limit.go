package mcphost

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Transport bounds (issue 14 item 6, "checked while reading"): the per-source size bound
// (ledger.Connection.EffectiveMaxBytes, --max-bytes) is checked on the decoded contents of a
// read (activities.MCPRead), but before that the go-sdk buffers and decodes the whole
// JSON-RPC message. Every message a source sends is therefore bounded at the transport,
// before decoding, by MessageLimit of the source's bound: an HTTP response body of JSON, each
// server-sent event, each line of a stdio child.

// ErrMessageTooLarge is the class of a JSON-RPC message from a source over its MessageLimit;
// the error in a chain is a *MessageTooLargeError, which carries the limit.
var ErrMessageTooLarge = errors.New("message too large")

// MessageTooLargeError is a message from a source that exceeded Limit bytes; it was cut off
// after Limit+1 bytes, so no more of it was read. errors.Is(err, ErrMessageTooLarge) holds.
type MessageTooLargeError struct {
	Limit int64
}

// Error says "message too large (limit N bytes)".
func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("%v (limit %d bytes)", ErrMessageTooLarge, e.Limit)
}

// Is makes errors.Is(err, ErrMessageTooLarge) hold.
func (e *MessageTooLargeError) Is(target error) bool { return target == ErrMessageTooLarge }

// messageOverhead is what a message may carry besides its contents: the JSON-RPC envelope,
// URIs, MIME types, _meta, SSE framing.
const messageOverhead = 1 << 20

// MessageLimit is the largest JSON-RPC message (a JSON body, an SSE event, a stdio line)
// accepted from a source whose resources are bounded by maxBytes: a text of maxBytes may take
// up to 6 bytes per byte once JSON-escaped (\u00XX), a blob 4/3 in base64, so 6 × maxBytes
// plus messageOverhead. A resource within the bound is never cut off by it.
func MessageLimit(maxBytes int64) int64 {
	return 6*max(maxBytes, 0) + messageOverhead
}

// MessageTooLarge reports whether err says that a source's message exceeded the transport
// bound, and the bound: a *MessageTooLargeError in the chain (stdio, or an HTTP stream without
// a call), or the JSON-RPC error this process put in place of a call's too-large response
// (limitBody). A server cannot forge the latter: it carries a token that never leaves the
// process.
func MessageTooLarge(err error) (limit int64, ok bool) {
	if e, ok := errors.AsType[*MessageTooLargeError](err); ok {
		return e.Limit, true
	}
	werr, ok := errors.AsType[*jsonrpc.Error](err)
	if !ok || werr.Code != codeMessageTooLarge || len(werr.Data) == 0 {
		return 0, false
	}
	var data tooLargeData
	if json.Unmarshal(werr.Data, &data) != nil || data.Marker.Token != tooLargeToken || data.Marker.Limit <= 0 {
		return 0, false
	}
	return data.Marker.Limit, true
}

// codeMessageTooLarge is the JSON-RPC error code of the response put in place of a too-large
// one (implementation-defined server-error range).
const codeMessageTooLarge = -32099

// tooLargeToken marks the responses this process synthesizes (MessageTooLarge); it is never
// sent anywhere.
var tooLargeToken = rand.Text()

type tooLargeData struct {
	Marker struct {
		Limit int64  `json:"limit"`
		Token string `json:"token"`
	} `json:"mcpsyncMessageTooLarge"`
}

// tooLargeResponse is the JSON-RPC error response to the call id that stands for a response
// over limit.
func tooLargeResponse(id json.RawMessage, limit int64) []byte {
	var data tooLargeData
	data.Marker.Limit, data.Marker.Token = limit, tooLargeToken
	raw, _ := json.Marshal(data)
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: codeMessageTooLarge, Message: (&MessageTooLargeError{limit}).Error(), Data: raw}})
	return b
}

// maxIDProbeBytes bounds how much of a request body is read to find its JSON-RPC call ID.
const maxIDProbeBytes = 1 << 20

// callID returns the JSON-RPC ID of req when it is a POST of one JSON-RPC call (nil
// otherwise), read from a copy of its body (GetBody).
func callID(req *http.Request) json.RawMessage {
	if req.Method != http.MethodPost || req.GetBody == nil {
		return nil
	}
	rc, err := req.GetBody()
	if err != nil {
		return nil
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxIDProbeBytes+1))
	if err != nil || len(b) > maxIDProbeBytes {
		return nil
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(b, &m) != nil || m.Method == "" || len(m.ID) == 0 || string(m.ID) == "null" {
		return nil
	}
	return m.ID
}

// bodyCounter counts the bytes the limit readers of one transport took from response bodies
// (the test hook shows that a too-large body is not read to its end).
type bodyCounter struct{ n atomic.Int64 }

func (c *bodyCounter) add(n int) {
	if c != nil {
		c.n.Add(int64(n))
	}
}

// limitBody replaces resp.Body with a reader that bounds each JSON-RPC message to limit bytes
// before the go-sdk buffers or decodes it:
//   - text/event-stream: each event (the bytes up to and including its blank line) is
//     counted. When one exceeds limit, no more of the body is read and the partial event is
//     closed under an event name the go-sdk ignores; then, on the stream of a call, an event
//     with the call's JSON-RPC error response follows (tooLargeResponse: the call fails with an
//     error MessageTooLarge recognizes, the session lives on), and on any other stream (the
//     standalone GET stream) a line the go-sdk rejects as malformed, which ends the session
//     with "message too large (limit N bytes)" in its reason: a notification cannot be
//     skipped silently, and the next session re-reads what it may have announced.
//   - any other type (application/json): the body is one message. For a call, a body
//     declaring a length over limit is not read at all and a body of unknown length is read
//     into memory up to limit+1 bytes before the go-sdk sees any of it; either way one over
//     limit is replaced by the call's error response, because the go-sdk ends the session on
//     a body it cannot read. Otherwise reading fails with a *MessageTooLargeError after
//     limit+1 bytes.
func limitBody(req *http.Request, resp *http.Response, limit int64, count *bodyCounter) {
	id := callID(req)
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "text/event-stream" {
		resp.Body = &sseLimitReader{body: resp.Body, limit: limit, id: id, count: count}
		return
	}
	if id != nil && resp.ContentLength > limit {
		resp.Body.Close()
		resp.Body = replacedBody(tooLargeResponse(id, limit), resp)
		return
	}
	if id != nil && resp.ContentLength < 0 {
		resp.Body = &bufferedJSON{body: resp.Body, limit: limit, id: id, count: count, resp: resp}
		return
	}
	resp.Body = &countingLimitReader{body: resp.Body, limit: limit, count: count}
}

func replacedBody(b []byte, resp *http.Response) io.ReadCloser {
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return io.NopCloser(bytes.NewReader(b))
}

// countingLimitReader fails with a *MessageTooLargeError once more than limit bytes were read.
type countingLimitReader struct {
	body  io.ReadCloser
	limit int64
	n     int64
	count *bodyCounter
	err   error
}

func (r *countingLimitReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if int64(len(p)) > r.limit-r.n+1 {
		p = p[:r.limit-r.n+1]
	}
	n, err := r.body.Read(p)
	r.count.add(n)
	r.n += int64(n)
	if r.n > r.limit {
		r.err = &MessageTooLargeError{Limit: r.limit}
		r.body.Close()
		return n - int(r.n-r.limit), r.err
	}
	return n, err
}

func (r *countingLimitReader) Close() error { return r.body.Close() }

// bufferedJSON reads a call's JSON body of unknown length into memory, up to limit+1 bytes,
// on its first Read; a body over limit is replaced by the call's error response.
type bufferedJSON struct {
	body  io.ReadCloser
	limit int64
	id    json.RawMessage
	count *bodyCounter
	resp  *http.Response
	buf   *bytes.Reader
	err   error
}

func (r *bufferedJSON) Read(p []byte) (int, error) {
	if r.buf == nil {
		lr := &countingLimitReader{body: r.body, limit: r.limit, count: r.count}
		b, err := io.ReadAll(lr)
		switch {
		case errors.Is(err, ErrMessageTooLarge):
			b = tooLargeResponse(r.id, r.limit)
		case err != nil:
			r.err = err
		}
		r.buf = bytes.NewReader(b)
	}
	n, err := r.buf.Read(p)
	if err == io.EOF && r.err != nil {
		err = r.err
	}
	return n, err
}

func (r *bufferedJSON) Close() error { return r.body.Close() }

// tooLargeEventName names the event that closes a cut-off SSE event: the go-sdk skips events
// whose name is not "message".
const tooLargeEventName = "mcpsync-message-too-large"

// sseLimitReader bounds each server-sent event of a stream to limit bytes (see limitBody).
type sseLimitReader struct {
	body  io.ReadCloser
	limit int64
	id    json.RawMessage // the call whose response stream this is; nil for other streams
	count *bodyCounter

	n       int64 // bytes of the current event so far
	lineLen int   // bytes of the current line, CR excluded
	colon   bool  // the current line has a ':'
	pending []byte
	err     error // once cut off: returned after pending
}

func (r *sseLimitReader) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		return n, nil
	}
	if r.err != nil {
		return 0, r.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > r.limit-r.n+1 {
		p = p[:r.limit-r.n+1]
	}
	n, err := r.body.Read(p)
	r.count.add(n)
	if i, over := r.scan(p[:n]); over {
		r.cut()
		return i + r.flushInto(p[i:]), nil
	}
	return n, err
}

// scan counts b into the current event and line, a line at a time (the bytes up to each
// newline at once, not byte by byte: every SSE stream of every session passes here). When
// the event goes over the bound it returns the offset of the first byte over it, with the
// line state as it was before that byte, and true.
func (r *sseLimitReader) scan(b []byte) (int, bool) {
	for off := 0; off < len(b); {
		line := b[off:]
		nl := bytes.IndexByte(line, '\n')
		if nl >= 0 {
			line = line[:nl]
		}
		if room := r.limit - r.n; int64(len(line)) > room {
			r.countLine(line[:room])
			return off + int(room), true
		}
		r.countLine(line)
		if nl < 0 {
			break
		}
		r.n++ // the newline
		if r.n > r.limit {
			return off + nl, true
		}
		if r.lineLen == 0 {
			r.n = 0 // a blank line ends the event
		}
		r.lineLen, r.colon = 0, false
		off += nl + 1
	}
	return len(b), false
}

// countLine counts bytes of the current line that hold no newline: CRs add to the event but
// not to the line's length.
func (r *sseLimitReader) countLine(b []byte) {
	r.n += int64(len(b))
	r.lineLen += len(b) - bytes.Count(b, []byte{'\r'})
	r.colon = r.colon || bytes.IndexByte(b, ':') >= 0
}

// cut stops reading the body and queues what ends the partial event and the stream.
func (r *sseLimitReader) cut() {
	r.body.Close()
	tooLarge := &MessageTooLargeError{Limit: r.limit}
	var b bytes.Buffer
	if r.lineLen > 0 {
		if !r.colon {
			b.WriteByte(':') // a field name the go-sdk ignores, not a malformed line
		}
		b.WriteByte('\n')
	}
	b.WriteString("event: " + tooLargeEventName + "\n\n")
	if r.id != nil {
		b.WriteString("event: message\ndata: ")
		b.Write(tooLargeResponse(r.id, r.limit))
		b.WriteString("\n\n")
		r.err = io.EOF
	} else {
		// No colon: the go-sdk fails the connection with this line in its error.
		b.WriteString("mcpsync " + tooLarge.Error() + "\n")
		r.err = tooLarge
	}
	r.pending = b.Bytes()
}

func (r *sseLimitReader) flushInto(p []byte) int {
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n
}

func (r *sseLimitReader) Close() error { return r.body.Close() }

// lineLimitReader bounds each newline-delimited message of a stdio child to limit bytes: once
// a line exceeds it, reading fails with a *MessageTooLargeError (and keeps failing: the
// stream cannot be resynchronized safely, so the session ends with that reason). Close does
// nothing: the connection is closed by closing the child's stdin.
type lineLimitReader struct {
	r     io.Reader
	limit int64
	n     int64 // bytes of the current line, its newline excluded
	err   error
}

func (r *lineLimitReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if int64(len(p)) > r.limit-r.n+1 {
		p = p[:r.limit-r.n+1]
	}
	n, err := r.r.Read(p)
	for i, b := range p[:n] {
		if b == '\n' {
			r.n = 0
			continue
		}
		r.n++
		if r.n > r.limit {
			r.err = &MessageTooLargeError{Limit: r.limit}
			return i, r.err
		}
	}
	return n, err
}

func (r *lineLimitReader) Close() error { return nil }
