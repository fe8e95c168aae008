package mcpgoserver_test

import (
	"context"
	"fmt"
	"io"
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
	deadline := time.Now().Add(wait)
	for len(s.Watching()) > 0 || s.LiveListenStreams() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still watching %v with %d streams after the drop", s.Watching(), s.LiveListenStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
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
