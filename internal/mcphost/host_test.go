package mcphost_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// Every (re)connection is a new session generation with its own capability receipt: the
// negotiated protocol version, resources.subscribe and resources.listChanged as the server
// declared them for that connection, the snapshot extension and the server's name and
// version (R1, R9). The previous generation is recorded as ended.
func TestEveryConnectionRecordsGenerationAndReceipt(t *testing.T) {
	f := newFixture(t)
	steps := []struct {
		caps          chaosmcp.Capabilities
		name, version string
	}{
		{chaosmcp.Capabilities{Subscribe: true, ListChanged: true}, "chaos", "1.0.0"},
		{chaosmcp.Capabilities{Subscribe: false, ListChanged: true}, "chaos", "1.0.1"},
		{chaosmcp.Capabilities{Subscribe: true, ListChanged: false, Snapshot: true}, "chaos-renamed", "2.0.0"},
		{chaosmcp.Capabilities{}, "chaos-renamed", "2.0.1"},
	}
	srv, hs := f.chaosHTTP(chaosmcp.Options{Capabilities: &steps[0].caps, Name: steps[0].name, Version: steps[0].version})
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	h := f.startHost("host-a", mcphost.Options{}, newRecorder())

	var want []sessionRow
	var gen int64
	for i, step := range steps {
		if i > 0 {
			srv.SetCapabilities(step.caps)
			srv.SetServerInfo(step.name, step.version)
			srv.Restart()
		}
		c := f.waitSession(h, src.ID, gen)
		if c.Generation() != gen+1 {
			t.Errorf("step %d: generation %d after %d", i, c.Generation(), gen)
		}
		gen = c.Generation()
		if i > 0 {
			want[i-1].Ended = true
		}
		want = append(want, sessionRow{Generation: gen, Caps: ledger.CapabilityReceipt{
			ProtocolVersion: mcphost.ProtocolVersion, Resources: true, Subscribe: step.caps.Subscribe,
			ListChanged: step.caps.ListChanged, SnapshotIDs: step.caps.Snapshot,
			ServerName: step.name, ServerVersion: step.version,
		}})
		if diff := cmp.Diff(want[i].Caps, c.Caps(), cmpopts.IgnoreFields(ledger.CapabilityReceipt{}, "Raw")); diff != "" {
			t.Errorf("step %d: live receipt (-want +got):\n%s", i, diff)
		}
		cur, err := f.store.CurrentSession(f.ctx, src.ID)
		if err != nil || cur.Generation != gen {
			t.Fatalf("step %d: current session %+v, %v; want generation %d", i, cur, err, gen)
		}
	}
	got := f.sessions(src.ID)
	for i := range got {
		if len(got[i].Caps.Raw) == 0 {
			t.Errorf("generation %d: raw capabilities not stored", got[i].Generation)
		}
		if got[i].Ended && got[i].EndReason == "" {
			t.Errorf("generation %d ended without a reason", got[i].Generation)
		}
		got[i].EndReason = ""
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(ledger.CapabilityReceipt{}, "Raw")); diff != "" {
		t.Errorf("stored sessions (-want +got):\n%s", diff)
	}
}

