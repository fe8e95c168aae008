package mcphost_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// Issue 14 item 6, "checked while reading": every message of a source is bounded at the
// transport to mcphost.MessageLimit of its --max-bytes, before the go-sdk buffers or decodes
// it.

const (
	limitMaxBytes = 64
	bigURI        = "demo://limit/big"
	smallURI      = "demo://limit/small"
	overURI       = "demo://limit/over" // over --max-bytes, within the message bound
	// bigSize is far over MessageLimit(limitMaxBytes) (1 MiB + 384 bytes).
	bigSize = 8 << 20
)

// hugeLineServerArg makes the test binary, run as a child, serve chaosmcp over stdio with a
// resource whose read answer is one line of more than bigSize bytes.
const hugeLineServerArg = "mcphost-test-huge-line-server"

func init() {
	if len(os.Args) > 1 && os.Args[1] == hugeLineServerArg {
		srv := chaosmcp.New(chaosmcp.Options{Name: "huge-line"})
		setLimitResources(srv.Set)
		if err := srv.ServeStdio(context.Background()); err != nil {
			os.Stderr.WriteString("huge-line server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func setLimitResources(set func(uri, text, mime string)) {
	set(bigURI, strings.Repeat("b", bigSize), "text/plain")
	set(smallURI, "small\n", "text/plain")
	set(overURI, strings.Repeat("o", 10*limitMaxBytes), "text/plain")
}

// jsonResponseServer serves the limit resources from a go-sdk server whose streamable handler
// answers POSTs with application/json bodies (not SSE), on a free loopback port.
func jsonResponseServer(t *testing.T) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "json-response", Version: "1"}, nil)
	setLimitResources(func(uri, text, mimeType string) {
		srv.AddResource(&mcp.Resource{URI: uri, Name: uri, MIMEType: mimeType},
			func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: mimeType, Text: text}}}, nil
			})
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// A read whose answer is over the message bound fails with an error MessageTooLarge
// recognizes, carrying the bound, after the transport read little more than the bound of the
// body (not its 8 MiB); the session lives on: the next read on it succeeds, and one over
// --max-bytes but within the bound is not cut (the size check after decoding handles it).
// Both response kinds of streamable HTTP: an SSE stream (chaosmcp) and a JSON body (go-sdk
// server with JSONResponse).
func TestHTTPMessageOverBoundIsCutAndSessionSurvives(t *testing.T) {
	limit := mcphost.MessageLimit(limitMaxBytes)
	tests := []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"sse response (chaosmcp)", func(t *testing.T) string {
			srv := chaosmcp.New(chaosmcp.Options{})
			t.Cleanup(func() { srv.Close() })
			setLimitResources(srv.Set)
			hs, err := srv.StartHTTP("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { hs.Close() })
			return hs.URL
		}},
		{"json response (go-sdk JSONResponse)", jsonResponseServer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := ledger.Source{SourceSpec: ledger.SourceSpec{Name: "limited", Transport: ledger.TransportHTTP,
				URL: tt.url(t), Connection: ledger.Connection{MaxBytes: limitMaxBytes}}}
			tr, err := mcphost.DefaultTransport(t.Context(), src)
			if err != nil {
				t.Fatal(err)
			}
			cs, err := connectSource(t, tr)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			before := mcphost.BodyBytes(tr)
			_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: bigURI})
			read := mcphost.BodyBytes(tr) - before
			got, ok := mcphost.MessageTooLarge(err)
			if !ok || got != limit {
				t.Fatalf("read of %d bytes: error %.300v (MessageTooLarge %d, %v), want the bound %d", bigSize, err, got, ok, limit)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("message too large (limit %d bytes)", limit)) {
				t.Errorf("error %q does not state the bound", err)
			}
			if read > limit+1 {
				t.Errorf("the transport read %d bytes of the %d-byte answer, over the bound %d", read, bigSize, limit)
			}
			t.Logf("bound %d bytes; body bytes read for the cut answer: %d (answer ~%d)", limit, read, bigSize)
			for _, u := range []string{smallURI, overURI, smallURI} {
				res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: u})
				if err != nil {
					t.Fatalf("read %s after the cut: %v", u, err)
				}
				if n := len(res.Contents[0].Text); n == 0 {
					t.Errorf("read %s: empty", u)
				}
			}
		})
	}
}

