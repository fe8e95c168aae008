package mcphost_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// stdioServerArg makes the test binary, run as a child, serve a fault-injecting MCP server
// over its stdin and stdout instead of running tests.
const stdioServerArg = "mcphost-test-stdio-server"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == stdioServerArg {
		os.Exit(serveStdio())
	}
	pgtest.Main(m)
}

func serveStdio() int {
	srv := chaosmcp.New(chaosmcp.Options{Name: "stdio-chaos", Version: "7.7.7"})
	srv.Set("demo://notes/1", "served over stdio\n", "text/plain")
	if err := srv.ServeStdio(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "stdio server:", err)
		return 1
	}
	return 0
}

// fixture is a fresh ledger database for one test.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	store *ledger.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fixture{t: t, ctx: ctx, store: ledger.New(pgtest.NewPool(t))}
}

// chaosHTTP starts a fault-injecting server on a free loopback port, stopped when the test
// ends.
func (f *fixture) chaosHTTP(opts chaosmcp.Options) (*chaosmcp.Server, *chaosmcp.HTTPServer) {
	return f.chaosHTTPWith(opts, (*chaosmcp.Server).StartHTTP)
}

func (f *fixture) chaosHTTPWith(opts chaosmcp.Options, start func(*chaosmcp.Server, string) (*chaosmcp.HTTPServer, error)) (*chaosmcp.Server, *chaosmcp.HTTPServer) {
	f.t.Helper()
	srv := chaosmcp.New(opts)
	f.t.Cleanup(func() { srv.Close() })
	hs, err := start(srv, "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { hs.Close() })
	return srv, hs
}

func (f *fixture) addSource(spec ledger.SourceSpec) ledger.Source {
	f.t.Helper()
	src, _, err := f.store.AddSource(f.ctx, spec)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, _, err := f.store.GrantAccess(f.ctx, "p", src.ID, "test"); err != nil {
		f.t.Fatal(err)
	}
	return src
}

// startHost runs a session host until the test ends. Zero timing options get values that
// keep tests quick; KeepAlive, ReconnectMin and ReconnectMax stay at the production defaults
// unless set.
func (f *fixture) startHost(queue string, opts mcphost.Options, sig mcphost.Signaler) *mcphost.Host {
	f.t.Helper()
	h, _ := f.startStoppableHost(queue, opts, sig)
	return h
}

// startStoppableHost is startHost that also returns a function stopping the host and waiting
// until Run has returned (every session ended, its notifications routed and delivered).
func (f *fixture) startStoppableHost(queue string, opts mcphost.Options, sig mcphost.Signaler) (*mcphost.Host, func()) {
	f.t.Helper()
	opts.Store, opts.Signaler, opts.Queue = f.store, sig, queue
	if opts.ClaimInterval == 0 {
		opts.ClaimInterval = 50 * time.Millisecond
	}
	if opts.Lease == 0 {
		opts.Lease = 5 * time.Second
	}
	opts.Logger = zaptest.NewLogger(f.t, zaptest.Level(zap.WarnLevel))
	h := mcphost.New(opts)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Run(ctx)
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		<-done
	})
	f.t.Cleanup(stop)
	return h, stop
}

// waitSession waits for a live session of the source with a generation above after.
func (f *fixture) waitSession(h *mcphost.Host, sourceID, after int64) *mcphost.Conn {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	c, err := h.WaitSession(ctx, sourceID, after)
	if err != nil {
		f.t.Fatalf("no session of source %d above generation %d: %v", sourceID, after, err)
	}
	return c
}

