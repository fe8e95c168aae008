package mcphost_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/mcpgoserver"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

const listenWait = 20 * time.Second

// listenRig is one modern client session with a ListenSet, and what it observed.
type listenRig struct {
	ls          *mcphost.ListenSet
	cs          *mcp.ClientSession
	updates     chan string
	listChanged chan struct{}
	epochs      chan mcphost.ListenEpoch
	stale       chan [2]string
	states      chan stateNote
}

type stateNote struct {
	URI   string
	State mcphost.WatchState
}

// listenServer is a server a rig connects to: how to connect, how to change a resource, and
// how many HTTP listen streams it holds (-1: not counted, e.g. stdio).
type listenServer struct {
	connect func(t *testing.T, c *mcp.Client, ls *mcphost.ListenSet) *mcp.ClientSession
	set     func(uri, text string)
	live    func() int
	drop    func() int
}

func chaosListenServer(t *testing.T, transport string, uris ...string) (*chaosmcp.Server, listenServer) {
	t.Helper()
	s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { _ = s.Close() })
	for _, u := range uris {
		s.Set(u, "v0", "text/plain")
	}
	ls := listenServer{set: func(u, text string) { s.Set(u, text, "text/plain") }, live: s.LiveListenStreams, drop: s.DropListenStreams}
	switch transport {
	case "http":
		hs, err := s.StartHTTPBothEras("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hs.Close() })
		ls.connect = func(t *testing.T, c *mcp.Client, set *mcphost.ListenSet) *mcp.ClientSession {
			return connectModern(t, c, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1, HTTPClient: set.WrapHTTPClient(nil)})
		}
	case "memory":
		ls.live = func() int { return -1 }
		ls.connect = func(t *testing.T, c *mcp.Client, set *mcphost.ListenSet) *mcp.ClientSession {
			tr, err := s.InMemoryTransport(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return connectModern(t, c, set.WrapTransport(tr))
		}
	default:
		t.Fatalf("unknown transport %q", transport)
	}
	return s, ls
}

func mcpgoListenServer(t *testing.T, transport string, uris ...string) (*mcpgoserver.Server, listenServer) {
	t.Helper()
	s := mcpgoserver.New("mcpgo-listen")
	for _, u := range uris {
		s.Set(u, "v0")
	}
	ls := listenServer{set: s.Set, live: s.LiveListenStreams, drop: s.DropListenStreams}
	switch transport {
	case "http":
		hs := httptest.NewServer(s.HTTPHandler())
		t.Cleanup(hs.Close)
		ls.connect = func(t *testing.T, c *mcp.Client, set *mcphost.ListenSet) *mcp.ClientSession {
			return connectModern(t, c, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1, HTTPClient: set.WrapHTTPClient(nil)})
		}
	case "stdio":
		ls.live = func() int { return -1 }
		ls.connect = func(t *testing.T, c *mcp.Client, set *mcphost.ListenSet) *mcp.ClientSession {
			cr, sw := io.Pipe() // server → client
			sr, cw := io.Pipe() // client → server
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = s.ServeStdio(ctx, sr, sw)
			}()
			t.Cleanup(func() { cancel(); _ = cw.Close(); _ = sw.Close(); <-done })
			return connectModern(t, c, set.WrapTransport(&mcp.IOTransport{Reader: cr, Writer: cw}))
		}
	default:
		t.Fatalf("unknown transport %q", transport)
	}
	return s, ls
}

func connectModern(t *testing.T, c *mcp.Client, tr mcp.Transport) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), listenWait)
	defer cancel()
	cs, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: mcphost.ProtocolModern})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != mcphost.ProtocolModern {
		t.Fatalf("negotiated %s, want %s", got, mcphost.ProtocolModern)
	}
	return cs
}