// A server that dies is noticed within seconds, and the source is re-established with a new
// generation: a killed stdio child, a crashed streamable HTTP server that comes back on the
// same port, and an HTTP server that restarted (its old session ID answers 404). The old
// generation is recorded as ended, its subscriptions are fenced (RECONCILIATION_REQUIRED)
// and told session-changed with the new generation, calls carrying the old generation are
// refused as stale, and a killed child is reaped. Detection and reconnect times are logged.
func TestDeadServerDetectedAndReestablished(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type server struct {
		spec ledger.SourceSpec
		// kill makes the server die; revive brings it back (nil: it comes back by itself).
		kill, revive func(t *testing.T)
	}
	tests := []struct {
		name  string
		setup func(f *fixture, spy *stdioSpy) server
	}{
		{"stdio child killed", func(f *fixture, spy *stdioSpy) server {
			return server{
				spec: ledger.SourceSpec{Transport: ledger.TransportStdio, Command: []string{exe, stdioServerArg}},
				kill: func(t *testing.T) {
					if err := syscall.Kill(spy.lastPID(t), syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
				},
			}
		}},
		{"stdio child hung (SIGSTOP, caught by keep-alive)", func(f *fixture, spy *stdioSpy) server {
			return server{
				spec: ledger.SourceSpec{Transport: ledger.TransportStdio, Command: []string{exe, stdioServerArg}},
				kill: func(t *testing.T) {
					if err := syscall.Kill(spy.lastPID(t), syscall.SIGSTOP); err != nil {
						t.Fatal(err)
					}
				},
			}
		}},
		{"http server crashed and restarted on its port", func(f *fixture, _ *stdioSpy) server {
			srv, hs := f.chaosHTTP(chaosmcp.Options{})
			return server{
				spec: ledger.SourceSpec{Transport: ledger.TransportHTTP, URL: hs.URL},
				kill: func(t *testing.T) {
					if err := hs.Close(); err != nil {
						t.Fatal(err)
					}
				},
				revive: func(t *testing.T) {
					again, err := srv.StartHTTP(hs.Addr)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { again.Close() })
				},
			}
		}},
		{"http server restarted (sessions lost)", func(f *fixture, _ *stdioSpy) server {
			srv, hs := f.chaosHTTP(chaosmcp.Options{})
			return server{
				spec: ledger.SourceSpec{Transport: ledger.TransportHTTP, URL: hs.URL},
				kill: func(*testing.T) { srv.Restart() },
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			spy := &stdioSpy{}
			s := tt.setup(f, spy)
			s.spec.Name = "src"
			src := f.addSource(s.spec)
			sig := newRecorder()
			h := f.startHost("host-a", mcphost.Options{Transport: spy.transport}, sig)
			old := f.waitSession(h, src.ID, 0)
			sub := f.activeSub(src.ID, "demo://notes/1", old.Generation())
			var pid int
			if s.spec.Transport == ledger.TransportStdio {
				pid = spy.lastPID(t)
			}

			start := time.Now()
			s.kill(t)
			waitFor(t, 30*time.Second, "session end noticed", func() (bool, string) {
				c, ok := h.Current(src.ID)
				return !ok || c != old, "old session still current"
			})
			detected := time.Since(start)
			if s.revive != nil {
				s.revive(t)
			}
			c := f.waitSession(h, src.ID, old.Generation())
			reconnected := time.Since(start)
			t.Logf("%s: dead session noticed after %v, new generation %d live after %v",
				tt.name, detected.Round(time.Millisecond), c.Generation(), reconnected.Round(time.Millisecond))

			if c.Generation() != old.Generation()+1 {
				t.Errorf("new generation %d, want %d", c.Generation(), old.Generation()+1)
			}
			rows := f.sessions(src.ID)
			if len(rows) != 2 || !rows[0].Ended || rows[0].EndReason == "" || rows[1].Ended {
				t.Errorf("sessions: %+v", rows)
			}
			got := f.sub(sub.ID)
			if got.State != mcpsync.StateReconciliationRequired || got.SessionGeneration != old.Generation() {
				t.Errorf("subscription after the session ended: %s on generation %d (%s)", got.State, got.SessionGeneration, got.StateReason)
			}
			sig.wait(t, "session-changed signal", func(sigs []signal) bool {
				return len(sigs) > 0
			})
			want := []signal{{WorkflowID: sub.WorkflowID, Name: contract.SignalSessionChanged, Arg: contract.SessionChanged{Generation: c.Generation()}}}
			if diff := cmp.Diff(want, sig.all()); diff != "" {
				t.Errorf("signals (-want +got):\n%s", diff)
			}
			if _, err := h.Conn(src.ID, old.Generation()); !errors.Is(err, mcphost.ErrStaleSession) {
				t.Errorf("Conn with the old generation: %v, want ErrStaleSession", err)
			}
			if live, err := h.Conn(src.ID, c.Generation()); err != nil || live != c {
				t.Errorf("Conn with the live generation: %v, %v", live, err)
			}
			if pid != 0 {
				waitFor(t, 10*time.Second, "killed child reaped", func() (bool, string) {
					st := procState(pid)
					return st == "", fmt.Sprintf("process %d in state %q", pid, st)
				})
			}
		})
	}
}

// Notifications are routed by normalized URI: encoding confusion (re-encoded unreserved
// characters, upper-case scheme and host, lower-case hex escapes) still reaches the right
// subscription, and the signal carries the string the server sent while the subscription
// keeps the server's original URI for reads; "%2F" is never merged with "/". A notification
// for an unknown URI, for a closed subscription or with a malformed URI becomes an audit
// receipt and no signal.
func TestNotificationRouting(t *testing.T) {
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	uris := map[string]string{
		"unreserved": "demo://notes/~draft_1.v-2",
		"case":       "demo://notes/x",
		"escaped":    "demo://files/a%2Fb",
		"slash":      "demo://files/a/b",
		"closed":     "demo://notes/closed",
	}
	for _, u := range uris {
		srv.Set(u, "body of "+u, "text/plain")
	}
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	sig := newRecorder()
	h := f.startHost("host-a", mcphost.Options{}, sig)
	c := f.waitSession(h, src.ID, 0)
	sig.readOn(c) // every signal leads to a read, so that each case is signalled
	gen := c.Generation()
	subs := map[string]ledger.Subscription{}
	for k, u := range uris {
		subs[k] = f.activeSub(src.ID, u, gen)
		if err := c.Subscribe(f.ctx, u, subs[k].ID); err != nil {
			t.Fatal(err)
		}
	}
	// The closed subscription's server-side subscription outlives it (as after a lost
	// unsubscribe acknowledgement), so the server keeps notifying.
	closed := subs["closed"]
	f.closeSub(closed)
	serverSeq := srv.Sessions()[0].Seq

	type outcome struct {
		Signals []update
		Audits  []audit
	}
	sent := func(key string, rewrite func(string) string) func() {
		return func() {
			srv.SetUpdateURIRewrite(rewrite)
			defer srv.SetUpdateURIRewrite(nil)
			srv.Set(uris[key], "changed "+key, "text/plain")
		}
	}
	sendRaw := func(u string) func() {
		return func() {
			if err := srv.SendUpdate(serverSeq, u); err != nil {
				t.Fatal(err)
			}
		}
	}
	upd := func(key, serverURI string) update {
		return update{WorkflowID: subs[key].WorkflowID, ResourceUpdated: contract.ResourceUpdated{SessionGeneration: gen, ServerURI: serverURI, Pulses: 1}}
	}
	tests := []struct {
		name   string
		notify func()
		want   outcome
	}{
		{"exact", sent("unreserved", nil), outcome{Signals: []update{upd("unreserved", "demo://notes/~draft_1.v-2")}}},
		{"unreserved characters percent-encoded", sent("unreserved", chaosmcp.EncodeUnreserved),
			outcome{Signals: []update{upd("unreserved", "demo://notes/%7Edraft%5F1%2Ev%2D2")}}},
		{"upper-case scheme and host", sent("case", chaosmcp.UpperSchemeHost), outcome{Signals: []update{upd("case", "DEMO://NOTES/x")}}},
		{"lower-case hex keeps %2F apart from /", sent("escaped", chaosmcp.LowerHexEscapes), outcome{Signals: []update{upd("escaped", "demo://files/a%2fb")}}},
		{"/ stays apart from %2F", sent("slash", nil), outcome{Signals: []update{upd("slash", "demo://files/a/b")}}},
		{"unknown URI", sendRaw("demo://notes/nobody"),
			outcome{Audits: []audit{{Kind: mcpsync.ReceiptNotificationUnknown, Gen: gen, URI: "demo://notes/nobody", ServerURI: "demo://notes/nobody"}}}},
		{"closed subscription", sent("closed", nil),
			outcome{Audits: []audit{{Kind: mcpsync.ReceiptNotificationClosed, Gen: gen, URI: "demo://notes/closed", ServerURI: "demo://notes/closed"}}}},
		{"malformed URI", sendRaw("demo://notes/%zz"),
			outcome{Audits: []audit{{Kind: mcpsync.ReceiptNotificationMalformedURI, Gen: gen, URI: "demo://notes/%zz", ServerURI: "demo://notes/%zz"}}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sigsBefore, auditsBefore := len(updates(sig.all())), len(f.audits(src.ID))
			tt.notify()
			// A sentinel behind the case, on another URI. Different URIs may be routed in
			// parallel, so wait for both the sentinel and the case's own effects; anything
			// the case caused beyond them would show up by the time the sentinel has.
			sentinel := fmt.Sprintf("demo://sentinel/%d", i)
			sendRaw(sentinel)()
			want := len(tt.want.Signals) + len(tt.want.Audits)
			var got outcome
			waitFor(t, 20*time.Second, "case routed and sentinel audited", func() (bool, string) {
				all := f.audits(src.ID)[auditsBefore:]
				got = outcome{Signals: updates(sig.all())[sigsBefore:]}
				sentinelSeen := false
				for _, a := range all {
					if strings.HasPrefix(a.URI, "demo://sentinel/") {
						sentinelSeen = sentinelSeen || a.URI == sentinel
						continue
					}
					got.Audits = append(got.Audits, a)
				}
				return sentinelSeen && len(got.Signals)+len(got.Audits) >= want, fmt.Sprintf("%+v", got)
			})
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(),
				cmpopts.IgnoreFields(contract.ResourceUpdated{}, "Seq"), cmpopts.IgnoreFields(audit{}, "Seq")); diff != "" {
				t.Errorf("routing (-want +got):\n%s", diff)
			}
		})
	}
	// The subscriptions still carry the server's original strings for reads.
	for k, u := range uris {
		if got := f.sub(subs[k].ID).ServerURI; got != u {
			t.Errorf("subscription %s reads %q, want the server's %q", k, got, u)
		}
	}
}

