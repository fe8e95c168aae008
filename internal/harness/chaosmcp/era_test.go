package chaosmcp_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// modernClient records what a go-sdk client observes of the modern era: the acknowledgements
// (their resource subscriptions) and the updated notifications with their subscription IDs.
type modernClient struct {
	mu      sync.Mutex
	acks    [][]string
	ackCh   chan struct{}
	updates chan update
}

type update struct {
	URI, SubscriptionID string
}

func newModernClient() (*modernClient, *mcp.Client) {
	m := &modernClient{ackCh: make(chan struct{}, 100), updates: make(chan update, 100)}
	c := mcp.NewClient(&mcp.Implementation{Name: "era-test", Version: "0"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			id, _ := req.Params.Meta[mcp.MetaKeySubscriptionID]
			m.updates <- update{URI: req.Params.URI, SubscriptionID: toText(id)}
		},
		// No list_changed handler: the client opens no listen at connect, so every
		// acknowledgement it sees answers a Subscribe.
	})
	c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "notifications/subscriptions/acknowledged" {
				if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok {
					m.mu.Lock()
					m.acks = append(m.acks, append([]string{}, p.Notifications.ResourceSubscriptions...))
					m.mu.Unlock()
					m.ackCh <- struct{}{}
				}
			}
			return next(ctx, method, req)
		}
	})
	return m, c
}

func toText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		return time.Duration(x).String() // any stable rendering; only compared for equality
	}
	return "?"
}

// awaitAck returns the resource subscriptions of the next acknowledgement, or fails.
func (m *modernClient) awaitAck(t *testing.T) []string {
	t.Helper()
	select {
	case <-m.ackCh:
	case <-time.After(wait):
		t.Fatalf("no notifications/subscriptions/acknowledged within %v", wait)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.acks[len(m.acks)-1]
}

// noAck fails if an acknowledgement arrives before an updated notification does (the server
// sends the ack first, so an update proves the ack was withheld).
func (m *modernClient) nextUpdate(t *testing.T) update {
	t.Helper()
	select {
	case u := <-m.updates:
		return u
	case <-time.After(wait):
		t.Fatalf("no notifications/resources/updated within %v", wait)
		return update{}
	}
}

func (m *modernClient) ackCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.acks)
}

// TestBothErasOneServer: one server serves a legacy client (stateful, resources/subscribe,
// updates on the event stream) and a modern client (server/discover, subscriptions/listen)
// at once, over in-memory transports and over one HTTP endpoint.
func TestBothErasOneServer(t *testing.T) {
	for _, name := range []string{"in-memory", "http"} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
			s.Set("demo://a", "a1", "text/plain")
			var legacy *mcp.ClientSession
			legacyEvents, legacyOpts := newEvents()
			m, modern := newModernClient()
			var modernCS *mcp.ClientSession
			if name == "http" {
				hs, err := s.StartHTTPBothEras("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = hs.Close() })
				legacy, err = mcp.NewClient(&mcp.Implementation{Name: "legacy", Version: "0"}, legacyOpts).Connect(testCtx(t),
					&mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
				if err != nil {
					t.Fatal(err)
				}
				modernCS, err = modern.Connect(testCtx(t), &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, nil)
				if err != nil {
					t.Fatal(err)
				}
			} else {
				var err error
				legacy, err = s.ConnectInMemoryAt(testCtx(t), legacyOpts, chaosmcp.ProtocolVersion)
				if err != nil {
					t.Fatal(err)
				}
				modernCS, err = s.ConnectClientInMemory(testCtx(t), modern, "")
				if err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { _ = legacy.Close(); _ = modernCS.Close() })
			got := map[string]string{
				"legacy": legacy.InitializeResult().ProtocolVersion, "modern": modernCS.InitializeResult().ProtocolVersion,
			}
			want := map[string]string{"legacy": chaosmcp.ProtocolVersion, "modern": chaosmcp.ProtocolModern}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("negotiated versions (-want +got):\n%s", diff)
			}
			subscribe(t, legacy, "demo://a")
			if err := modernCS.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: "demo://a"}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"demo://a"}, m.awaitAck(t)); diff != "" {
				t.Fatalf("ack (-want +got):\n%s", diff)
			}
			s.Set("demo://a", "a2", "text/plain")
			if u := legacyEvents.nextUpdate(t); u != "demo://a" {
				t.Fatalf("legacy update %q", u)
			}
			if u := m.nextUpdate(t); u.URI != "demo://a" || u.SubscriptionID == "" {
				t.Fatalf("modern update %+v: want demo://a with a subscription ID", u)
			}
			for n, cs := range map[string]*mcp.ClientSession{"legacy": legacy, "modern": modernCS} {
				if got := readText(t, cs, "demo://a"); got != "a2" {
					t.Errorf("%s read %q, want a2", n, got)
				}
			}
		})
	}
}