// newListenRig connects a client with a ListenSet configured by opts to srv. With
// listChanged the client has a list-changed handler, so the go-sdk opens its own control
// listen at connect (which the ListenSet adopts).
func newListenRig(t *testing.T, srv listenServer, opts mcphost.ListenOptions, listChanged bool) *listenRig {
	t.Helper()
	r := &listenRig{updates: make(chan string, 4096), listChanged: make(chan struct{}, 64),
		epochs: make(chan mcphost.ListenEpoch, 4096), stale: make(chan [2]string, 4096), states: make(chan stateNote, 4096)}
	opts.OnEpoch = func(e mcphost.ListenEpoch) { r.epochs <- e }
	opts.OnStale = func(uri, id string) { r.stale <- [2]string{uri, id} }
	opts.OnState = func(uri string, st mcphost.WatchState, _ error) { r.states <- stateNote{uri, st} }
	r.ls = mcphost.NewListenSet(opts)
	copts := &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			r.updates <- req.Params.URI
		},
	}
	if listChanged {
		copts.ResourceListChangedHandler = func(context.Context, *mcp.ResourceListChangedRequest) { r.listChanged <- struct{}{} }
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "listen-test", Version: "0"}, copts)
	r.ls.Install(c)
	r.cs = srv.connect(t, c, r.ls)
	r.ls.Bind(r.cs)
	t.Cleanup(r.ls.Close)
	return r
}

func (r *listenRig) watch(t *testing.T, uris ...string) map[string]mcphost.WatchState {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), listenWait)
	defer cancel()
	got, err := r.ls.Watch(ctx, uris)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	return got
}

func recvListen[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(listenWait):
		t.Fatalf("no %s within %v", what, listenWait)
		var zero T
		return zero
	}
}

// nextUpdate returns the next routed update of uri, skipping others.
func (r *listenRig) nextUpdate(t *testing.T, uri string) {
	t.Helper()
	deadline := time.After(listenWait)
	for {
		select {
		case u := <-r.updates:
			if u == uri {
				return
			}
		case <-deadline:
			t.Fatalf("no routed update of %s within %v", uri, listenWait)
		}
	}
}

func all(st mcphost.WatchState, uris ...string) map[string]mcphost.WatchState {
	m := map[string]mcphost.WatchState{}
	for _, u := range uris {
		m[u] = st
	}
	return m
}

func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(listenWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, listenWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type listenCase struct {
	name string
	mk   func(t *testing.T, uris ...string) listenServer
}

var listenServers = []listenCase{
	{"chaos-http", func(t *testing.T, uris ...string) listenServer {
		_, s := chaosListenServer(t, "http", uris...)
		return s
	}},
	{"chaos-memory", func(t *testing.T, uris ...string) listenServer {
		_, s := chaosListenServer(t, "memory", uris...)
		return s
	}},
	{"mcpgo-http", func(t *testing.T, uris ...string) listenServer {
		_, s := mcpgoListenServer(t, "http", uris...)
		return s
	}},
	{"mcpgo-stdio", func(t *testing.T, uris ...string) listenServer {
		_, s := mcpgoListenServer(t, "stdio", uris...)
		return s
	}},
}

// TestListenBatchAcknowledged: five URIs watched together with BatchSize 2 ride on three
// listen streams (not five), every URI is acknowledged, and an update of each is routed.
func TestListenBatchAcknowledged(t *testing.T) {
	uris := []string{"demo://a", "demo://b", "demo://c", "demo://d", "demo://e"}
	for _, tc := range listenServers {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.mk(t, uris...)
			r := newListenRig(t, srv, mcphost.ListenOptions{BatchSize: 2}, false)
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, uris...), r.watch(t, uris...)); diff != "" {
				t.Fatalf("Watch (-want +got):\n%s", diff)
			}
			if n := r.ls.Streams(); n != 3 {
				t.Errorf("ListenSet holds %d streams, want 3", n)
			}
			if srv.live() >= 0 {
				awaitCond(t, "3 HTTP listen streams on the server", func() bool { return srv.live() == 3 })
			}
			for _, u := range uris {
				srv.set(u, "v1")
				r.nextUpdate(t, u)
			}
		})
	}
}

