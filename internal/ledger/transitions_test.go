package ledger_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// rowCounts counts every row a guarded transition can write, so a test can prove that a
// replay wrote nothing.
type rowCounts struct {
	Receipts, Dispatches, Versions, Outbox int
}

func (f *fixture) rows() rowCounts {
	f.t.Helper()
	var c rowCounts
	err := f.st.Pool().QueryRow(f.ctx, `SELECT
		(SELECT count(*) FROM receipts), (SELECT count(*) FROM read_dispatches),
		(SELECT count(*) FROM resource_versions), (SELECT count(*) FROM invalidation_outbox)`).
		Scan(&c.Receipts, &c.Dispatches, &c.Versions, &c.Outbox)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// receiptsWithKey counts the receipts recorded under an idempotency key.
func (f *fixture) receiptsWithKey(key string) int {
	f.t.Helper()
	var n int
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(*) FROM receipts WHERE idem_key = $1`, key).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) allocReq(req string) ledger.AllocateRequest {
	return ledger.AllocateRequest{SubscriptionID: f.sub.ID, Generation: f.sub.Generation,
		SessionGeneration: f.sess.Generation, URI: testURI, RequestID: req, Reason: mcpsync.ReasonNotification}
}

func (f *fixture) acceptReq(d dispatched, body string) ledger.AcceptRequest {
	return ledger.AcceptRequest{SubscriptionID: f.sub.ID, Generation: d.gen, SessionGeneration: d.sgen,
		URI: testURI, Ordinal: d.ord, RequestID: d.req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: ledger.Digest([]byte(body)), Size: int64(len(body))}}
}

func (f *fixture) notFoundReq(d dispatched) ledger.NotFoundRequest {
	return ledger.NotFoundRequest{SubscriptionID: f.sub.ID, Generation: d.gen, SessionGeneration: d.sgen,
		URI: testURI, Ordinal: d.ord, RequestID: d.req}
}

// dispatched is a read the fixture allocated, with the identity it was allocated under.
type dispatched struct {
	ord       int64
	req       string
	gen, sgen int64
}

func (f *fixture) issue(req string) dispatched {
	f.t.Helper()
	d := f.dispatch(req)
	if d.Outcome != mcpsync.OutcomeAllocated {
		f.t.Fatalf("dispatch %s: %+v", req, d)
	}
	return dispatched{ord: d.Ordinal, req: req, gen: f.sub.Generation, sgen: f.sess.Generation}
}

func (f *fixture) mustAccept(d dispatched, body string) {
	f.t.Helper()
	r, err := f.st.AcceptResourceVersion(f.ctx, f.acceptReq(d, body))
	if err != nil || r.Outcome != mcpsync.OutcomeAccepted {
		f.t.Fatalf("accept %+v: %+v %v", d, r, err)
	}
}

// closeAndReopen closes the subscription and subscribes again under the next generation,
// active on the current session.
func (f *fixture) closeAndReopen() {
	f.t.Helper()
	cr, err := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, "test")
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch); err != nil {
		f.t.Fatal(err)
	}
	sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-1"})
	if err != nil {
		f.t.Fatal(err)
	}
	f.sub = sub
	f.activate()
}

// newSessionActive opens the next session and re-establishes the subscription on it.
func (f *fixture) newSessionActive() {
	f.t.Helper()
	f.openSession()
	f.refresh()
	f.activate()
}

func (f *fixture) closeFence() ledger.CloseResult {
	f.t.Helper()
	cr, err := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, "test")
	if err != nil || cr.Outcome != mcpsync.OutcomeTransitioned {
		f.t.Fatalf("begin unsubscribe: %+v %v", cr, err)
	}
	return cr
}

func (f *fixture) markRR() {
	f.t.Helper()
	r, err := f.st.MarkReconciliationRequired(f.ctx, f.sub.ID, f.sub.Generation, "test")
	if err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
		f.t.Fatalf("mark reconciliation required: %+v %v", r, err)
	}
}

// R14, R12, R18: every outcome of AllocateReadOrdinal, each with exactly one receipt, and a
// replay of the same request ID that returns the first outcome and writes nothing, even after
// the subscription changed.
func TestAllocateReadOrdinalOutcomes(t *testing.T) {
	tests := []struct {
		name string
		// setup prepares the fixture and returns the request to send.
		setup func(f *fixture) ledger.AllocateRequest
		want  ledger.Dispatch
		// after changes the subscription before the replay.
		after func(f *fixture)
	}{
		{"active", func(f *fixture) ledger.AllocateRequest { return f.allocReq("r") },
			ledger.Dispatch{Outcome: mcpsync.OutcomeAllocated, Ordinal: 1, State: mcpsync.StateActive}, f0},
		{"active after earlier reads", func(f *fixture) ledger.AllocateRequest {
			f.issue("a")
			f.issue("b")
			return f.allocReq("r")
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeAllocated, Ordinal: 3, State: mcpsync.StateActive}, (*fixture).markRR},
		{"closing", func(f *fixture) ledger.AllocateRequest {
			f.closeFence()
			return f.allocReq("r")
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeNotActive, State: mcpsync.StateUnsubscribing}, f0},
		{"reconciliation required, then active again", func(f *fixture) ledger.AllocateRequest {
			f.markRR()
			return f.allocReq("r")
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeNotActive, State: mcpsync.StateReconciliationRequired}, (*fixture).activate},
		{"tombstone pending", func(f *fixture) ledger.AllocateRequest {
			d := f.issue("gone")
			if o, err := f.st.RecordNotFound(f.ctx, f.notFoundReq(d)); err != nil || o != mcpsync.OutcomeTombstonePending {
				f.t.Fatalf("not found: %s %v", o, err)
			}
			return f.allocReq("r")
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeNotActive, State: mcpsync.StateTombstonePending}, f0},
		{"old generation", func(f *fixture) ledger.AllocateRequest {
			req := f.allocReq("r")
			f.closeAndReopen()
			return req
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeOldGeneration, State: mcpsync.StateActive}, f0},
		{"unknown generation", func(f *fixture) ledger.AllocateRequest {
			req := f.allocReq("r")
			req.Generation++
			return req
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeRefused, State: mcpsync.StateActive}, f0},
		{"old session", func(f *fixture) ledger.AllocateRequest {
			req := f.allocReq("r")
			f.newSessionActive()
			return req
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeOldSession, State: mcpsync.StateActive}, f0},
		{"old session before re-subscribing", func(f *fixture) ledger.AllocateRequest {
			req := f.allocReq("r")
			f.openSession()
			return req
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeOldSession, State: mcpsync.StateReconciliationRequired}, f0},
		{"new session before re-subscribing", func(f *fixture) ledger.AllocateRequest {
			f.openSession()
			return f.allocReq("r")
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeNotActive, State: mcpsync.StateReconciliationRequired}, (*fixture).activate},
		{"other URI", func(f *fixture) ledger.AllocateRequest {
			req := f.allocReq("r")
			req.URI = "demo://notes/2"
			return req
		}, ledger.Dispatch{Outcome: mcpsync.OutcomeRefused, State: mcpsync.StateActive}, f0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			req := tt.setup(f)
			got, err := f.st.AllocateReadOrdinal(f.ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			key := fmt.Sprintf("allocate/%d/%s", req.SubscriptionID, req.RequestID)
			if n := f.receiptsWithKey(key); n != 1 {
				t.Errorf("receipts for the call: %d, want 1", n)
			}
			tt.after(f)
			before := f.rows()
			again, err := f.st.AllocateReadOrdinal(f.ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, again); diff != "" {
				t.Errorf("replay (-first +replay):\n%s", diff)
			}
			if diff := cmp.Diff(before, f.rows()); diff != "" {
				t.Errorf("replay wrote rows (-before +after):\n%s", diff)
			}
		})
	}
}

func f0(*fixture) {}

func errorsIsInvalid(err error) bool { return errors.Is(err, ledger.ErrInvalid) }

func TestAllocateRejectsMalformedRequests(t *testing.T) {
	f := newFixture(t)
	for _, req := range []ledger.AllocateRequest{
		{SubscriptionID: f.sub.ID, Generation: 1, SessionGeneration: 1, URI: testURI, RequestID: "", Reason: mcpsync.ReasonPoll},
		{SubscriptionID: f.sub.ID, Generation: 1, SessionGeneration: 1, URI: testURI, RequestID: "r", Reason: "whim"},
	} {
		if _, err := f.st.AllocateReadOrdinal(f.ctx, req); !errorsIsInvalid(err) {
			t.Errorf("AllocateReadOrdinal(%+v) = %v, want ErrInvalid", req, err)
		}
	}
}

// answer is one read response offered to the ledger: content (body) or not-found.
type answer struct {
	notFound bool
	body     string
}

func (f *fixture) answer(d dispatched, a answer) mcpsync.Outcome {
	f.t.Helper()
	if a.notFound {
		o, err := f.st.RecordNotFound(f.ctx, f.notFoundReq(d))
		if err != nil {
			f.t.Fatal(err)
		}
		return o
	}
	r, err := f.st.AcceptResourceVersion(f.ctx, f.acceptReq(d, a.body))
	if err != nil {
		f.t.Fatal(err)
	}
	return r.Outcome
}

func (f *fixture) answerKey(d dispatched, a answer) string {
	if a.notFound {
		return fmt.Sprintf("notfound/%d/%d/%s", f.sub.ID, d.ord, d.req)
	}
	return fmt.Sprintf("accept/%d/%d/%s/%s", f.sub.ID, d.ord, d.req, ledger.Digest([]byte(a.body)))
}

// R15–R17, R19, R21, R12: every outcome of AcceptResourceVersion and RecordNotFound. Each
// answer leaves exactly one receipt; what it writes besides is as the outcome says; a replay
// returns the first outcome and writes nothing.
func TestAnswerOutcomes(t *testing.T) {
	type effect struct {
		Versions, Outbox, Watermark int64
		State                       mcpsync.State
	}
	tests := []struct {
		name string
		// setup returns the dispatch to answer (after preparing the subscription).
		setup  func(f *fixture) dispatched
		answer answer
		want   mcpsync.Outcome
		// delta is what the answer adds to versions and outbox; Watermark and State are
		// absolute values afterwards.
		delta effect
	}{
		{"content above the watermark", func(f *fixture) dispatched { return f.issue("r") },
			answer{body: "v1"}, mcpsync.OutcomeAccepted, effect{1, 1, 1, mcpsync.StateActive}},
		{"same content again: revalidated", func(f *fixture) dispatched {
			f.mustAccept(f.issue("a"), "v1")
			return f.issue("r")
		}, answer{body: "v1"}, mcpsync.OutcomeRevalidated, effect{0, 0, 2, mcpsync.StateActive}},
		{"late read below the watermark (R17)", func(f *fixture) dispatched {
			late := f.issue("late")
			f.mustAccept(f.issue("b"), "v2")
			return late
		}, answer{body: "v1"}, mcpsync.OutcomeStale, effect{0, 0, 2, mcpsync.StateActive}},
		{"late not-found below the watermark", func(f *fixture) dispatched {
			late := f.issue("late")
			f.mustAccept(f.issue("b"), "v2")
			return late
		}, answer{notFound: true}, mcpsync.OutcomeStale, effect{0, 0, 2, mcpsync.StateActive}},
		{"content after the close fence, sent before (R19)", func(f *fixture) dispatched {
			d := f.issue("r")
			f.closeFence()
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeStaleAfterClose, effect{0, 0, 0, mcpsync.StateUnsubscribing}},
		{"not-found after CLOSED (R19)", func(f *fixture) dispatched {
			d := f.issue("r")
			cr := f.closeFence()
			if _, err := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch); err != nil {
				f.t.Fatal(err)
			}
			return d
		}, answer{notFound: true}, mcpsync.OutcomeStaleAfterClose, effect{0, 0, 0, mcpsync.StateClosed}},
		{"not-found on ACTIVE (R21)", func(f *fixture) dispatched { return f.issue("r") },
			answer{notFound: true}, mcpsync.OutcomeTombstonePending, effect{0, 0, 1, mcpsync.StateTombstonePending}},
		{"content while tombstone pending", func(f *fixture) dispatched {
			d := f.issue("r")
			f.answer(f.issue("gone"), answer{notFound: true})
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeStale, effect{0, 0, 2, mcpsync.StateTombstonePending}},
		{"read of an old session (R12)", func(f *fixture) dispatched {
			d := f.issue("r")
			f.newSessionActive()
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeOldSession, effect{0, 0, 0, mcpsync.StateActive}},
		{"read of an old session before re-subscribing", func(f *fixture) dispatched {
			d := f.issue("r")
			f.openSession()
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeStale, effect{0, 0, 0, mcpsync.StateReconciliationRequired}},
		{"read of an old generation (R12)", func(f *fixture) dispatched {
			d := f.issue("r")
			f.closeAndReopen()
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeOldGeneration, effect{0, 0, 0, mcpsync.StateActive}},
		{"forged request ID", func(f *fixture) dispatched {
			d := f.issue("r")
			d.req = "forged"
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeNotDispatched, effect{0, 0, 0, mcpsync.StateActive}},
		{"ordinal never issued", func(f *fixture) dispatched {
			return dispatched{ord: 9, req: "r9", gen: f.sub.Generation, sgen: f.sess.Generation}
		}, answer{body: "v1"}, mcpsync.OutcomeNotDispatched, effect{0, 0, 0, mcpsync.StateActive}},
		{"dispatch named with another session", func(f *fixture) dispatched {
			d := f.issue("r")
			d.sgen++
			return d
		}, answer{body: "v1"}, mcpsync.OutcomeNotDispatched, effect{0, 0, 0, mcpsync.StateActive}},
		{"second, different content for an answered dispatch", func(f *fixture) dispatched {
			d := f.issue("r")
			f.mustAccept(d, "v1")
			return d
		}, answer{body: "v2"}, mcpsync.OutcomeDuplicate, effect{0, 0, 1, mcpsync.StateActive}},
		{"not-found for a dispatch answered with content", func(f *fixture) dispatched {
			d := f.issue("r")
			f.mustAccept(d, "v1")
			return d
		}, answer{notFound: true}, mcpsync.OutcomeDuplicate, effect{0, 0, 1, mcpsync.StateActive}},
		{"content for a dispatch already refused", func(f *fixture) dispatched {
			d := f.issue("r")
			f.markRR()
			if o := f.answer(d, answer{body: "v1"}); o != mcpsync.OutcomeStale {
				f.t.Fatalf("answer while RECONCILIATION_REQUIRED: %s", o)
			}
			f.activate()
			return d
		}, answer{body: "v2"}, mcpsync.OutcomeDuplicate, effect{0, 0, 0, mcpsync.StateActive}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := tt.setup(f)
			before := f.rows()
			got := f.answer(d, tt.answer)
			if got != tt.want {
				t.Errorf("outcome %s, want %s", got, tt.want)
			}
			after := f.rows()
			sub := f.refresh()
			gotEffect := effect{int64(after.Versions - before.Versions), int64(after.Outbox - before.Outbox), sub.LastAcceptedOrdinal, sub.State}
			if diff := cmp.Diff(tt.delta, gotEffect); diff != "" {
				t.Errorf("effect (-want +got):\n%s", diff)
			}
			if n := f.receiptsWithKey(f.answerKey(d, tt.answer)); n != 1 {
				t.Errorf("receipts for the answer: %d, want exactly 1", n)
			}
			if again := f.answer(d, tt.answer); again != got {
				t.Errorf("replay: %s, first %s", again, got)
			}
			if diff := cmp.Diff(after, f.rows()); diff != "" {
				t.Errorf("replay wrote rows (-before +after):\n%s", diff)
			}
		})
	}
}

// R18, R20: the closing transitions, their refusals, and replays that return the first outcome
// (with the fence first frozen) and write nothing.
func TestClosingTransitions(t *testing.T) {
	type step struct {
		op   string // begin, complete, unknown, activate
		want mcpsync.Outcome
		// state is the subscription's state afterwards.
		state mcpsync.State
		// replay: an earlier step made the same call and recorded its outcome, so this one
		// must write nothing.
		replay bool
	}
	tests := []struct {
		name  string
		setup func(f *fixture)
		steps []step
	}{
		{"begin, complete", f0, []step{
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing, false},
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing, true},
			{"complete", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, false},
			{"complete", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, true},
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, true},
			{"unknown", mcpsync.OutcomeRefused, mcpsync.StateClosed, false},
			{"unknown", mcpsync.OutcomeRefused, mcpsync.StateClosed, true},
			{"activate", mcpsync.OutcomeRefused, mcpsync.StateClosed, true},
		}},
		{"begin, ack lost, complete", f0, []step{
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing, false},
			{"unknown", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribeUnknown, false},
			{"unknown", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribeUnknown, true},
			{"activate", mcpsync.OutcomeRefused, mcpsync.StateUnsubscribeUnknown, true},
			{"complete", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, false},
			{"unknown", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, true},
		}},
		{"begin from reconciliation required", (*fixture).markRR, []step{
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing, false},
			{"complete", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, false},
		}},
		{"complete before the fence does not pre-empt the real close", f0, []step{
			{"complete", mcpsync.OutcomeRefused, mcpsync.StateActive, true},
			{"unknown", mcpsync.OutcomeRefused, mcpsync.StateActive, true},
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing, false},
			{"unknown", mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribeUnknown, false},
			{"complete", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, false},
		}},
		{"session ends while unsubscribing (R20)", func(f *fixture) {
			f.closeFence()
			if err := f.st.EndSession(f.ctx, f.src.ID, f.sess.Generation, "gone"); err != nil {
				f.t.Fatal(err)
			}
		}, []step{
			{"begin", mcpsync.OutcomeTransitioned, mcpsync.StateClosed, true},
			{"complete", mcpsync.OutcomeAlreadyDone, mcpsync.StateClosed, false},
			{"complete", mcpsync.OutcomeAlreadyDone, mcpsync.StateClosed, true},
			{"unknown", mcpsync.OutcomeRefused, mcpsync.StateClosed, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.issue("r1")
			f.issue("r2")
			tt.setup(f)
			epoch := f.refresh().CloseEpoch + 1
			if f.sub.State.Closing() {
				epoch = f.sub.CloseEpoch
			}
			for i, s := range tt.steps {
				before := f.rows()
				var got mcpsync.Outcome
				var err error
				switch s.op {
				case "begin":
					var cr ledger.CloseResult
					cr, err = f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, "test")
					got = cr.Outcome
					if err == nil && cr.Outcome == mcpsync.OutcomeTransitioned && (cr.CloseOrdinal != 2 || cr.CloseEpoch != epoch) {
						t.Errorf("step %d: fence ordinal %d epoch %d, want 2 and %d", i, cr.CloseOrdinal, cr.CloseEpoch, epoch)
					}
				case "complete":
					var r ledger.TransitionResult
					r, err = f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, epoch)
					got = r.Outcome
				case "unknown":
					var r ledger.TransitionResult
					r, err = f.st.MarkUnsubscribeUnknown(f.ctx, f.sub.ID, f.sub.Generation, epoch, "ack lost")
					got = r.Outcome
				case "activate":
					var r ledger.TransitionResult
					r, err = f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
					got = r.Outcome
				}
				if err != nil {
					t.Fatalf("step %d %s: %v", i, s.op, err)
				}
				if got != s.want || f.refresh().State != s.state {
					t.Errorf("step %d %s: %s, state %s; want %s, state %s", i, s.op, got, f.sub.State, s.want, s.state)
				}
				if s.replay {
					if diff := cmp.Diff(before, f.rows()); diff != "" {
						t.Errorf("step %d: %s (a replay or a refusal) wrote rows (-before +after):\n%s", i, s.op, diff)
					}
				}
			}
			if sub := f.refresh(); sub.CloseOrdinal == nil && sub.State.Closing() {
				t.Errorf("closing without a close ordinal: %+v", sub)
			}
		})
	}
}

// R12: a closing call naming an earlier subscription generation is refused as OLD_GENERATION
// and never touches the reopened subscription.
func TestClosingOldGeneration(t *testing.T) {
	f := newFixture(t)
	oldGen := f.sub.Generation
	cr := f.closeFence()
	f.closeAndReopenAfterFence(cr)
	tests := []struct {
		name string
		call func() (mcpsync.Outcome, error)
	}{
		{"complete", func() (mcpsync.Outcome, error) {
			r, err := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, oldGen, cr.CloseEpoch+1)
			return r.Outcome, err
		}},
		{"unknown", func() (mcpsync.Outcome, error) {
			r, err := f.st.MarkUnsubscribeUnknown(f.ctx, f.sub.ID, oldGen, cr.CloseEpoch+1, "x")
			return r.Outcome, err
		}},
		{"mark reconciliation required", func() (mcpsync.Outcome, error) {
			r, err := f.st.MarkReconciliationRequired(f.ctx, f.sub.ID, oldGen, "x")
			return r.Outcome, err
		}},
		{"activate", func() (mcpsync.Outcome, error) {
			r, err := f.st.Activate(f.ctx, f.sub.ID, oldGen, f.sess.Generation)
			return r.Outcome, err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.call()
			if err != nil || got != mcpsync.OutcomeOldGeneration {
				t.Errorf("%s with generation %d: %s %v, want OLD_GENERATION", tt.name, oldGen, got, err)
			}
			if sub := f.refresh(); sub.State != mcpsync.StateActive || sub.Generation != oldGen+1 {
				t.Errorf("reopened subscription changed: %s generation %d", sub.State, sub.Generation)
			}
		})
	}
	// The fence of the old generation replays as it was frozen.
	again, err := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, oldGen, "again")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ledger.CloseResult{Outcome: mcpsync.OutcomeTransitioned, State: mcpsync.StateActive, CloseOrdinal: cr.CloseOrdinal, CloseEpoch: cr.CloseEpoch, SessionGeneration: cr.SessionGeneration}, again); diff != "" {
		t.Errorf("replayed fence of the old generation (-want +got):\n%s", diff)
	}
}

func (f *fixture) closeAndReopenAfterFence(cr ledger.CloseResult) {
	f.t.Helper()
	if r, err := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
		f.t.Fatalf("complete: %+v %v", r, err)
	}
	sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-1"})
	if err != nil {
		f.t.Fatal(err)
	}
	f.sub = sub
	f.activate()
}

// R12: session generations are allocated and closed per source; a write carrying an older
// session generation is refused.
func TestSessionGenerations(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *fixture) int64 // returns the generation to close
		want  mcpsync.Outcome
		state mcpsync.State
	}{
		{"current session", func(f *fixture) int64 { return f.sess.Generation }, mcpsync.OutcomeTransitioned, mcpsync.StateReconciliationRequired},
		{"already ended", func(f *fixture) int64 {
			if err := f.st.EndSession(f.ctx, f.src.ID, f.sess.Generation, "first"); err != nil {
				f.t.Fatal(err)
			}
			return f.sess.Generation
		}, mcpsync.OutcomeAlreadyDone, mcpsync.StateReconciliationRequired},
		{"superseded session", func(f *fixture) int64 {
			old := f.sess.Generation
			f.newSessionActive()
			return old
		}, mcpsync.OutcomeOldSession, mcpsync.StateActive},
		{"never opened", func(f *fixture) int64 { return f.sess.Generation + 5 }, mcpsync.OutcomeRefused, mcpsync.StateActive},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			gen := tt.setup(f)
			before := f.rows()
			got, err := f.st.CloseSession(f.ctx, f.src.ID, gen, "test")
			if err != nil || got != tt.want {
				t.Errorf("CloseSession(%d): %s %v, want %s", gen, got, err, tt.want)
			}
			if got != mcpsync.OutcomeTransitioned {
				if diff := cmp.Diff(before, f.rows()); diff != "" {
					t.Errorf("refused close wrote rows (-before +after):\n%s", diff)
				}
			}
			if sub := f.refresh(); sub.State != tt.state {
				t.Errorf("subscription %s, want %s", sub.State, tt.state)
			}
		})
	}
}

// R12: establishing a subscription only works on the source's current, live session, and an
// AlreadyDone answer is only given to a call on the very session the state belongs to.
func TestSubscribeTransitionsOnSessions(t *testing.T) {
	f := newFixture(t)
	old := f.sess
	f.openSession() // the subscription is now RECONCILIATION_REQUIRED
	tests := []struct {
		name string
		call func() (ledger.TransitionResult, error)
		want ledger.TransitionResult
	}{
		{"begin on the old session", func() (ledger.TransitionResult, error) {
			return f.st.BeginSubscribe(f.ctx, f.sub.ID, f.sub.Generation, old.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeOldSession, State: mcpsync.StateReconciliationRequired, Reason: "session changed to generation 2"}},
		{"begin on the new session", func() (ledger.TransitionResult, error) {
			return f.st.BeginSubscribe(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeTransitioned, State: mcpsync.StateSubscribing}},
		{"begin again on the new session", func() (ledger.TransitionResult, error) {
			return f.st.BeginSubscribe(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeAlreadyDone, State: mcpsync.StateSubscribing}},
		{"activate on the old session", func() (ledger.TransitionResult, error) {
			return f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, old.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeOldSession, State: mcpsync.StateSubscribing}},
		{"activate on the new session", func() (ledger.TransitionResult, error) {
			return f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeTransitioned, State: mcpsync.StateActive}},
		{"activate again on the old session", func() (ledger.TransitionResult, error) {
			return f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, old.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeOldSession, State: mcpsync.StateActive}},
		{"activate again on the new session", func() (ledger.TransitionResult, error) {
			return f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeAlreadyDone, State: mcpsync.StateActive}},
		{"restore without a tombstone", func() (ledger.TransitionResult, error) {
			return f.st.RestoreFromTombstone(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeAlreadyDone, State: mcpsync.StateActive}},
		{"mark reconciliation required", func() (ledger.TransitionResult, error) {
			return f.st.MarkReconciliationRequired(f.ctx, f.sub.ID, f.sub.Generation, "doubt")
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeTransitioned, State: mcpsync.StateReconciliationRequired, Reason: "doubt"}},
		{"end the session, then begin on it", func() (ledger.TransitionResult, error) {
			if err := f.st.EndSession(f.ctx, f.src.ID, f.sess.Generation, "gone"); err != nil {
				t.Fatal(err)
			}
			return f.st.BeginSubscribe(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		}, ledger.TransitionResult{Outcome: mcpsync.OutcomeRefused, State: mcpsync.StateReconciliationRequired, Reason: "doubt"}},
	}
	for _, tt := range tests { // in order: each step builds on the previous one
		got, err := tt.call()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

// R21: a tombstone-pending subscription returns to ACTIVE only on its live session, and a
// not-found answer raised the watermark, so no older read is accepted afterwards.
func TestTombstoneRestore(t *testing.T) {
	f := newFixture(t)
	older := f.issue("older")
	f.answer(f.issue("gone"), answer{notFound: true})
	r, err := f.st.RestoreFromTombstone(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
	if err != nil || r.Outcome != mcpsync.OutcomeTransitioned || r.State != mcpsync.StateActive {
		t.Fatalf("restore: %+v %v", r, err)
	}
	if o := f.answer(older, answer{body: "old"}); o != mcpsync.OutcomeStale {
		t.Errorf("older read after the not-found: %s, want STALE", o)
	}
	if o := f.answer(f.issue("again"), answer{body: "back"}); o != mcpsync.OutcomeAccepted {
		t.Errorf("re-read after restore: %s, want ACCEPTED", o)
	}
}

// Temporal may run an activity's attempts concurrently (a timed-out attempt still running when
// the retry starts): identical calls racing each other all get the first outcome, and the
// ledger holds exactly one of everything they write.
func TestConcurrentReplays(t *testing.T) {
	const racers = 8
	tests := []struct {
		name string
		call func(f *fixture, d dispatched) (string, error)
		want string
	}{
		{"allocate", func(f *fixture, _ dispatched) (string, error) {
			d, err := f.st.AllocateReadOrdinal(f.ctx, f.allocReq("same"))
			return fmt.Sprintf("%s %d", d.Outcome, d.Ordinal), err
		}, "ALLOCATED 2"},
		{"accept", func(f *fixture, d dispatched) (string, error) {
			r, err := f.st.AcceptResourceVersion(f.ctx, f.acceptReq(d, "v1"))
			return string(r.Outcome), err
		}, string(mcpsync.OutcomeAccepted)},
		{"not-found", func(f *fixture, d dispatched) (string, error) {
			o, err := f.st.RecordNotFound(f.ctx, f.notFoundReq(d))
			return string(o), err
		}, string(mcpsync.OutcomeTombstonePending)},
		{"late answer", func(f *fixture, d dispatched) (string, error) {
			r, err := f.st.AcceptResourceVersion(f.ctx, f.acceptReq(dispatched{ord: d.ord, req: d.req, gen: d.gen, sgen: d.sgen + 1}, "v1"))
			return string(r.Outcome), err
		}, string(mcpsync.OutcomeNotDispatched)},
		{"begin unsubscribe", func(f *fixture, _ dispatched) (string, error) {
			cr, err := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, "race")
			return fmt.Sprintf("%s %d %d", cr.Outcome, cr.CloseOrdinal, cr.CloseEpoch), err
		}, "TRANSITIONED 1 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := f.issue("r1")
			before := f.rows()
			got := make([]string, racers)
			errs := make([]error, racers)
			var wg sync.WaitGroup
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], errs[i] = tt.call(f, d)
				}()
			}
			wg.Wait()
			for i := range racers {
				if errs[i] != nil || got[i] != tt.want {
					t.Errorf("racer %d: %q %v, want %q", i, got[i], errs[i], tt.want)
				}
			}
			after := f.rows()
			if n := after.Receipts - before.Receipts; n != 1 {
				t.Errorf("%d racing identical calls wrote %d receipts, want 1", racers, n)
			}
			if after.Versions-before.Versions > 1 || after.Outbox-before.Outbox > 1 || after.Dispatches-before.Dispatches > 1 {
				t.Errorf("racing identical calls wrote twice (-before +after):\n%s", cmp.Diff(before, after))
			}
		})
	}
}