// TestListenFaults: each modern-era knob, observed by a go-sdk 2026-07-28 client.
func TestListenFaults(t *testing.T) {
	tests := []struct {
		name   string
		faults chaosmcp.ListenFaults
		check  func(t *testing.T, s *chaosmcp.Server, m *modernClient, first update)
	}{
		{
			name:   "ack withheld",
			faults: chaosmcp.ListenFaults{WithholdAck: true},
			check: func(t *testing.T, s *chaosmcp.Server, m *modernClient, _ update) {
				if n := m.ackCount(); n != 0 {
					t.Errorf("%d acknowledgements arrived, want none", n)
				}
				if st := s.Stats(); st.AcksWithheld != 2 {
					t.Errorf("AcksWithheld = %d, want 2", st.AcksWithheld)
				}
			},
		},
		{
			name:   "partial ack",
			faults: chaosmcp.ListenFaults{AckOnly: []string{"demo://a"}},
			check: func(t *testing.T, s *chaosmcp.Server, m *modernClient, _ update) {
				m.mu.Lock()
				acks := append([][]string{}, m.acks...)
				m.mu.Unlock()
				got := map[string]bool{}
				for _, a := range acks {
					for _, u := range a {
						got[u] = true
					}
				}
				if diff := cmp.Diff(map[string]bool{"demo://a": true}, got); diff != "" {
					t.Errorf("acknowledged URIs (-want +got):\n%s", diff)
				}
				if st := s.Stats(); st.AcksPartial != 1 {
					t.Errorf("AcksPartial = %d, want 1", st.AcksPartial)
				}
			},
		},
		{
			name:   "stale subscription ID",
			faults: chaosmcp.ListenFaults{StaleSubscriptionID: true},
			check: func(t *testing.T, s *chaosmcp.Server, _ *modernClient, first update) {
				if len(first.SubscriptionID) < 6 || first.SubscriptionID[:6] != "stale-" {
					t.Errorf("subscription ID %q, want a stale one", first.SubscriptionID)
				}
				if st := s.Stats(); st.StaleSubscriptionIDs == 0 {
					t.Error("StaleSubscriptionIDs = 0")
				}
			},
		},
		{
			name: "no faults",
			check: func(t *testing.T, s *chaosmcp.Server, m *modernClient, first update) {
				if n := m.ackCount(); n != 2 {
					t.Errorf("%d acknowledgements, want 2", n)
				}
				if len(first.SubscriptionID) >= 6 && first.SubscriptionID[:6] == "stale-" {
					t.Errorf("subscription ID %q is stale without the knob", first.SubscriptionID)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
			s.Set("demo://a", "a1", "text/plain")
			s.Set("demo://b", "b1", "text/plain")
			s.SetListenFaults(tt.faults)
			m, c := newModernClient()
			cs, err := s.ConnectClientInMemory(testCtx(t), c, "")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			for _, u := range []string{"demo://a", "demo://b"} {
				if err := cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: u}); err != nil {
					t.Fatal(err)
				}
			}
			// The go-sdk's Subscribe returns before the server registered the listen: wait
			// for the server side (both URIs answer an update) before judging.
			waitListening(t, s, m, "demo://a", "demo://b")
			s.Set("demo://a", "a2", "text/plain")
			first := m.nextUpdate(t)
			tt.check(t, s, m, first)
		})
	}
}

// waitListening waits until updates of every uri reach the client (so every listen is
// registered), draining them.
func waitListening(t *testing.T, s *chaosmcp.Server, m *modernClient, uris ...string) {
	t.Helper()
	for _, u := range uris {
		deadline := time.Now().Add(wait)
		for {
			s.Set(u, "probe "+time.Now().String(), "text/plain")
			select {
			case got := <-m.updates:
				if got.URI == u {
					goto next
				}
				continue
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("listen for %s never registered", u)
			}
		}
	next:
	}
	for {
		select {
		case <-m.updates:
		case <-time.After(100 * time.Millisecond):
			return
		}
	}
}