// TestListenPartialAck: the server acknowledges only demo://a of a batch: demo://b is
// reported not acknowledged (the caller polls it, R11), demo://a is watched.
func TestListenPartialAck(t *testing.T) {
	for _, transport := range []string{"http", "memory"} {
		t.Run(transport, func(t *testing.T) {
			s, srv := chaosListenServer(t, transport, "demo://a", "demo://b")
			s.SetListenFaults(chaosmcp.ListenFaults{AckOnly: []string{"demo://a"}})
			r := newListenRig(t, srv, mcphost.ListenOptions{}, false)
			want := map[string]mcphost.WatchState{"demo://a": mcphost.WatchAcknowledged, "demo://b": mcphost.WatchNotAcknowledged}
			if diff := cmp.Diff(want, r.watch(t, "demo://a", "demo://b")); diff != "" {
				t.Fatalf("Watch (-want +got):\n%s", diff)
			}
			if st, _ := r.ls.State("demo://b"); st != mcphost.WatchNotAcknowledged {
				t.Errorf("State(demo://b) = %v", st)
			}
		})
	}
}

// TestListenServerWithoutSubscribe: a server that does not declare resources.subscribe
// acknowledges the listen with no URIs: each is not acknowledged (it polls), and the stream,
// watching nothing, is cancelled rather than re-listened.
func TestListenServerWithoutSubscribe(t *testing.T) {
	s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions,
		Capabilities: &chaosmcp.Capabilities{Subscribe: false, ListChanged: true}})
	t.Cleanup(func() { _ = s.Close() })
	s.Set("demo://a", "v0", "text/plain")
	hs, err := s.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hs.Close() })
	srv := listenServer{live: s.LiveListenStreams, connect: func(t *testing.T, c *mcp.Client, set *mcphost.ListenSet) *mcp.ClientSession {
		return connectModern(t, c, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1, HTTPClient: set.WrapHTTPClient(nil)})
	}}
	r := newListenRig(t, srv, mcphost.ListenOptions{BackoffMin: 10 * time.Millisecond}, false)
	if diff := cmp.Diff(all(mcphost.WatchNotAcknowledged, "demo://a"), r.watch(t, "demo://a")); diff != "" {
		t.Fatalf("Watch (-want +got):\n%s", diff)
	}
	if n := r.ls.Streams(); n != 0 {
		t.Errorf("%d streams held for nothing watched, want 0", n)
	}
	awaitCond(t, "no listen stream on the server", func() bool { return s.LiveListenStreams() == 0 })
	if got := s.Stats().ListenStreams; got != 1 {
		t.Errorf("%d listen streams opened, want 1 (no re-listen of a stream that watches nothing)", got)
	}
	select {
	case e := <-r.epochs:
		t.Errorf("epoch for a stream that watched nothing: %+v", e)
	default:
	}
}

// TestListenAckWithheld: a listen never acknowledged within AckTimeout is a failed subscribe
// of every URI on it, and the stream is cancelled.
func TestListenAckWithheld(t *testing.T) {
	for _, transport := range []string{"http", "memory"} {
		t.Run(transport, func(t *testing.T) {
			s, srv := chaosListenServer(t, transport, "demo://a", "demo://b")
			s.SetListenFaults(chaosmcp.ListenFaults{WithholdAck: true})
			r := newListenRig(t, srv, mcphost.ListenOptions{AckTimeout: 300 * time.Millisecond}, false)
			if diff := cmp.Diff(all(mcphost.WatchFailed, "demo://a", "demo://b"), r.watch(t, "demo://a", "demo://b")); diff != "" {
				t.Fatalf("Watch (-want +got):\n%s", diff)
			}
			if err := r.ls.Err("demo://a"); !errors.Is(err, mcphost.ErrAckTimeout) {
				t.Errorf("Err(demo://a) = %v, want ErrAckTimeout", err)
			}
			if n := r.ls.Streams(); n != 0 {
				t.Errorf("%d streams left after the timeout, want 0", n)
			}
			if srv.live() >= 0 {
				awaitCond(t, "the unacknowledged HTTP stream cancelled", func() bool { return srv.live() == 0 })
			}
			// Watching again tries again: with the ack back, it is acknowledged.
			s.SetListenFaults(chaosmcp.ListenFaults{})
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, "demo://a"), r.watch(t, "demo://a")); diff != "" {
				t.Fatalf("Watch again (-want +got):\n%s", diff)
			}
		})
	}
}