// activeSub makes an ACTIVE subscription of serverURI bound to session generation gen.
func (f *fixture) activeSub(sourceID int64, serverURI string, gen int64) ledger.Subscription {
	f.t.Helper()
	norm, err := uri.Normalize(serverURI)
	if err != nil {
		f.t.Fatal(err)
	}
	sub, err := f.store.EnsureSubscription(f.ctx, ledger.EnsureSpec{
		Principal: "p", SourceID: sourceID, URI: norm, ServerURI: serverURI, WorkflowID: "wf " + serverURI,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return f.bind(sub, gen)
}

// bind (re)binds a subscription to session generation gen and activates it.
func (f *fixture) bind(sub ledger.Subscription, gen int64) ledger.Subscription {
	f.t.Helper()
	for _, step := range []func() (ledger.TransitionResult, error){
		func() (ledger.TransitionResult, error) {
			return f.store.BeginSubscribe(f.ctx, sub.ID, sub.Generation, gen)
		},
		func() (ledger.TransitionResult, error) { return f.store.Activate(f.ctx, sub.ID, sub.Generation, gen) },
	} {
		res, err := step()
		if err != nil || !res.Outcome.OK() {
			f.t.Fatalf("binding subscription %d to generation %d: %+v %v", sub.ID, gen, res, err)
		}
	}
	return f.sub(sub.ID)
}

// closeSub closes a subscription in the ledger (begin and complete its unsubscribe), as after
// an acknowledged unsubscribe: CLOSED, its server-side subscription left to the test.
func (f *fixture) closeSub(sub ledger.Subscription) {
	f.t.Helper()
	cr, err := f.store.BeginUnsubscribe(f.ctx, sub.ID, sub.Generation, "test")
	if err != nil {
		f.t.Fatal(err)
	}
	if tr, err := f.store.CompleteUnsubscribe(f.ctx, sub.ID, sub.Generation, cr.CloseEpoch); err != nil || tr.State != mcpsync.StateClosed {
		f.t.Fatalf("closing subscription %d: %+v %v", sub.ID, tr, err)
	}
}

func (f *fixture) sub(id int64) ledger.Subscription {
	f.t.Helper()
	sub, err := f.store.SubscriptionByID(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sub
}

// audit is a notification audit receipt.
type audit struct {
	Kind      mcpsync.ReceiptKind
	Gen       int64
	URI       string
	ServerURI string
	Seq       int64
}

// audits returns the notification audit receipts of a source in the order written.
func (f *fixture) audits(sourceID int64) []audit {
	f.t.Helper()
	rows, err := f.store.Pool().Query(f.ctx, `SELECT kind, session_generation, uri,
			coalesce(detail->>'server_uri', uri), (detail->>'seq')::bigint
		FROM receipts WHERE source_id = $1 AND kind LIKE 'NOTIFICATION_%' ORDER BY id`, sourceID)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[audit])
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// waitAudits waits until the source has at least n notification audit receipts.
func (f *fixture) waitAudits(sourceID int64, n int) []audit {
	f.t.Helper()
	var got []audit
	waitFor(f.t, 20*time.Second, fmt.Sprintf("%d notification audits", n), func() (bool, string) {
		got = f.audits(sourceID)
		return len(got) >= n, fmt.Sprintf("%+v", got)
	})
	return got
}

// sessionRow is a sessions row: a generation and its capability receipt.
type sessionRow struct {
	Generation int64
	Caps       ledger.CapabilityReceipt
	Ended      bool
	EndReason  string
}

func (f *fixture) sessions(sourceID int64) []sessionRow {
	f.t.Helper()
	rows, err := f.store.Pool().Query(f.ctx, `SELECT generation, protocol_version, cap_resources,
			cap_subscribe, cap_list_changed, cap_snapshot_ids, server_name, server_version,
			capabilities, ended_at IS NOT NULL, coalesce(end_reason, '')
		FROM sessions WHERE source_id = $1 ORDER BY generation`, sourceID)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sessionRow, error) {
		var s sessionRow
		var raw []byte
		err := r.Scan(&s.Generation, &s.Caps.ProtocolVersion, &s.Caps.Resources, &s.Caps.Subscribe,
			&s.Caps.ListChanged, &s.Caps.SnapshotIDs, &s.Caps.ServerName, &s.Caps.ServerVersion, &raw,
			&s.Ended, &s.EndReason)
		s.Caps.Raw = raw
		return s, err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// waitFor polls cond until it holds or the timeout passes; the message of the last attempt
// explains a failure.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %s", what, timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// subscribedURI is one URI served by a fault-injecting HTTP server, a source on it, a host
// signalling a recorder, its session, and an ACTIVE subscription of the URI bound to that
// session and subscribed on the server.
type subscribedURI struct {
	srv *chaosmcp.Server
	src ledger.Source
	sig *recorder
	h   *mcphost.Host
	// stop stops h and waits for it (startStoppableHost).
	stop func()
	c    *mcphost.Conn
	sub  ledger.Subscription
}

// subscribeURI sets up a subscribedURI for u, whose body starts as "0".
func (f *fixture) subscribeURI(u string) subscribedURI {
	f.t.Helper()
	sig := newRecorder()
	s := f.subscribeWith(u, mcphost.Options{}, sig)
	s.sig = sig
	return s
}

// subscribeWith starts a server holding u (body "0"), a host with opts signalling through
// sigr, and an ACTIVE subscription of u on the host's session; the result's sig is left nil.
func (f *fixture) subscribeWith(u string, opts mcphost.Options, sigr mcphost.Signaler) subscribedURI {
	f.t.Helper()
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	srv.Set(u, "0", "text/plain")
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	h, stop := f.startStoppableHost("host-a", opts, sigr)
	c := f.waitSession(h, src.ID, 0)
	sub := f.activeSub(src.ID, u, c.Generation())
	if err := c.Subscribe(f.ctx, u, sub.ID); err != nil {
		f.t.Fatal(err)
	}
	return subscribedURI{srv: srv, src: src, h: h, stop: stop, c: c, sub: sub}
}

// signal is one signal a recorder received.
type signal struct {
	WorkflowID string
	Name       string
	Arg        any
}

// recorder is a Signaler that records every signal.
type recorder struct {
	mu      sync.Mutex
	sigs    []signal
	changed chan struct{}
	// reader, when set (readOn), reads the URI of each resource-updated signal.
	reader *mcphost.Conn
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

// readOn makes the recorder read on c the URI of every resource-updated signal it records,
// before SignalWorkflow returns, as a live subscription reads because of its signal. Without
// reads the host leaves a later notification of the URI to the read the pending signal calls
// for, and signals it no more (R13).
func (r *recorder) readOn(c *mcphost.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reader = c
}

// SignalWorkflow records the signal, and reads its URI when readOn asked for it.
func (r *recorder) SignalWorkflow(ctx context.Context, workflowID, _ string, name string, arg any) error {
	r.mu.Lock()
	r.sigs = append(r.sigs, signal{WorkflowID: workflowID, Name: name, Arg: arg})
	close(r.changed)
	r.changed = make(chan struct{})
	c := r.reader
	r.mu.Unlock()
	if u, ok := arg.(contract.ResourceUpdated); ok && c != nil {
		// Its outcome does not matter (an encoded URI may name nothing): it was sent.
		_, _ = c.Session().ReadResource(ctx, &mcp.ReadResourceParams{URI: u.ServerURI})
	}
	return nil
}

func (r *recorder) all() []signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]signal(nil), r.sigs...)
}

// wait waits until cond holds for the recorded signals.
func (r *recorder) wait(t *testing.T, what string, cond func([]signal) bool) []signal {
	t.Helper()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		r.mu.Lock()
		sigs, ch := append([]signal(nil), r.sigs...), r.changed
		r.mu.Unlock()
		if cond(sigs) {
			return sigs
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("%s: not reached within 20s; signals: %+v", what, sigs)
		}
	}
}

// updates returns the resource-updated payloads among sigs, per workflow ID.
func updates(sigs []signal) []update {
	var out []update
	for _, s := range sigs {
		if u, ok := s.Arg.(contract.ResourceUpdated); ok && s.Name == contract.SignalResourceUpdated {
			if u.ReceivedAt.IsZero() {
				u.ServerURI += " (no arrival time!)" // every signal must carry the host's arrival time
			}
			u.ReceivedAt = time.Time{} // the host's clock: compared by the workflow, not here
			out = append(out, update{WorkflowID: s.WorkflowID, ResourceUpdated: u})
		}
	}
	return out
}

type update struct {
	WorkflowID string
	contract.ResourceUpdated
}

// stdioSpy wraps DefaultTransport and remembers the child processes it starts.
type stdioSpy struct {
	mu   sync.Mutex
	cmds []*exec.Cmd
}

func (s *stdioSpy) transport(ctx context.Context, src ledger.Source) (mcp.Transport, error) {
	tr, err := mcphost.DefaultTransport(ctx, src)
	if cmd := mcphost.ChildCommand(tr); cmd != nil {
		s.mu.Lock()
		s.cmds = append(s.cmds, cmd)
		s.mu.Unlock()
	}
	return tr, err
}

// lastPID returns the PID of the newest child started (which has connected).
func (s *stdioSpy) lastPID(t *testing.T) int {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cmds) == 0 || s.cmds[len(s.cmds)-1].Process == nil {
		t.Fatal("no stdio child started")
	}
	return s.cmds[len(s.cmds)-1].Process.Pid
}

// procState returns the state letter of a process (R, S, Z, ...) or "" when it is gone.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "?"
	}
	return s[i+2 : i+3]
}

// chaosHTTPBothEras is chaosHTTP serving both eras on one endpoint (2026-07-28 stateless).
func (f *fixture) chaosHTTPBothEras(opts chaosmcp.Options) (*chaosmcp.Server, *chaosmcp.HTTPServer) {
	return f.chaosHTTPWith(opts, (*chaosmcp.Server).StartHTTPBothEras)
}
