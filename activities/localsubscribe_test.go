package activities_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// gatedSubscribes is an MCP server's resources/subscribe handler that counts the calls per
// URI, refuses refusedURI as invalid params, and holds a call while hold is set until it is
// released.
type gatedSubscribes struct {
	mu      sync.Mutex
	calls   map[string]int
	hold    chan struct{} // non-nil: the next calls wait for it to be closed
	entered chan struct{} // signalled once per held call that entered
}

const refusedURI = "demo://refused"

func (g *gatedSubscribes) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	g.mu.Lock()
	g.calls[req.Params.URI]++
	hold := g.hold
	g.mu.Unlock()
	if req.Params.URI == refusedURI {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no such subscription"}
	}
	if hold != nil {
		g.entered <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (g *gatedSubscribes) count(uri string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[uri]
}

// Issue 16 item 4, the subscribe fast path on a real session: on the process holding the
// session's generation it subscribes with the host's own call (the URI's first holder sends
// resources/subscribe, later holders send nothing); with no session here, or for another
// generation, it does nothing and leaves the subscribe to the host queue; a subscribe held past
// the handoff goes on, and MCPSubscribe of the same subscription joins it — one
// resources/subscribe in all; a refusal is the host's Permanent error.
func TestLocalSubscribe(t *testing.T) {
	const u1, u2 = "demo://notes/1", "demo://notes/2"
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	g := &gatedSubscribes{calls: map[string]int{}, entered: make(chan struct{}, 4)}
	srv := mcp.NewServer(&mcp.Implementation{Name: "gated", Version: "1.0.0"}, &mcp.ServerOptions{
		SubscribeHandler:   g.subscribe,
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	for _, u := range []string{u1, u2, refusedURI} {
		srv.AddResource(&mcp.Resource{URI: u, Name: u, MIMEType: "text/plain"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: u, MIMEType: "text/plain", Text: "v1"}}}, nil
		})
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	hosted := hostSource(ctx, t, store, ledger.SourceSpec{Name: "gated", Transport: ledger.TransportHTTP, URL: hs.URL}, false, "host-gated", zap.WarnLevel)
	src, h, gen := hosted.src, hosted.host, hosted.gen
	sess := &activities.Session{Host: h, Store: store}
	here := &activities.LocalSubscribe{Session: sess}
	elsewhere := &activities.LocalSubscribe{Session: &activities.Session{Store: store}}
	call := func(subID int64, uri string, gen int64) contract.SessionCall {
		return contract.SessionCall{SourceID: src.ID, SessionGeneration: gen, ServerURI: uri, SubscriptionID: subID}
	}
	// got is what a step came to: the fast path's answer, its error type, and the server's
	// resources/subscribe calls of the step's URI so far.
	type got struct {
		Out        contract.LocalSubscribeOutput
		ErrType    string
		Subscribes int
	}
	run := func(lr *activities.LocalSubscribe, in contract.SessionCall, handoff time.Duration) got {
		t.Helper()
		out, err := lr.LocalSubscribe(ctx, contract.LocalSubscribeInput{Call: in, Handoff: handoff})
		r := got{Out: out, Subscribes: g.count(in.ServerURI)}
		if err != nil {
			var app *temporal.ApplicationError
			r.ErrType = "untyped"
			if errors.As(err, &app) {
				r.ErrType = app.Type()
			}
		}
		return r
	}

	steps := []struct {
		name    string
		lr      *activities.LocalSubscribe
		in      contract.SessionCall
		handoff time.Duration
		want    got
	}{
		{"elsewhere: not here, nothing sent", elsewhere, call(1, u1, gen), time.Minute, got{}},
		{"another generation: not here, nothing sent", here, call(1, u1, gen+1), time.Minute, got{}},
		{"here: subscribed", here, call(1, u1, gen), time.Minute, got{Out: contract.LocalSubscribeOutput{Here: true}, Subscribes: 1}},
		{"here, the URI's second holder: nothing sent", here, call(2, u1, gen), time.Minute, got{Out: contract.LocalSubscribeOutput{Here: true}, Subscribes: 1}},
		{"here, refused: the host's Permanent error", here, call(3, refusedURI, gen), time.Minute, got{ErrType: contract.ErrTypePermanent, Subscribes: 1}},
	}
	for _, s := range steps {
		if diff := cmp.Diff(s.want, run(s.lr, s.in, s.handoff)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
	}

	// Held past the handoff: handed off, the subscribe goes on here, and MCPSubscribe of the
	// same subscription (the workflow's fallback) joins it once it answers.
	hold := make(chan struct{})
	g.mu.Lock()
	g.hold = hold
	g.mu.Unlock()
	if diff := cmp.Diff(got{Out: contract.LocalSubscribeOutput{Here: true, HandedOff: true}, Subscribes: 1},
		run(here, call(4, u2, gen), 50*time.Millisecond)); diff != "" {
		t.Errorf("held past the handoff (-want +got):\n%s", diff)
	}
	<-g.entered
	joined := make(chan error, 1)
	go func() {
		_, err := sess.MCPSubscribe(ctx, call(4, u2, gen))
		joined <- err
	}()
	close(hold)
	if err := <-joined; err != nil {
		t.Fatalf("MCPSubscribe joining the handed-off subscribe: %v", err)
	}
	if n := g.count(u2); n != 1 {
		t.Errorf("%d resources/subscribe calls of %s after the join, want 1", n, u2)
	}
}

// Issue 16 item 4 on a 2026-07-28 session: the fast path subscribes through the session's
// listen set like MCPSubscribe, and reports a URI the listen acknowledgement left out as
// NotAcknowledged (the subscription then polls, R11).
func TestLocalSubscribeNotAcknowledged(t *testing.T) {
	const watched, left = "demo://notes/1", "demo://notes/2"
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	srv := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { srv.Close() })
	srv.Set(watched, "v1", "text/plain")
	srv.Set(left, "v1", "text/plain")
	srv.SetListenFaults(chaosmcp.ListenFaults{AckOnly: []string{watched}})
	hs, err := srv.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	src, _, err := store.AddSource(ctx, ledger.SourceSpec{Name: "modern", Transport: ledger.TransportHTTP, URL: hs.URL,
		Connection: ledger.Connection{Protocol: ledger.ProtocolModern}})
	if err != nil {
		t.Fatal(err)
	}
	h := runHost(ctx, t, store, "host-modern", zap.WarnLevel)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	c, err := h.WaitSession(wctx, src.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	here := &activities.LocalSubscribe{Session: &activities.Session{Host: h, Store: store}}
	var got []contract.LocalSubscribeOutput
	for i, u := range []string{watched, left} {
		out, err := here.LocalSubscribe(ctx, contract.LocalSubscribeInput{Handoff: 20 * time.Second,
			Call: contract.SessionCall{SourceID: src.ID, SessionGeneration: c.Generation(), ServerURI: u, SubscriptionID: int64(i + 1)}})
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		got = append(got, out)
	}
	want := []contract.LocalSubscribeOutput{
		{Here: true},
		{Here: true, Subscribe: contract.SubscribeOutput{NotAcknowledged: true}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