// TestListenUnwatchBeforeAck: a URI removed while its stream waits for the acknowledgement
// releases its Watch (failed) and the stream is cancelled.
func TestListenUnwatchBeforeAck(t *testing.T) {
	s, srv := chaosListenServer(t, "http", "demo://a")
	s.SetListenFaults(chaosmcp.ListenFaults{WithholdAck: true})
	r := newListenRig(t, srv, mcphost.ListenOptions{AckTimeout: time.Minute}, false)
	done := make(chan map[string]mcphost.WatchState, 1)
	go func() {
		got, _ := r.ls.Watch(t.Context(), []string{"demo://a"})
		done <- got
	}()
	awaitCond(t, "the listen stream on the server", func() bool { return srv.live() == 1 })
	r.ls.Unwatch([]string{"demo://a"})
	if diff := cmp.Diff(all(mcphost.WatchFailed, "demo://a"), recvListen(t, done, "Watch to return")); diff != "" {
		t.Errorf("Watch (-want +got):\n%s", diff)
	}
	awaitCond(t, "the stream cancelled on the server", func() bool { return srv.live() == 0 })
}

// TestListenStaleSubscriptionID: an update whose subscription ID is no current stream's is
// reported (OLD_SESSION) and routes nothing; with the knob off, updates route again.
func TestListenStaleSubscriptionID(t *testing.T) {
	for _, transport := range []string{"http", "memory"} {
		t.Run(transport, func(t *testing.T) {
			s, srv := chaosListenServer(t, transport, "demo://a", "demo://b")
			r := newListenRig(t, srv, mcphost.ListenOptions{}, false)
			r.watch(t, "demo://a", "demo://b")
			s.SetListenFaults(chaosmcp.ListenFaults{StaleSubscriptionID: true})
			srv.set("demo://a", "v1")
			got := recvListen(t, r.stale, "stale report")
			if got[0] != "demo://a" || !strings.HasPrefix(got[1], `"stale-`) {
				t.Errorf("stale report %q, want demo://a with a stale- ID", got)
			}
			s.SetListenFaults(chaosmcp.ListenFaults{})
			srv.set("demo://b", "v1")
			// Both ride one stream, in order: the first routed update must be b's.
			if u := recvListen(t, r.updates, "routed update"); u != "demo://b" {
				t.Errorf("first routed update %q, want demo://b (the stale one must not route)", u)
			}
		})
	}
}