// A message over the bound on the standalone GET event stream (a server notification) cannot
// be answered in place of a call and must not be skipped silently: the session ends, and its
// error states the bound. The notification is a resources/updated for a subscribed URI of
// 2 MiB.
func TestHTTPNotificationOverBoundEndsSession(t *testing.T) {
	limit := mcphost.MessageLimit(limitMaxBytes)
	srv := mcp.NewServer(&mcp.Implementation{Name: "loud", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	src := ledger.Source{SourceSpec: ledger.SourceSpec{Name: "loud", Transport: ledger.TransportHTTP,
		URL: hs.URL, Connection: ledger.Connection{MaxBytes: limitMaxBytes}}}
	tr, err := mcphost.DefaultTransport(t.Context(), src)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := connectSource(t, tr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	huge := "demo://loud/" + strings.Repeat("u", 2<<20) // over the bound, within the server's request limit
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: huge}); err != nil {
		t.Fatalf("subscribe: %.300v", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cs.Wait() }()
	var waitErr error
loop:
	for {
		// Repeated until the standalone stream (opened after initialize) carries one.
		if err := srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: huge}); err != nil {
			t.Fatalf("resource updated: %.300v", err)
		}
		select {
		case waitErr = <-ended:
			break loop
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the session survived a notification over the bound")
		}
	}
	t.Logf("session ended: %.300v", waitErr)
	if want := fmt.Sprintf("message too large (limit %d bytes)", limit); waitErr == nil || !strings.Contains(waitErr.Error(), want) {
		t.Errorf("session ended with %.300v, want it to say %q", waitErr, want)
	}
	if read := mcphost.BodyBytes(tr); read > 2*limit {
		t.Errorf("the transport read %d bytes, more than the bound %d allows", read, limit)
	}
}

// A stdio child's line over the bound ends the session (the stream cannot be resynchronized):
// the read fails with ErrMessageTooLarge, the session's recorded end reason and the source's
// health say "message too large (limit N bytes)". Through the real host, with a chaosmcp
// child; a read over --max-bytes but within the bound still works on the same session.
func TestStdioLineOverBoundEndsSession(t *testing.T) {
	f := newFixture(t)
	limit := mcphost.MessageLimit(limitMaxBytes)
	src := f.addSource(ledger.SourceSpec{Name: "huge-line", Transport: ledger.TransportStdio,
		Command: []string{os.Args[0], hugeLineServerArg}, Connection: ledger.Connection{MaxBytes: limitMaxBytes}})
	h := f.startHost("host-limit", mcphost.Options{}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second)
	defer cancel()
	if res, err := c.Session().ReadResource(ctx, &mcp.ReadResourceParams{URI: overURI}); err != nil || len(res.Contents[0].Text) != 10*limitMaxBytes {
		t.Fatalf("read over --max-bytes, within the bound: %v", err)
	}
	_, err := c.Session().ReadResource(ctx, &mcp.ReadResourceParams{URI: bigURI})
	if !errors.Is(err, mcphost.ErrMessageTooLarge) {
		t.Fatalf("read of a %d-byte line: %.300v, want ErrMessageTooLarge", bigSize, err)
	}
	if got, ok := mcphost.MessageTooLarge(err); !ok || got != limit {
		t.Errorf("MessageTooLarge: %d %v, want %d", got, ok, limit)
	}
	t.Logf("read error: %v", err)
	want := fmt.Sprintf("message too large (limit %d bytes)", limit)
	waitFor(t, 20*time.Second, "session end recorded", func() (bool, string) {
		rows := f.sessions(src.ID)
		return len(rows) > 0 && rows[0].Ended && strings.Contains(rows[0].EndReason, want), fmt.Sprintf("%+v", rows)
	})
	hl := f.waitHealth(src.ID, "health shows the bound", func(h ledger.SourceHealth) bool {
		return strings.Contains(h.LastError, want)
	})
	t.Logf("health: %s %q", hl.State, hl.LastError)
	if hl.State != ledger.HealthBackoff && hl.State != ledger.HealthConnecting && hl.State != ledger.HealthLive {
		t.Errorf("health state %s after a too-long line", hl.State)
	}
}

