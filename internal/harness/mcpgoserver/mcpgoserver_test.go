package mcpgoserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/mcpgoserver"
)

const wait = 20 * time.Second

// observer is a go-sdk client's view: acknowledgements and updated notifications.
type observer struct {
	acks    chan []string
	updates chan string
	ids     chan any
}

func newClient() (*observer, *mcp.Client) {
	o := &observer{acks: make(chan []string, 16), updates: make(chan string, 16), ids: make(chan any, 16)}
	c := mcp.NewClient(&mcp.Implementation{Name: "interop", Version: "0"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			o.ids <- req.Params.Meta[mcp.MetaKeySubscriptionID]
			o.updates <- req.Params.URI
		},
	})
	c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok && method == "notifications/subscriptions/acknowledged" {
				o.acks <- append([]string{}, p.Notifications.ResourceSubscriptions...)
			}
			return next(ctx, method, req)
		}
	})
	return o, c
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("no %s within %v", what, wait)
		var zero T
		return zero
	}
}

// TestGoSDKClientInterop: a go-sdk v1.8.0 client negotiates 2026-07-28 with the mcp-go
// server over stdio and over streamable HTTP, subscribes by subscriptions/listen, gets the
// acknowledgement listing the URI and then an updated notification (with the listen's
// subscription ID) for a change made through the mutation API, and reads the new content.
func TestGoSDKClientInterop(t *testing.T) {
	transports := map[string]func(t *testing.T, s *mcpgoserver.Server) mcp.Transport{
		"stdio": func(t *testing.T, s *mcpgoserver.Server) mcp.Transport {
			cr, sw := io.Pipe() // server → client
			sr, cw := io.Pipe() // client → server
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = s.ServeStdio(ctx, sr, sw)
			}()
			t.Cleanup(func() { cancel(); _ = cw.Close(); _ = sw.Close(); <-done })
			return &mcp.IOTransport{Reader: cr, Writer: cw}
		},
		"http": func(t *testing.T, s *mcpgoserver.Server) mcp.Transport {
			hs := httptest.NewServer(s.HTTPHandler())
			t.Cleanup(hs.Close)
			return &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}
		},
		"stdio relayed to a listener": func(t *testing.T, s *mcpgoserver.Server) mcp.Transport {
			addr := serveListener(t, s)
			cr, rw := io.Pipe() // relay → client
			rr, cw := io.Pipe() // client → relay
			done := make(chan error, 1)
			go func() { done <- mcpgoserver.Relay(addr, rr, rw); _ = rw.Close() }()
			t.Cleanup(func() {
				_ = cw.Close()
				// The client closed its reader first: the relay's last writes may find it closed.
				if err := <-done; err != nil && !errors.Is(err, io.ErrClosedPipe) {
					t.Errorf("relay: %v", err)
				}
			})
			return &mcp.IOTransport{Reader: cr, Writer: cw}
		},
	}
	for name, mk := range transports {
		t.Run(name, func(t *testing.T) {
			s := mcpgoserver.New("mcpgo-" + name)
			s.Set("demo://a", "v1")
			o, c := newClient()
			ctx, cancel := context.WithTimeout(t.Context(), 2*wait)
			defer cancel()
			cs, err := c.Connect(ctx, mk(t, s), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got := cs.InitializeResult().ProtocolVersion; got != "2026-07-28" {
				t.Fatalf("negotiated %s, want 2026-07-28", got)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://a"}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"demo://a"}, recv(t, o.acks, "acknowledgement")); diff != "" {
				t.Fatalf("acknowledged (-want +got):\n%s", diff)
			}
			s.Set("demo://a", "v2")
			if got := recv(t, o.updates, "updated notification"); got != "demo://a" {
				t.Fatalf("updated %q", got)
			}
			if id := recv(t, o.ids, "subscription ID"); id == nil {
				t.Error("the updated notification carries no subscription ID")
			}
			res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://a"})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Contents[0].Text; got != "v2" {
				t.Errorf("read %q, want v2", got)
			}
		})
	}
}