// TestListenDropReopens: a stream cut without its complete result is an epoch: OnEpoch gets
// its URIs, the stream is re-opened and acknowledged again, and updates flow again; the
// go-sdk's own list-changed listen is adopted and re-opened too. "slow tap": the tap's reader
// decides how the stream ended only after the go-sdk has closed the body (as on a loaded
// machine); the end is still an epoch.
func TestListenDropReopens(t *testing.T) {
	cases := []struct {
		name        string
		mk          func(t *testing.T, uris ...string) listenServer
		listChanged bool
		// deliversLC: the server sends list_changed on a modern listen stream (chaosmcp sends
		// it only to initialized legacy sessions).
		deliversLC bool
		slowTap    bool
	}{
		{"chaos-http", listenServers[0].mk, true, false, false},
		{"mcpgo-http", listenServers[2].mk, true, true, false},
		{"chaos-http slow tap", listenServers[0].mk, true, false, true},
		{"mcpgo-http slow tap", listenServers[2].mk, true, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.slowTap {
				mcphost.SetTapEndHook(func() { time.Sleep(100 * time.Millisecond) })
				t.Cleanup(func() { mcphost.SetTapEndHook(nil) })
			}
			srv := tc.mk(t, "demo://a", "demo://b")
			r := newListenRig(t, srv, mcphost.ListenOptions{BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}, tc.listChanged)
			r.watch(t, "demo://a", "demo://b")
			streams := r.ls.Streams()
			awaitCond(t, "all streams on the server", func() bool { return srv.live() == streams })
			if n := srv.drop(); n != streams {
				t.Fatalf("dropped %d streams, want %d", n, streams)
			}
			var uris []string
			control := false
			for range streams {
				e := recvListen(t, r.epochs, "epoch")
				uris = append(uris, e.URIs...)
				control = control || e.Control
			}
			slices.Sort(uris)
			if diff := cmp.Diff([]string{"demo://a", "demo://b"}, uris); diff != "" {
				t.Errorf("epoch URIs (-want +got):\n%s", diff)
			}
			if control != tc.listChanged {
				t.Errorf("control stream in an epoch: %v, want %v", control, tc.listChanged)
			}
			seen := map[string]mcphost.WatchState{}
			for len(seen) < 2 {
				n := recvListen(t, r.states, "re-acknowledgement")
				seen[n.URI] = n.State
			}
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, "demo://a", "demo://b"), seen); diff != "" {
				t.Errorf("after the re-listen (-want +got):\n%s", diff)
			}
			awaitCond(t, "streams re-opened on the server", func() bool { return srv.live() == streams })
			srv.set("demo://a", "v2")
			r.nextUpdate(t, "demo://a")
			if tc.deliversLC {
				// The server counts a stream live when its request arrives, before it records
				// the stream's filter; a list_changed sent in between reaches no one (and is the
				// gap the control epoch's re-list covers). Its acknowledgement follows the filter.
				awaitCond(t, "the re-opened control stream acknowledged", r.ls.ControlAcknowledged)
				srv.set("demo://new", "v0")
				recvListen(t, r.listChanged, "list_changed on the re-opened control stream")
			}
		})
	}
}

// TestListenSetChange: adding URIs opens a new stream and leaves the watching one alone (no
// epoch); removing every URI of a stream cancels it; removing some keeps it.
func TestListenSetChange(t *testing.T) {
	for _, tc := range []listenCase{listenServers[0], listenServers[3]} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.mk(t, "demo://a", "demo://b", "demo://c")
			r := newListenRig(t, srv, mcphost.ListenOptions{}, false)
			r.watch(t, "demo://a", "demo://b")
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, "demo://c"), r.watch(t, "demo://c")); diff != "" {
				t.Fatalf("Watch c (-want +got):\n%s", diff)
			}
			if n := r.ls.Streams(); n != 2 {
				t.Fatalf("%d streams after adding c, want 2", n)
			}
			r.ls.Unwatch([]string{"demo://c"})
			if n := r.ls.Streams(); n != 1 {
				t.Errorf("%d streams after removing c, want 1", n)
			}
			if srv.live() >= 0 {
				awaitCond(t, "c's stream cancelled on the server", func() bool { return srv.live() == 1 })
			}
			r.ls.Unwatch([]string{"demo://a"})
			if n := r.ls.Streams(); n != 1 {
				t.Errorf("%d streams after removing a, want 1 (b keeps it)", n)
			}
			srv.set("demo://b", "v1")
			r.nextUpdate(t, "demo://b")
			if _, ok := r.ls.State("demo://a"); ok {
				t.Error("demo://a still in the set")
			}
			// Watched again while b's stream still carries it: it rejoins that stream.
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, "demo://a"), r.watch(t, "demo://a")); diff != "" {
				t.Fatalf("Watch a again (-want +got):\n%s", diff)
			}
			if n := r.ls.Streams(); n != 1 {
				t.Errorf("%d streams after watching a again, want 1", n)
			}
			srv.set("demo://a", "v2")
			r.nextUpdate(t, "demo://a")
			select {
			case e := <-r.epochs:
				t.Errorf("set changes caused an epoch: %+v", e)
			case s := <-r.stale:
				t.Errorf("set changes caused a stale report: %v", s)
			default:
			}
		})
	}
}