// TestResultTTL: with SetResultCache the read and list results carry ttlMs, and a plain
// go-sdk 2026-07-28 client serves the second read from its cache (the server sees one read);
// a legacy client never caches.
func TestResultTTL(t *testing.T) {
	for _, tt := range []struct {
		version   string
		wantReads int
		wantText  string
	}{
		{version: "", wantReads: 1, wantText: "v1"},
		{version: chaosmcp.ProtocolVersion, wantReads: 2, wantText: "v2"},
	} {
		t.Run("client "+tt.version, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
			s.Set("demo://a", "v1", "text/plain")
			s.SetResultCache(60000, "public")
			cs, err := s.ConnectInMemoryAt(testCtx(t), nil, tt.version)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			res, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: "demo://a"})
			if err != nil {
				t.Fatal(err)
			}
			if tt.version == "" && res.TTLMs != 60000 {
				t.Fatalf("ttlMs = %d, want 60000", res.TTLMs)
			}
			s.DropUpdates(1)
			s.Set("demo://a", "v2", "text/plain") // changed without a notification
			if got := readText(t, cs, "demo://a"); got != tt.wantText {
				t.Errorf("second read %q, want %q", got, tt.wantText)
			}
			if got := s.Stats().Reads["demo://a"]; got != tt.wantReads {
				t.Errorf("server saw %d reads, want %d", got, tt.wantReads)
			}
		})
	}
}

// TestDropListenStreams: a cut listen stream ends without its complete result; the go-sdk
// client neither resumes it nor reports it, so later updates are lost to it.
func TestDropListenStreams(t *testing.T) {
	s := newServer(t, chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	s.Set("demo://a", "a1", "text/plain")
	hs, err := s.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hs.Close() })
	m, c := newModernClient()
	cs, err := c.Connect(testCtx(t), &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if err := cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: "demo://a"}); err != nil {
		t.Fatal(err)
	}
	m.awaitAck(t)
	waitListening(t, s, m, "demo://a")
	if n := s.DropListenStreams(); n == 0 {
		t.Fatal("no listen stream to drop")
	}
	waitFor(t, func() bool { return s.LiveListenStreams() == 0 })
	s.Set("demo://a", "a3", "text/plain")
	select {
	case u := <-m.updates:
		t.Fatalf("update %+v reached the client after its stream was dropped", u)
	case <-time.After(300 * time.Millisecond):
	}
	if st := s.Stats(); st.ListenStreamsDropped == 0 {
		t.Errorf("ListenStreamsDropped = 0")
	}
	// The endpoint still answers the client.
	if got := readText(t, cs, "demo://a"); got != "a3" {
		t.Errorf("read %q after the drop, want a3", got)
	}
	_ = http.StatusOK
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEmptyAndBareNotFound: the ReadEmpty fault answers no contents; NotFoundBare answers a
// bare -32602.
func TestEmptyAndBareNotFound(t *testing.T) {
	s := newServer(t, chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	s.Set("demo://a", "a1", "text/plain")
	s.AddReadFault(chaosmcp.ReadFault{URI: "demo://a", Nth: 1, Fail: chaosmcp.ReadEmpty})
	s.SetNotFoundStyle(chaosmcp.NotFoundBare)
	cs, err := s.ConnectInMemoryAt(testCtx(t), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	res, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: "demo://a"})
	if err != nil || len(res.Contents) != 0 {
		t.Fatalf("read under ReadEmpty: %d contents, %v; want 0 and no error", len(res.Contents), err)
	}
	_, err = cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: "demo://missing"})
	if je := rpcError(t, err); je.Code != -32602 || len(je.Data) != 0 {
		t.Fatalf("not found answered %d %q data %s, want bare -32602", je.Code, je.Message, je.Data)
	}
}

// TestStdioBothEras: a both-era server over stdio (a child process) serves a legacy client and
// a modern one, each on its own process: each negotiates its era, subscribes its way
// (resources/subscribe; subscriptions/listen, acknowledged) and gets the child's update.
func TestStdioBothEras(t *testing.T) {
	for _, tt := range []struct{ version, want string }{
		{version: chaosmcp.ProtocolVersion, want: chaosmcp.ProtocolVersion},
		{version: "", want: chaosmcp.ProtocolModern},
	} {
		t.Run(tt.want, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), stdioChildEnv+"=1", stdioErasEnv+"=all")
			cmd.Stderr = os.Stderr
			m, client := newModernClient()
			ctx := testCtx(t)
			cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: tt.version})
			if err != nil {
				t.Fatalf("connect to stdio child: %v", err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got := cs.InitializeResult().ProtocolVersion; got != tt.want {
				t.Fatalf("negotiated %s, want %s", got, tt.want)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://a"}); err != nil {
				t.Fatal(err)
			}
			if tt.want == chaosmcp.ProtocolModern {
				if diff := cmp.Diff([]string{"demo://a"}, m.awaitAck(t)); diff != "" {
					t.Errorf("ack (-want +got):\n%s", diff)
				}
			}
			if u := m.nextUpdate(t); u.URI != "demo://a" {
				t.Errorf("updated %+v", u)
			}
			if got := readText(t, cs, "demo://a"); got != "a2" {
				t.Errorf("read %q, want a2", got)
			}
		})
	}
}
