package mcphost_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// pgProxy forwards TCP connections to Postgres until frozen; frozen, it is a black hole:
// connections stay open but nothing passes either way, and new connections are accepted and
// never answered, as in a network partition.
type pgProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	ups    []net.Conn // connections to Postgres, closed when frozen
	downs  []net.Conn // connections from clients, closed when the test ends
}

func startProxy(t *testing.T, target string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range append(p.ups, p.downs...) {
			c.Close()
		}
	})
	return p
}

func (p *pgProxy) accept() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.downs = append(p.downs, down)
		frozen := p.frozen
		p.mu.Unlock()
		if frozen {
			continue // never answered
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.ups = append(p.ups, up)
		p.mu.Unlock()
		// When frozen the upstream side is closed and both copies end; the client side is
		// left open and silent.
		go func() { _, _ = io.Copy(up, down) }()
		go func() { _, _ = io.Copy(down, up) }()
	}
}

// freeze cuts every connection and the ones to come, without telling the clients.
func (p *pgProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = true
	for _, c := range p.ups {
		c.Close()
	}
	p.ups = nil
}

// thaw ends the partition: the connections it left hanging are reset (their clients see an
// error at once) and new connections are forwarded again.
func (p *pgProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = false
	for _, c := range p.downs {
		c.Close()
	}
	p.downs = nil
}

// runHost runs a session host on store until the test ends.
func runHost(t *testing.T, store *ledger.Store, queue string, opts mcphost.Options) *mcphost.Host {
	t.Helper()
	opts.Store, opts.Signaler, opts.Queue = store, newRecorder(), queue
	opts.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Named(queue)
	h := mcphost.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return h
}