// TestListenLayout measures the stream layouts for 1,000 URIs on one chaosmcp HTTP server:
// streams held, time until all are acknowledged, heap, and update delivery latency. It prints
// figures and asserts only correctness (all acknowledged, ceil(N/B) streams). Run with
// MCPSYNC_LISTEN_LAYOUT=1 go test ./internal/mcphost -run TestListenLayout -v.
func TestListenLayout(t *testing.T) {
	if testing.Short() || !layoutEnabled() {
		t.Skip("set MCPSYNC_LISTEN_LAYOUT=1 to measure")
	}
	const n = 1000
	uris := make([]string, n)
	for i := range uris {
		uris[i] = fmt.Sprintf("demo://r/%04d", i)
	}
	for _, b := range layoutSizes() {
		t.Run(fmt.Sprintf("B=%d", b), func(t *testing.T) {
			s, srv := chaosListenServer(t, "http", uris...)
			before, gBefore := heapInUse(), runtime.NumGoroutine()
			r := newListenRig(t, srv, mcphost.ListenOptions{BatchSize: b, AckTimeout: time.Minute,
				BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond}, false)
			start := time.Now()
			got := r.watch(t, uris...)
			ackAll := time.Since(start)
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, uris...), got); diff != "" {
				t.Fatalf("Watch (-want +got):\n%s", diff)
			}
			want := (n + b - 1) / b
			awaitCond(t, "streams on the server", func() bool { return srv.live() == want })
			heap, goroutines := heapInUse()-before, runtime.NumGoroutine()-gBefore
			// Update latency: 100 changes, one at a time, Set → routed.
			var lat []time.Duration
			for i := range 100 {
				u := uris[(i*37)%n]
				t0 := time.Now()
				s.Set(u, fmt.Sprint("v", i), "text/plain")
				r.nextUpdate(t, u)
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			// Every stream dropped at once (a server restart): epochs, then all re-acknowledged.
			t0 := time.Now()
			if got := srv.drop(); got != want {
				t.Fatalf("dropped %d streams, want %d", got, want)
			}
			reacked, other := 0, map[mcphost.WatchState]int{}
			for reacked < n {
				select {
				case st := <-r.states:
					if st.State == mcphost.WatchAcknowledged {
						reacked++
					} else {
						other[st.State]++
					}
				case <-time.After(listenWait):
					t.Fatalf("after the drop: %d re-acknowledged, others %v, %d streams held, %d on the server, %d epochs queued",
						reacked, other, r.ls.Streams(), srv.live(), len(r.epochs))
				}
			}
			relisten := time.Since(t0)
			t.Logf("layout B=%d: %d HTTP streams, all %d acknowledged in %v, heap (client+server) %+.1f MiB, %+d goroutines, update latency p50 %v p99 %v, all streams dropped → all re-acknowledged in %v",
				b, srv.live(), n, ackAll.Round(time.Millisecond), float64(heap)/(1<<20), goroutines, lat[50], lat[98], relisten.Round(time.Millisecond))
		})
	}
}

