package mcphost_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// TestListenWiring drives the host's subscriptions/listen use on a 2026-07-28 session over
// streamable HTTP (issue 13 items 2–4), against a both-era server reached with --protocol auto:
// an acknowledged URI is watched and its updates are routed; a URI the acknowledgement leaves
// out is NotAcknowledged (it polls); a stream cut without its complete result tells the
// subscriptions it carried of a new epoch (SessionChanged with ListenEpoch on the same
// generation) and a subscribe then waits for the re-opened stream's acknowledgement; an ack
// never sent is a failed subscribe; a notification with a stale subscription ID is audited
// NOTIFICATION_OLD_SESSION.
func TestListenWiring(t *testing.T) {
	f := newFixture(t)
	s, hs := f.chaosHTTPBothEras(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	for _, u := range []string{"demo://a", "demo://b", "demo://c"} {
		s.Set(u, "v1", "text/plain")
	}
	src := f.addSource(ledger.SourceSpec{Name: "listen", Transport: ledger.TransportHTTP, URL: hs.URL})
	rec := newRecorder()
	h := f.startHost("host-listen", mcphost.Options{ListenAckTimeout: time.Second}, rec)
	c := f.waitSession(h, src.ID, 0)
	gen := c.Generation()
	if got := c.Caps().ProtocolVersion; got != ledger.ProtocolModern {
		t.Fatalf("auto negotiated %s with a both-era server, want %s", got, ledger.ProtocolModern)
	}
	subA := f.activeSub(src.ID, "demo://a", gen)
	subB := f.activeSub(src.ID, "demo://b", gen)

	s.SetListenFaults(chaosmcp.ListenFaults{AckOnly: []string{"demo://a"}})
	for _, tt := range []struct {
		uri  string
		id   int64
		want mcphost.WatchResult
	}{
		{"demo://a", subA.ID, mcphost.WatchResult{}},
		{"demo://b", subB.ID, mcphost.WatchResult{NotAcknowledged: true}},
	} {
		got, err := c.Watch(f.ctx, tt.uri, tt.id)
		if err != nil {
			t.Fatalf("Watch %s: %v", tt.uri, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("Watch %s (-want +got):\n%s", tt.uri, diff)
		}
	}
	s.SetListenFaults(chaosmcp.ListenFaults{})

	// An update of the watched URI is routed.
	s.Set("demo://a", "v2", "text/plain")
	rec.wait(t, "the update of demo://a routed", func(sigs []signal) bool {
		for _, u := range updates(sigs) {
			if u.WorkflowID == subA.WorkflowID {
				return true
			}
		}
		return false
	})

	// The stream is cut: a new epoch for the subscription it carried, on the same generation.
	if n := s.DropListenStreams(); n == 0 {
		t.Fatal("no listen stream to drop")
	}
	rec.wait(t, "the epoch signalled to demo://a's subscription", func(sigs []signal) bool {
		for _, sg := range sigs {
			if sc, ok := sg.Arg.(contract.SessionChanged); ok && sg.WorkflowID == subA.WorkflowID {
				return sc.Generation == gen && sc.ListenEpoch >= 1
			}
		}
		return false
	})
	for _, sg := range rec.all() {
		if sc, ok := sg.Arg.(contract.SessionChanged); ok && sg.WorkflowID != subA.WorkflowID {
			t.Errorf("epoch told to %s (%+v): only demo://a's stream was cut", sg.WorkflowID, sc)
		}
	}
	// Subscribing again waits for the re-opened stream, which acknowledges demo://a.
	if got, err := c.Watch(f.ctx, "demo://a", subA.ID); err != nil || got.NotAcknowledged {
		t.Errorf("Watch after the epoch = %+v, %v; want acknowledged", got, err)
	}

	// No acknowledgement within the ack timeout: a failed subscribe.
	s.SetListenFaults(chaosmcp.ListenFaults{WithholdAck: true})
	subC := f.activeSub(src.ID, "demo://c", gen)
	if _, err := c.Watch(f.ctx, "demo://c", subC.ID); !errors.Is(err, mcphost.ErrAckTimeout) {
		t.Errorf("Watch with the ack withheld: %v, want ErrAckTimeout", err)
	}

	// A notification carrying a subscription ID of no current stream is audited, not routed.
	s.SetListenFaults(chaosmcp.ListenFaults{StaleSubscriptionID: true})
	s.Set("demo://a", "v3", "text/plain")
	waitFor(t, 20*time.Second, "a NOTIFICATION_OLD_SESSION audit", func() (bool, string) {
		got := f.audits(src.ID)
		for _, a := range got {
			if a.Kind == mcpsync.ReceiptNotificationOld && a.ServerURI == "demo://a" && a.Gen == gen {
				return true, ""
			}
		}
		return false, "audits: " + cmp.Diff(nil, got)
	})
}

// TestModernKeepAliveOverHTTP: the host keeps pinging a 2026-07-28 session over stateless
// HTTP, and a healthy server's answers (a -32601 for a ping it does not serve included) keep
// the session open: it is never ended by its own keep-alive.
func TestModernKeepAliveOverHTTP(t *testing.T) {
	f := newFixture(t)
	s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { _ = s.Close() })
	var pings atomic.Int64
	inner := s.BothErasHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"method":"ping"`)) {
			inner.ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(w, r)
		pings.Add(1)
	}))
	t.Cleanup(srv.Close)
	src := f.addSource(ledger.SourceSpec{Name: "keepalive", Transport: ledger.TransportHTTP, URL: srv.URL})
	h := f.startHost("host-keepalive", mcphost.Options{KeepAlive: 50 * time.Millisecond}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
	if got := c.Caps().ProtocolVersion; got != ledger.ProtocolModern {
		t.Fatalf("negotiated %s, want %s", got, ledger.ProtocolModern)
	}
	waitFor(t, 20*time.Second, "6 keep-alive pings", func() (bool, string) {
		return pings.Load() >= 6, fmt.Sprintf("%d pings", pings.Load())
	})
	rows := f.sessions(src.ID)
	if len(rows) != 1 || rows[0].Ended {
		t.Errorf("sessions %+v, want the first one, still open", rows)
	}
}

// TestHostCarriesEmptyCursors: on a 2026-07-28 session the host's transports carry an empty
// nextCursor through the go-sdk as a cursor (issue 13 item 7: "" is valid there, not the end),
// so a listing through the host's session sees every page, over HTTP and in memory.
func TestHostCarriesEmptyCursors(t *testing.T) {
	for _, overHTTP := range []bool{true, false} {
		t.Run(map[bool]string{true: "http", false: "in-memory"}[overHTTP], func(t *testing.T) {
			f := newFixture(t)
			s := chaosmcp.New(chaosmcp.Options{PageSize: 2, ProtocolVersions: chaosmcp.AllProtocolVersions})
			t.Cleanup(func() { _ = s.Close() })
			for i := range 7 {
				s.Set(fmt.Sprintf("demo://r/%d", i), "x", "text/plain")
			}
			s.SetEmptyCursorAtPage(2)
			spec := ledger.SourceSpec{Name: "cursor", Transport: ledger.TransportStdio, Command: []string{"unused"}}
			opts := mcphost.Options{}
			if overHTTP {
				hs, err := s.StartHTTPBothEras("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = hs.Close() })
				spec = ledger.SourceSpec{Name: "cursor", Transport: ledger.TransportHTTP, URL: hs.URL}
			} else {
				opts.Transport = func(ctx context.Context, _ ledger.Source) (mcp.Transport, error) { return s.InMemoryTransport(ctx) }
			}
			src := f.addSource(spec)
			c := f.waitSession(f.startHost("host-cursor", opts, newRecorder()), src.ID, 0)
			if got := c.Caps().ProtocolVersion; got != ledger.ProtocolModern {
				t.Fatalf("negotiated %s, want %s", got, ledger.ProtocolModern)
			}
			var uris []string
			cursor := ""
			for page := 0; page < 10; page++ {
				res, err := c.Session().ListResources(f.ctx, &mcp.ListResourcesParams{Cursor: cursor})
				if err != nil {
					t.Fatalf("page %d: %v", page+1, err)
				}
				for _, r := range res.Resources {
					uris = append(uris, r.URI)
				}
				if res.NextCursor == "" {
					break
				}
				cursor = res.NextCursor
			}
			if len(uris) != 7 {
				t.Errorf("listed %d resources %v, want all 7", len(uris), uris)
			}
		})
	}
}

// TestListenRefusedURIFailsAlone: a server that refuses one URI of a listen refuses the whole
// listen; the host then retries each URI on its own stream, so only the refused URI is a
// failed subscribe and the others of its batch are watched.
func TestListenRefusedURIFailsAlone(t *testing.T) {
	f := newFixture(t)
	s, hs := f.chaosHTTPBothEras(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	uris := []string{"demo://good/1", "demo://bad", "demo://good/2"}
	for _, u := range uris {
		s.Set(u, "v1", "text/plain")
	}
	s.SetListenFaults(chaosmcp.ListenFaults{Refuse: []string{"demo://bad"}})
	src := f.addSource(ledger.SourceSpec{Name: "refuse", Transport: ledger.TransportHTTP, URL: hs.URL})
	c := f.waitSession(f.startHost("host-refuse", mcphost.Options{ListenAckTimeout: 5 * time.Second}, newRecorder()), src.ID, 0)
	// Asked for together, the three share one listen (the set coalesces them).
	errs := make([]error, len(uris))
	var wg sync.WaitGroup
	for i, u := range uris {
		wg.Go(func() { _, errs[i] = c.Watch(f.ctx, u, int64(i+1)) })
	}
	wg.Wait()
	got := map[string]bool{}
	for i, u := range uris {
		got[u] = errs[i] == nil
	}
	want := map[string]bool{"demo://good/1": true, "demo://bad": false, "demo://good/2": true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("watched (-want +got):\n%s\nerrors: %v", diff, errs)
	}
}