// A notification of a URI whose subscription holds a signal no read has answered yet is
// recorded but not signalled (R13): the read that signal calls for goes out after it and sees
// its change. Once a read of the URI has been sent, the next notification is signalled again;
// a subscription of the same URI that holds no such signal is signalled at once.
func TestNotificationLeftToPendingSignalsRead(t *testing.T) {
	f := newFixture(t)
	const u = "demo://notes/pending"
	s := f.subscribeURI(u)
	srv, src, sig, c, a := s.srv, s.src, s.sig, s.c, s.sub
	seqs := func(s []signal) map[string][]int64 {
		m := map[string][]int64{}
		for _, g := range updates(s) {
			m[g.WorkflowID] = append(m[g.WorkflowID], g.Seq)
		}
		return m
	}
	srv.Set(u, "1", "text/plain")
	first := updates(sig.wait(t, "first notification signalled", func(s []signal) bool { return len(updates(s)) == 1 }))[0].Seq

	// A second subscription of the URI, not signalled so far.
	if _, _, err := f.store.GrantAccess(f.ctx, "q", src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	b, err := f.store.EnsureSubscription(f.ctx, ledger.EnsureSpec{
		Principal: "q", SourceID: src.ID, URI: u, ServerURI: u, WorkflowID: "wf q " + u,
	})
	if err != nil {
		t.Fatal(err)
	}
	b = f.bind(b, c.Generation())
	if err := c.Subscribe(f.ctx, u, b.ID); err != nil {
		t.Fatal(err)
	}
	srv.Set(u, "2", "text/plain")
	sig.wait(t, "second notification signalled to the second subscription", func(s []signal) bool { return len(seqs(s)[b.WorkflowID]) == 1 })

	// The read the first signal calls for, as the first subscription sends it.
	if _, err := c.Session().ReadResource(f.ctx, &mcp.ReadResourceParams{URI: u}); err != nil {
		t.Fatal(err)
	}
	srv.Set(u, "3", "text/plain")
	// The third notification is routed after the second (one URI, one lane), so once both
	// its signals arrived the second's are all in.
	got := seqs(sig.wait(t, "third notification signalled", func(s []signal) bool {
		m := seqs(s)
		return len(m[a.WorkflowID]) >= 2 && len(m[b.WorkflowID]) >= 2
	}))
	want := map[string][]int64{a.WorkflowID: {first, first + 2}, b.WorkflowID: {first + 1, first + 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("signalled sequence numbers (-want +got):\n%s", diff)
	}
	if s := f.sub(a.ID); s.LastNotificationSeq != first+2 {
		t.Errorf("ledger: the first subscription's last notification is %d, want %d (every notification is recorded)", s.LastNotificationSeq, first+2)
	}
}

// Each notification gets the next local sequence number of its session, in arrival order,
// duplicates included; a new session starts again from 1 under its new generation, and the
// ledger records the newest (generation, seq) per subscription.
func TestNotificationSequenceStrictlyIncreasing(t *testing.T) {
	f := newFixture(t)
	const u = "demo://notes/seq"
	s := f.subscribeURI(u)
	srv, src, sig, h, c, sub := s.srv, s.src, s.sig, s.h, s.c, s.sub
	sig.readOn(c) // every signal leads to a read, so that each notification is signalled
	const changes, copies = 40, 3
	srv.SetUpdateDuplicates(copies - 1)
	srv.ReorderUpdates(4)
	for i := range changes {
		srv.Set(u, fmt.Sprint(i+1), "text/plain")
	}
	// Bursts may be merged into one signal per routing batch; the pulses add up, and the
	// sequence numbers stay strictly increasing up to the last one.
	pulses := func(s []signal) (n int) {
		for _, u := range updates(s) {
			n += u.Pulses
		}
		return n
	}
	got := updates(sig.wait(t, "all notifications signalled", func(s []signal) bool { return pulses(s) >= changes*copies }))
	for i, g := range got {
		if g.SessionGeneration != c.Generation() || g.Pulses < 1 || (i > 0 && g.Seq <= got[i-1].Seq) {
			t.Fatalf("signal %d: generation %d seq %d pulses %d (all: %+v)", i, g.SessionGeneration, g.Seq, g.Pulses, got)
		}
	}
	if last := got[len(got)-1]; last.Seq != changes*copies {
		t.Errorf("last signal carries seq %d, want %d", last.Seq, changes*copies)
	}
	if s := f.sub(sub.ID); s.LastNotificationGen != c.Generation() || s.LastNotificationSeq != changes*copies {
		t.Errorf("ledger: last notification %d/%d, want %d/%d", s.LastNotificationGen, s.LastNotificationSeq, c.Generation(), changes*copies)
	}

	srv.ClearFaults()
	srv.Restart()
	c2 := f.waitSession(h, src.ID, c.Generation())
	sig.readOn(c2)
	sub = f.bind(f.sub(sub.ID), c2.Generation())
	if err := c2.Subscribe(f.ctx, u, sub.ID); err != nil {
		t.Fatal(err)
	}
	srv.Set(u, "after restart", "text/plain")
	before := len(got)
	got = updates(sig.wait(t, "notification of the new session", func(s []signal) bool { return len(updates(s)) > before }))
	want := update{WorkflowID: sub.WorkflowID, ResourceUpdated: contract.ResourceUpdated{SessionGeneration: c2.Generation(), Seq: 1, ServerURI: u, Pulses: 1}}
	if diff := cmp.Diff(want, got[len(got)-1]); diff != "" {
		t.Errorf("first notification of the new session (-want +got):\n%s", diff)
	}
}

// A notification that arrives on an old generation — here on the session of a host whose
// lease expired while another host opened the next generation — is provably ignored: an
// audit receipt NOTIFICATION_OLD_SESSION, no signal, and the subscription's notification
// watermark untouched. The same notification on the current generation is signalled.
func TestOldGenerationNotificationIsOnlyAudited(t *testing.T) {
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	const u = "demo://notes/1"
	srv.Set(u, "body", "text/plain")
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})

	// Host A claims once and never renews, as a host stalled by a long pause would; its
	// session stays open. A host's own watchdog closes its sessions at half the lease (issue
	// 12), so the lease is long and expired in the ledger directly, as the stall would have.
	sigA := newRecorder()
	hostA := f.startHost("host-a", mcphost.Options{Lease: time.Hour, ClaimInterval: time.Hour}, sigA)
	oldConn := f.waitSession(hostA, src.ID, 0)
	oldSeq := srv.Sessions()[0].Seq
	sub := f.activeSub(src.ID, u, oldConn.Generation())
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE sources SET lease_until = now() WHERE id = $1`, src.ID); err != nil {
		t.Fatal(err)
	}

	sigB := newRecorder()
	hostB := f.startHost("host-b", mcphost.Options{}, sigB)
	newConn := f.waitSession(hostB, src.ID, oldConn.Generation())
	sub = f.bind(f.sub(sub.ID), newConn.Generation())
	if cur, ok := hostA.Current(src.ID); !ok || cur != oldConn {
		t.Fatal("host A's old session ended; the test needs it open")
	}

	if err := srv.SendUpdate(oldSeq, u); err != nil {
		t.Fatal(err)
	}
	got := f.waitAudits(src.ID, 1)
	want := []audit{{Kind: mcpsync.ReceiptNotificationOld, Gen: oldConn.Generation(), URI: u, ServerURI: u, Seq: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audits (-want +got):\n%s", diff)
	}
	if s := updates(sigA.all()); len(s) != 0 {
		t.Errorf("host A signalled an old-generation notification: %+v", s)
	}
	if s := f.sub(sub.ID); s.LastNotificationGen != 0 || s.LastNotificationSeq != 0 || s.State != mcpsync.StateActive {
		t.Errorf("old-generation notification changed the subscription: %s, last notification %d/%d", s.State, s.LastNotificationGen, s.LastNotificationSeq)
	}
	if v, err := f.store.Versions(f.ctx, sub.ID); err != nil || len(v) != 0 {
		t.Errorf("versions: %+v, %v", v, err)
	}

	newSeq := srv.Sessions()[len(srv.Sessions())-1].Seq
	if err := srv.SendUpdate(newSeq, u); err != nil {
		t.Fatal(err)
	}
	gotB := updates(sigB.wait(t, "current-generation notification signalled", func(s []signal) bool { return len(updates(s)) > 0 }))
	wantB := []update{{WorkflowID: sub.WorkflowID, ResourceUpdated: contract.ResourceUpdated{SessionGeneration: newConn.Generation(), Seq: 1, ServerURI: u, Pulses: 1}}}
	if diff := cmp.Diff(wantB, gotB); diff != "" {
		t.Errorf("host B signals (-want +got):\n%s", diff)
	}
}

// Two subscriptions of the same server URI share one server-side subscription: only the
// first sends resources/subscribe, only the last holder sends resources/unsubscribe, and a
// lost unsubscribe acknowledgement keeps the holder, so that a retry sends again (R20). After
// a lost acknowledgement the server side is unknown, so the next subscriber subscribes again.
func TestSubscribeRefcount(t *testing.T) {
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	const u = "demo://notes/shared"
	srv.Set(u, "body", "text/plain")
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	h := f.startHost("host-a", mcphost.Options{}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
	const a, b = 101, 202

	type state struct {
		Sent               bool
		Err                bool
		Holders            []int64
		Subscribes, Unsubs int
		ServerSubscribed   bool
	}
	type step struct {
		name string
		mode chaosmcp.UnsubscribeMode
		op   string // "sub" or "unsub"
		id   int64
		want state
	}
	steps := []step{
		{"a subscribes first", chaosmcp.UnsubscribeNormal, "sub", a, state{Holders: []int64{a}, Subscribes: 1, ServerSubscribed: true}},
		{"b shares it", chaosmcp.UnsubscribeNormal, "sub", b, state{Holders: []int64{a, b}, Subscribes: 1, ServerSubscribed: true}},
		{"a again (retried activity)", chaosmcp.UnsubscribeNormal, "sub", a, state{Holders: []int64{a, b}, Subscribes: 1, ServerSubscribed: true}},
		{"a releases, b holds on", chaosmcp.UnsubscribeNormal, "unsub", a, state{Holders: []int64{b}, Subscribes: 1, ServerSubscribed: true}},
		{"a again holds nothing", chaosmcp.UnsubscribeNormal, "unsub", a, state{Holders: []int64{b}, Subscribes: 1, ServerSubscribed: true}},
		{"b last: acknowledgement lost", chaosmcp.UnsubscribeLoseResponse, "unsub", b, state{Sent: true, Err: true, Holders: []int64{b}, Subscribes: 1, Unsubs: 1}},
		{"b retries and is acknowledged", chaosmcp.UnsubscribeNormal, "unsub", b, state{Sent: true, Holders: []int64{}, Subscribes: 1, Unsubs: 2}},
		{"a subscribes anew", chaosmcp.UnsubscribeNormal, "sub", a, state{Holders: []int64{a}, Subscribes: 2, Unsubs: 2, ServerSubscribed: true}},
		{"a last: acknowledgement lost", chaosmcp.UnsubscribeLoseResponse, "unsub", a, state{Sent: true, Err: true, Holders: []int64{a}, Subscribes: 2, Unsubs: 3}},
		{"b subscribes while the server side is unknown", chaosmcp.UnsubscribeNormal, "sub", b, state{Holders: []int64{a, b}, Subscribes: 3, Unsubs: 3, ServerSubscribed: true}},
		{"a's retry only drops its hold", chaosmcp.UnsubscribeNormal, "unsub", a, state{Holders: []int64{b}, Subscribes: 3, Unsubs: 3, ServerSubscribed: true}},
	}
	for _, st := range steps {
		srv.SetUnsubscribeMode(st.mode)
		timeout := 20 * time.Second
		if st.mode == chaosmcp.UnsubscribeLoseResponse {
			timeout = time.Second // the acknowledgement never comes: give up, as the activity would
		}
		ctx, cancel := context.WithTimeout(f.ctx, timeout)
		var got state
		var err error
		if st.op == "sub" {
			err = c.Subscribe(ctx, u, st.id)
		} else {
			got.Sent, err = c.Unsubscribe(ctx, u, st.id)
		}
		cancel()
		got.Err = err != nil
		got.Holders = c.Holders(u)
		stats := srv.Stats()
		got.Subscribes, got.Unsubs = stats.SubscribeCalls, stats.UnsubscribeCalls
		got.ServerSubscribed = stats.Subscriptions[u] > 0
		if diff := cmp.Diff(st.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s (err %v): (-want +got):\n%s", st.name, err, diff)
		}
	}
}

// A subscribe that arrives while the URI's last holder is unsubscribing waits for that
// unsubscribe to finish and then subscribes again, so it can never be overtaken by it and be
// left without a server-side subscription.
func TestSubscribeWaitsForInFlightUnsubscribe(t *testing.T) {
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	const u = "demo://notes/shared"
	srv.Set(u, "body", "text/plain")
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	h := f.startHost("host-a", mcphost.Options{}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
	const a, b = 101, 202
	if err := c.Subscribe(f.ctx, u, a); err != nil {
		t.Fatal(err)
	}
	srv.SetUnsubscribeMode(chaosmcp.UnsubscribeLoseResponse)
	unsubDone := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(f.ctx, time.Second)
		defer cancel()
		_, _ = c.Unsubscribe(ctx, u, a)
		unsubDone <- time.Now()
	}()
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	if err := srv.Await(ctx, func(s chaosmcp.Stats) bool { return s.UnsubscribesUnanswered == 1 }); err != nil {
		t.Fatal(err)
	}
	srv.SetUnsubscribeMode(chaosmcp.UnsubscribeNormal)
	if err := c.Subscribe(f.ctx, u, b); err != nil {
		t.Fatal(err)
	}
	subscribed := time.Now()
	unsubscribed := <-unsubDone
	if subscribed.Before(unsubscribed) {
		t.Errorf("subscribe returned %v before the in-flight unsubscribe ended", unsubscribed.Sub(subscribed))
	}
	st := srv.Stats()
	if st.SubscribeCalls != 2 || st.Subscriptions[u] != 1 {
		t.Errorf("server: %d subscribe calls, %d live subscriptions of %s; want 2 and 1", st.SubscribeCalls, st.Subscriptions[u], u)
	}
	if diff := cmp.Diff([]int64{a, b}, c.Holders(u)); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
}