// TestDropListenStreams: the drop knob cuts the HTTP listen stream without its complete
// result; the server stops watching and later updates reach nobody.
func TestDropListenStreams(t *testing.T) {
	s := mcpgoserver.New("mcpgo-drop")
	s.Set("demo://a", "v1")
	hs := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(hs.Close)
	o, c := newClient()
	ctx, cancel := context.WithTimeout(t.Context(), 2*wait)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://a"}); err != nil {
		t.Fatal(err)
	}
	recv(t, o.acks, "acknowledgement")
	if n := s.DropListenStreams(); n != 1 {
		t.Fatalf("dropped %d listen streams, want 1", n)
	}
	eventually(t, "nothing watched and no stream left after the drop", func() bool {
		return len(s.Watching()) == 0 && s.LiveListenStreams() == 0
	})
	before := s.Stats().UpdatesSent
	s.Set("demo://a", "v2")
	if got := s.Stats().UpdatesSent; got != before {
		t.Errorf("%d updates sent after the drop, want none", got-before)
	}
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Contents[0].Text; got != "v2" {
		t.Errorf("read %q after the drop, want v2 %s", got, fmt.Sprint(s.Stats().Reads))
	}
}

// serveListener serves s's stdio on a free 127.0.0.1 port until the test ends.
func serveListener(t *testing.T, s *mcpgoserver.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeListener(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawConn speaks newline-delimited JSON-RPC to a ServeListener, as a stdio client would.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &rawConn{t: t, conn: conn, r: bufio.NewReader(conn)}
}

// listen sends a 2026-07-28 subscriptions/listen with JSON-RPC ID id for uris.
func (c *rawConn) listen(id int, uris ...string) {
	c.t.Helper()
	msg := map[string]any{"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": map[string]any{
		"_meta": map[string]any{
			"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
			"io.modelcontextprotocol/clientCapabilities": map[string]any{},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw", "version": "0"},
		},
		"notifications": map[string]any{"resourceSubscriptions": uris},
	}}
	b, err := json.Marshal(msg)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
}

// rawMessage is the part of a JSON-RPC message the raw tests compare.
type rawMessage struct {
	ID     any    `json:"id,omitempty"`
	Method string `json:"method,omitempty"`
	Params *struct {
		Meta          map[string]any `json:"_meta,omitempty"`
		URI           string         `json:"uri,omitempty"`
		Notifications *struct {
			ResourceSubscriptions []string `json:"resourceSubscriptions"`
		} `json:"notifications,omitempty"`
	} `json:"params,omitempty"`
	Result map[string]any `json:"result,omitempty"`
	Error  map[string]any `json:"error,omitempty"`
}

// next reads the next message.
func (c *rawConn) next() rawMessage {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		c.t.Fatalf("reading the next message: %v", err)
	}
	var m rawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		c.t.Fatalf("message %s: %v", line, err)
	}
	return m
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEndListenStreams: over stdio (through ServeListener, read raw off the wire) the listen
// is acknowledged with its subscription ID, an update reaches it tagged with that ID, and
// EndListenStreams makes mcp-go answer the listen with its result (the stream's graceful end);
// the server then watches nothing and later updates reach nobody.
func TestEndListenStreams(t *testing.T) {
	s := mcpgoserver.New("mcpgo-end")
	s.Set("demo://a", "v1")
	c := dialRaw(t, serveListener(t, s))
	c.listen(7, "demo://a")
	ack := c.next()
	if ack.Method != "notifications/subscriptions/acknowledged" || ack.Params == nil || ack.Params.Notifications == nil ||
		fmt.Sprint(ack.Params.Meta["io.modelcontextprotocol/subscriptionId"]) != "7" {
		t.Fatalf("first message %+v, want the acknowledgement of listen 7", ack)
	}
	if diff := cmp.Diff([]string{"demo://a"}, ack.Params.Notifications.ResourceSubscriptions); diff != "" {
		t.Fatalf("acknowledged (-want +got):\n%s", diff)
	}
	s.Set("demo://a", "v2")
	if up := c.next(); up.Method != "notifications/resources/updated" || up.Params.URI != "demo://a" ||
		fmt.Sprint(up.Params.Meta["io.modelcontextprotocol/subscriptionId"]) != "7" {
		t.Fatalf("after the change: %+v, want an updated notification of listen 7", up)
	}
	if n := s.EndListenStreams(); n != 1 {
		t.Fatalf("ended %d listens, want 1", n)
	}
	end := c.next()
	if fmt.Sprint(end.ID) != "7" || end.Result == nil || end.Error != nil {
		t.Fatalf("after EndListenStreams: %+v, want the result of listen 7", end)
	}
	t.Logf("listen 7 ended with the result %v", end.Result)
	eventually(t, "the server stops watching", func() bool { return len(s.Watching()) == 0 && s.LiveListens() == 0 })
	before := s.Stats().UpdatesSent
	s.Set("demo://a", "v3")
	if got := s.Stats().UpdatesSent; got != before {
		t.Errorf("%d updates sent after the listen ended", got-before)
	}
	if st := s.Stats(); st.ListensEnded != 1 || st.Listens != 1 || st.StdioConnections != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestHoldListens: a listen that arrives while listens are held subscribes nothing until the
// release, so a change made meanwhile is notified to nobody; after the release the first
// message of the stream is its acknowledgement, and later changes reach it.
func TestHoldListens(t *testing.T) {
	s := mcpgoserver.New("mcpgo-hold")
	s.Set("demo://a", "v1")
	c := dialRaw(t, serveListener(t, s))
	release := s.HoldListens()
	defer release()
	c.listen(3, "demo://a")
	eventually(t, "the listen is held", func() bool { return s.Stats().ListensHeld == 1 })
	s.Set("demo://a", "v2")
	if st := s.Stats(); st.UpdatesSent != 0 || len(s.Watching()) != 0 {
		t.Fatalf("while held: %d updates sent, watching %v", st.UpdatesSent, s.Watching())
	}
	release()
	if m := c.next(); m.Method != "notifications/subscriptions/acknowledged" {
		t.Fatalf("first message after the release %+v, want the acknowledgement", m)
	}
	s.Set("demo://a", "v3")
	if m := c.next(); m.Method != "notifications/resources/updated" || m.Params.URI != "demo://a" {
		t.Fatalf("after a change: %+v, want its updated notification", m)
	}
}

// TestRefuseSubscriptions: mcp-go refuses a whole listen that asks for a refused URI (an
// invalid-params error, no acknowledgement) and subscribes none of its URIs; a listen for the
// others alone is acknowledged.
func TestRefuseSubscriptions(t *testing.T) {
	s := mcpgoserver.New("mcpgo-refuse")
	s.Set("demo://a", "a")
	s.Set("demo://no", "no")
	s.RefuseSubscriptions("demo://no")
	c := dialRaw(t, serveListener(t, s))
	c.listen(1, "demo://a", "demo://no")
	if m := c.next(); fmt.Sprint(m.ID) != "1" || m.Error == nil || fmt.Sprint(m.Error["code"]) != "-32602" {
		t.Fatalf("listen asking for a refused URI answered %+v, want the invalid-params error of listen 1", m)
	}
	eventually(t, "the refused listen ends", func() bool { return s.LiveListens() == 0 })
	if got := s.Watching(); len(got) != 0 {
		t.Errorf("watching %v after a refused listen", got)
	}
	c.listen(2, "demo://a")
	if m := c.next(); m.Method != "notifications/subscriptions/acknowledged" {
		t.Fatalf("listen without the refused URI answered %+v, want its acknowledgement", m)
	}
	if diff := cmp.Diff([]string{"demo://a"}, s.Watching()); diff != "" {
		t.Errorf("watching (-want +got):\n%s", diff)
	}
}
