package mcphost_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// refSSEScan is the SSE bound counted one byte at a time, the definition the scanner must
// keep: every byte adds to the event; a newline after an empty line (CRs aside) ends it; the
// first byte that takes the event over limit is where the stream is cut, with the line state
// as it was before that byte.
type refSSEScan struct {
	limit, n int64
	lineLen  int
	colon    bool
}

func (r *refSSEScan) scan(p []byte) (int, bool) {
	for i, b := range p {
		r.n++
		if r.n > r.limit {
			return i, true
		}
		switch b {
		case '\n':
			if r.lineLen == 0 {
				r.n = 0
			}
			r.lineLen, r.colon = 0, false
		case '\r':
		case ':':
			r.lineLen++
			r.colon = true
		default:
			r.lineLen++
		}
	}
	return len(p), false
}

// The SSE bound counts a line at a time, with the same cut and the same state as counting
// byte by byte, however the stream is split into reads.
func TestSSEScanMatchesByteCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 16))
	alphabet := []byte("aaaaa::\r\n\n")
	for run := range 20000 {
		limit := int64(1 + rng.IntN(40))
		stream := make([]byte, rng.IntN(200))
		for i := range stream {
			stream[i] = alphabet[rng.IntN(len(alphabet))]
		}
		ref, got := &refSSEScan{limit: limit}, mcphost.NewSSEScanner(limit)
		for off := 0; off < len(stream); {
			chunk := stream[off:min(off+1+rng.IntN(30), len(stream))]
			wi, wover := ref.scan(chunk)
			gi, gover := got.Scan(chunk)
			n, lineLen, colon := got.State()
			if gi != wi || gover != wover || lineLen != ref.lineLen || colon != ref.colon || (!wover && n != ref.n) {
				t.Fatalf("run %d, limit %d, stream %q, chunk at %d %q: got (%d, %v) n=%d line=%d colon=%v, want (%d, %v) n=%d line=%d colon=%v",
					run, limit, stream, off, chunk, gi, gover, n, lineLen, colon, wi, wover, ref.n, ref.lineLen, ref.colon)
			}
			if wover {
				break
			}
			off += len(chunk)
		}
	}
}

// BenchmarkSSEScan compares the line-at-a-time SSE bound with counting byte by byte over a
// stream of list-page-sized events.
func BenchmarkSSEScan(b *testing.B) {
	event := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"resources\":[" +
		strings.Repeat(`{"uri":"demo://items/000123","name":"item 123","mimeType":"text/plain"},`, 100) + "]}}\n\n")
	const limit = 1 << 20
	b.Run("byte-at-a-time", func(b *testing.B) {
		b.SetBytes(int64(len(event)))
		r := &refSSEScan{limit: limit}
		for b.Loop() {
			r.scan(event)
		}
	})
	b.Run("line-at-a-time", func(b *testing.B) {
		b.SetBytes(int64(len(event)))
		s := mcphost.NewSSEScanner(limit)
		for b.Loop() {
			s.Scan(event)
		}
	})
}