// craftedSSEServer is a minimal streamable-HTTP MCP server (sessionless, no standalone
// stream) that answers initialize and ping with JSON and resources/read with the SSE stream
// stream(id) returns, on a free loopback port.
func craftedSSEServer(t *testing.T, stream func(id string) string) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := string(msg.ID)
		switch {
		case id == "":
			w.WriteHeader(http.StatusAccepted)
		case msg.Method == "initialize":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"resources":{}},"serverInfo":{"name":"crafted","version":"1"}}}`, id, mcphost.ProtocolVersion)
		case msg.Method == "resources/read":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, stream(id))
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, id)
		}
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// Where in an SSE event the bound falls does not matter: the cut-off event is closed so that
// the go-sdk ignores it, the call fails with MessageTooLarge and the session lives on (a
// ping succeeds). Events each within the bound are never cut, however many there are: the
// count restarts at each blank line.
func TestSSEEventCutAnywhereKeepsSession(t *testing.T) {
	limit := int(mcphost.MessageLimit(limitMaxBytes))
	response := func(id, text string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"result":{"contents":[{"uri":"demo://x","text":"` + text + `"}]}}`
	}
	notification := func(pad int) string {
		return "event: message\ndata: " + `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + strings.Repeat("p", pad) + `"}}` + "\n\n"
	}
	tests := []struct {
		name     string
		stream   func(id string) string
		tooLarge bool
	}{
		{"inside a data line", func(id string) string {
			return "event: message\ndata: " + response(id, strings.Repeat("a", 2*limit)) + "\n\n"
		}, true},
		{"inside a field name, before its colon", func(id string) string {
			return "id: 7\n" + strings.Repeat("x", 2*limit) + ": v\n\n" + "data: " + response(id, "late") + "\n\n"
		}, true},
		{"at the start of a line", func(id string) string {
			first := "data: " + strings.Repeat("d", limit-7) + "\n" // exactly the bound
			return first + "data: more\n\n" + "data: " + response(id, "late") + "\n\n"
		}, true},
		{"after a notification within the bound", func(id string) string {
			return notification(limit/2) + "event: message\ndata: " + response(id, strings.Repeat("a", 2*limit)) + "\n\n"
		}, true},
		{"events each within the bound, together over it", func(id string) string {
			return notification(limit/2) + notification(limit/2) + notification(limit/2) +
				"event: message\ndata: " + response(id, "fine") + "\n\n"
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := ledger.Source{SourceSpec: ledger.SourceSpec{Name: "crafted", Transport: ledger.TransportHTTP,
				URL: craftedSSEServer(t, tt.stream), Connection: ledger.Connection{MaxBytes: limitMaxBytes}}}
			tr, err := mcphost.DefaultTransport(t.Context(), src)
			if err != nil {
				t.Fatal(err)
			}
			cs, err := connectSource(t, tr)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			before := mcphost.BodyBytes(tr)
			res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://x"})
			read := mcphost.BodyBytes(tr) - before
			if tt.tooLarge {
				if got, ok := mcphost.MessageTooLarge(err); !ok || got != int64(limit) {
					t.Fatalf("read: %.300v, want MessageTooLarge with the bound %d", err, limit)
				}
				if read > int64(limit)+1+int64(limit/2)+4096 {
					t.Errorf("read %d bytes of the stream, bound %d", read, limit)
				}
			} else if err != nil || res.Contents[0].Text != "fine" {
				t.Fatalf("read of events within the bound: %.300v", err)
			}
			if err := cs.Ping(ctx, nil); err != nil {
				t.Errorf("session after the read: %v", err)
			}
		})
	}
}

// The stdio bound counts the bytes of each line, its newline excluded, exactly; the count
// restarts after each newline, and a line over it fails the stream for good.
func TestStdioLineBoundIsExact(t *testing.T) {
	tests := []struct {
		name, in string
		limit    int64
		want     string // what is delivered
		tooLarge bool
	}{
		{"a line of exactly the bound", "abcd\nef\n", 4, "abcd\nef\n", false},
		{"one byte over", "abcd\nabcde\nx\n", 4, "abcd\nabcd", true},
		{"short lines together over the bound", strings.Repeat("ab\n", 100), 2, strings.Repeat("ab\n", 100), false},
		{"an unterminated last line within the bound", "ab\nabcd", 4, "ab\nabcd", false},
		{"an unterminated last line over the bound", "ab\nabcde", 4, "ab\nabcd", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One byte at a time and all at once.
			for _, r := range []io.Reader{iotest.OneByteReader(strings.NewReader(tt.in)), strings.NewReader(tt.in)} {
				got, err := io.ReadAll(mcphost.NewLineLimitReader(r, tt.limit))
				if string(got) != tt.want {
					t.Errorf("delivered %q, want %q", got, tt.want)
				}
				var mt *mcphost.MessageTooLargeError
				if tt.tooLarge != errors.As(err, &mt) || (tt.tooLarge && mt.Limit != tt.limit) || (!tt.tooLarge && err != nil) {
					t.Errorf("error %v, want too large: %v", err, tt.tooLarge)
				}
			}
		})
	}
}