// TestListenLayoutGoSDK is the baseline of TestListenLayout: the go-sdk's own Subscribe, one
// listen stream per URI, without a ListenSet (acknowledgements counted by a middleware).
func TestListenLayoutGoSDK(t *testing.T) {
	if testing.Short() || !layoutEnabled() {
		t.Skip("set MCPSYNC_LISTEN_LAYOUT=1 to measure")
	}
	const n = 1000
	uris := make([]string, n)
	for i := range uris {
		uris[i] = fmt.Sprintf("demo://r/%04d", i)
	}
	s, _ := chaosListenServer(t, "http", uris...)
	hs, err := s.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hs.Close() })
	before, gBefore := heapInUse(), runtime.NumGoroutine()
	acks, updates := make(chan struct{}, n), make(chan string, 4096)
	c := mcp.NewClient(&mcp.Implementation{Name: "baseline", Version: "0"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updates <- req.Params.URI },
	})
	c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "notifications/subscriptions/acknowledged" {
				acks <- struct{}{}
			}
			return next(ctx, method, req)
		}
	})
	cs := connectModern(t, c, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1})
	start := time.Now()
	for _, u := range uris {
		if err := cs.Subscribe(t.Context(), &mcp.SubscribeParams{URI: u}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		recvListen(t, acks, "acknowledgement")
	}
	ackAll := time.Since(start)
	awaitCond(t, "streams on the server", func() bool { return s.LiveListenStreams() == n })
	heap, goroutines := heapInUse()-before, runtime.NumGoroutine()-gBefore
	var lat []time.Duration
	for i := range 100 {
		u := uris[(i*37)%n]
		t0 := time.Now()
		s.Set(u, fmt.Sprint("v", i), "text/plain")
		for got := recvListen(t, updates, "update"); got != u; got = recvListen(t, updates, "update") {
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	s.DropListenStreams()
	time.Sleep(time.Second)
	t.Logf("go-sdk Subscribe per URI: %d HTTP streams, all %d acknowledged in %v, heap (client+server) %+.1f MiB, %+d goroutines, update latency p50 %v p99 %v, all streams dropped → %d re-opened after 1s (the go-sdk never re-listens)",
		n, n, ackAll.Round(time.Millisecond), float64(heap)/(1<<20), goroutines, lat[50], lat[98], s.LiveListenStreams())
}

func layoutSizes() []int {
	if v := os.Getenv("MCPSYNC_LISTEN_LAYOUT_B"); v != "" {
		b, err := strconv.Atoi(v)
		if err == nil && b > 0 {
			return []int{b}
		}
	}
	return []int{1000, 500, 100, 1}
}

func layoutEnabled() bool { return os.Getenv("MCPSYNC_LISTEN_LAYOUT") == "1" }

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestListenControlAckWithheld: a server that never acknowledges the go-sdk's own
// list-changed listen (the control stream) must not hold the connect, and the stream counts
// as ended when AckTimeout passes: an epoch of the control stream (a list_changed may have
// been missed), then a re-listen, which is acknowledged once the server acknowledges again.
// Over HTTP a server that withholds the acknowledgement may also withhold the response
// headers, and the go-sdk sends that listen inside Connect with no deadline of its own.
func TestListenControlAckWithheld(t *testing.T) {
	for _, transport := range []string{"http", "memory"} {
		t.Run(transport, func(t *testing.T) {
			s, srv := chaosListenServer(t, transport, "demo://a")
			s.SetListenFaults(chaosmcp.ListenFaults{WithholdAck: true})
			rigged := make(chan *listenRig, 1)
			go func() {
				rigged <- newListenRig(t, srv, mcphost.ListenOptions{AckTimeout: 300 * time.Millisecond,
					BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond}, true)
			}()
			r := recvListen(t, rigged, "the connect to return")
			e := recvListen(t, r.epochs, "an epoch of the unacknowledged control stream")
			if !e.Control || len(e.URIs) != 0 || !strings.Contains(e.Reason, "not acknowledged") {
				t.Errorf("epoch %+v, want the control stream's, ended as not acknowledged", e)
			}
			s.SetListenFaults(chaosmcp.ListenFaults{})
			if diff := cmp.Diff(all(mcphost.WatchAcknowledged, "demo://a"), r.watch(t, "demo://a")); diff != "" {
				t.Fatalf("Watch (-want +got):\n%s", diff)
			}
			if srv.live() >= 0 {
				awaitCond(t, "the re-opened control stream and the URI's stream on the server", func() bool { return srv.live() == 2 })
			}
			awaitCond(t, "the re-opened control stream acknowledged", r.ls.ControlAcknowledged)
		})
	}
}