// Issue 12 defect 6: a host cut off from Postgres kept its sessions (a failed ClaimSources
// changed nothing), so after its lease expired and another host opened a newer generation,
// the MCP server saw two live sessions of one source. Now the cut-off host closes its session
// RenewGrace after its last renewal, before the lease can expire: the server never sees two
// sessions of the source, and the other host takes over within the lease.
func TestHostCutOffFromLedgerDropsSessionsBeforeLeaseExpires(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	direct, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	cut, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	// Closing waits up to 15 s for the connections the partition broke: not worth waiting for.
	t.Cleanup(func() { go cut.Close() })

	srv := chaosmcp.New(chaosmcp.Options{Name: "fenced"})
	t.Cleanup(func() { srv.Close() })
	srv.Set("demo://notes/1", "v1", "text/plain")
	hs, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	store := ledger.New(direct)
	src, _, err := store.AddSource(context.Background(), ledger.SourceSpec{Name: "fenced", Transport: ledger.TransportHTTP, URL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}

	const lease = 3 * time.Second
	opts := mcphost.Options{Lease: lease, ClaimInterval: 100 * time.Millisecond, KeepAlive: 500 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second}
	a := runHost(t, ledger.New(cut), "host-a", opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.WaitSession(ctx, src.ID, 0); err != nil {
		t.Fatal(err)
	}
	b := runHost(t, store, "host-b", opts)
	// host-b's first lease round registers it; one source, so host-a keeps it.
	waitFor(t, 10*time.Second, "host-b registered", func() (bool, string) {
		var n int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM hosts WHERE queue = 'host-b' AND alive_until > now()`).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 1, "no live heartbeat of host-b"
	})
	if _, ok := b.Current(src.ID); ok {
		t.Fatal("host-b opened a session of a source host-a holds")
	}

	aGone := make(chan time.Duration, 1)
	cutAt := time.Now()
	proxy.freeze()
	go func() {
		if srv.Await(ctx, func(st chaosmcp.Stats) bool { return st.LiveByListener[hs.ListenerID()] == 0 }) == nil {
			aGone <- time.Since(cutAt)
		}
	}()
	c, err := b.WaitSession(ctx, src.ID, 0)
	if err != nil {
		t.Fatalf("host-b never took the source over: %v", err)
	}
	moved := time.Since(cutAt)
	proxy.thaw() // host-a can record its session's end and stop quickly
	select {
	case d := <-aGone:
		t.Logf("cut-off host closed its session %s after the cut; the other host took over after %s (lease %s)",
			d.Round(time.Millisecond), moved.Round(time.Millisecond), lease)
	default:
		t.Error("the server never saw the cut-off host's session end before the takeover")
	}
	if c.Generation() != 2 {
		t.Errorf("host-b's generation %d, want 2", c.Generation())
	}
	if moved > lease+3*time.Second {
		t.Errorf("takeover took %s, want within the lease (%s) and a few seconds", moved, lease)
	}
	if _, ok := a.Current(src.ID); ok {
		t.Error("the cut-off host still has a live session")
	}
	if st := srv.Stats(); st.MaxLiveByListener[hs.ListenerID()] != 1 {
		t.Errorf("the server saw %d live sessions of the source at once, want 1", st.MaxLiveByListener[hs.ListenerID()])
	}
	sess, err := store.CurrentSession(ctx, src.ID)
	if err != nil || sess.HostQueue != "host-b" {
		t.Errorf("current session %+v, %v; want host-b's", sess, err)
	}
}

// A source whose definition version goes up is restarted with the new definition (here a new
// URL); a removed source is dropped and its lease released (issue 12: the host acts on what
// ClaimLeases returns).
func TestDefinitionChangeRestartsAndRemovalDrops(t *testing.T) {
	f := newFixture(t)
	srv1, hs1 := f.chaosHTTP(chaosmcp.Options{Name: "old-definition"})
	srv2, hs2 := f.chaosHTTP(chaosmcp.Options{Name: "new-definition"})
	src := f.addSource(ledger.SourceSpec{Name: "changing", Transport: ledger.TransportHTTP, URL: hs1.URL})
	h := f.startHost("host-a", mcphost.Options{KeepAlive: 500 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second}, newRecorder())
	c1 := f.waitSession(h, src.ID, 0)
	if c1.Caps().ServerName != "old-definition" {
		t.Fatalf("first session with %q", c1.Caps().ServerName)
	}
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE sources SET url = $2, definition_version = definition_version + 1
		WHERE id = $1`, src.ID, hs2.URL); err != nil {
		t.Fatal(err)
	}
	c2 := f.waitSession(h, src.ID, c1.Generation())
	if c2.Caps().ServerName != "new-definition" || c2.Source().DefinitionVersion != 1 {
		t.Errorf("after the change: session with %q at definition version %d, want new-definition at 1",
			c2.Caps().ServerName, c2.Source().DefinitionVersion)
	}
	waitFor(t, 10*time.Second, "old server's session closed", func() (bool, string) {
		st := srv1.Stats()
		return st.LiveSessions == 0, fmt.Sprintf("%d live", st.LiveSessions)
	})

	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE sources SET removed_at = now() WHERE id = $1`, src.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "removed source dropped and released", func() (bool, string) {
		cur, err := f.store.SourceByID(f.ctx, src.ID)
		if err != nil {
			t.Fatal(err)
		}
		_, live := h.Current(src.ID)
		st := srv2.Stats()
		return !live && st.LiveSessions == 0 && cur.HostQueue == "",
			fmt.Sprintf("host session %v, server sessions %d, holder %q", live, st.LiveSessions, cur.HostQueue)
	})
	time.Sleep(300 * time.Millisecond) // a few more rounds: never claimed again
	if _, live := h.Current(src.ID); live {
		t.Error("the host reopened a removed source")
	}
}

// slowClose delays closing every connection of a transport, as a server slow to acknowledge
// the end of a session would.
type slowClose struct {
	mcp.Transport
	delay time.Duration
}

func (s slowClose) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := s.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &slowConn{Connection: c, delay: s.delay}, nil
}

type slowConn struct {
	mcp.Connection
	delay time.Duration
	once  sync.Once
}

func (c *slowConn) Close() error {
	c.once.Do(func() { time.Sleep(c.delay) })
	return c.Connection.Close()
}

// A host that sheds a source to a newly started host (fair spreading, issue 12) releases the
// lease only after its session is closed, however slow the close: the server never sees the
// shedding host's session and the new holder's at once.
func TestShedReleasesOnlyAfterTheSessionClosed(t *testing.T) {
	f := newFixture(t)
	srv := chaosmcp.New(chaosmcp.Options{Name: "shed"})
	t.Cleanup(func() { srv.Close() })
	var listeners []string
	var srcs []ledger.Source
	for i := range 2 {
		hs, err := srv.StartHTTP("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hs.Close() })
		listeners = append(listeners, hs.ListenerID())
		srcs = append(srcs, f.addSource(ledger.SourceSpec{Name: fmt.Sprintf("shed-%d", i), Transport: ledger.TransportHTTP, URL: hs.URL}))
	}
	slow := func(ctx context.Context, src ledger.Source) (mcp.Transport, error) {
		tr, err := mcphost.DefaultTransport(ctx, src)
		if err != nil {
			return nil, err
		}
		return slowClose{Transport: tr, delay: time.Second}, nil
	}
	a := f.startHost("host-a", mcphost.Options{Transport: slow}, newRecorder())
	for _, src := range srcs {
		f.waitSession(a, src.ID, 0)
	}
	b := f.startHost("host-b", mcphost.Options{}, newRecorder())
	waitFor(t, 20*time.Second, "one source moved to host-b", func() (bool, string) {
		n := 0
		for _, src := range srcs {
			if _, ok := b.Current(src.ID); ok {
				n++
			}
		}
		return n == 1, fmt.Sprintf("host-b has %d sessions", n)
	})
	st := srv.Stats()
	for i, l := range listeners {
		if st.MaxLiveByListener[l] != 1 {
			t.Errorf("source %s: the server saw %d live sessions at once, want 1", srcs[i].Name, st.MaxLiveByListener[l])
		}
	}
}
