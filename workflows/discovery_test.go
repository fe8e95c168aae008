package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
)

// scripted is one round as the fake round activity plays it.
type scripted struct {
	set         string
	snapshot    string // the ID every page carries
	listChanged int64
	failed      string   // a failure kind the round reports
	stale       bool     // the activity fails with StaleSession
	uris        []string // the entries; nil: one entry named after the set
}

// fakeRounds stands in for the session-bound round activity: it plays scripted rounds in
// order and records them in the real ledger, as the real round does.
type fakeRounds struct {
	store *ledger.Store
	mu    sync.Mutex
	plays []scripted
	ran   []contract.RoundInput
}

func (f *fakeRounds) round(ctx context.Context, in contract.RoundInput) (contract.RoundResult, error) {
	f.mu.Lock()
	i := len(f.ran)
	f.ran = append(f.ran, in)
	if i >= len(f.plays) {
		f.mu.Unlock()
		return contract.RoundResult{}, fmt.Errorf("round %d was not scripted", i+1)
	}
	p := f.plays[i]
	f.mu.Unlock()
	if p.stale {
		return contract.RoundResult{}, temporal.NewNonRetryableApplicationError("session gone", contract.ErrTypeStaleSession, nil)
	}
	id, started, err := f.store.BeginScan(ctx, ledger.ScanStart{Key: in.ScanKey, Run: in.ScanRun, ScanWorkflowID: in.ScanWorkflowID,
		Round: in.Round, SourceID: in.SourceID, SessionGeneration: in.SessionGeneration})
	if err != nil {
		return contract.RoundResult{}, err
	}
	sess, err := f.store.CurrentSession(ctx, in.SourceID)
	if err != nil {
		return contract.RoundResult{}, err
	}
	end := ledger.ScanEnd{ScanID: id, FailureKind: p.failed, Failure: p.failed, SetDigest: "sha256:" + p.set,
		Progress: ledger.ScanProgress{ResourcePages: 2, TemplatePages: 1, Resources: 3}, ListChangedAfter: p.listChanged}
	if p.failed != "" {
		end.SetDigest = ""
	}
	if p.snapshot != "" {
		end.SnapshotIDs, end.SnapshotPages, end.SnapshotID = []string{p.snapshot}, 3, p.snapshot
	}
	if p.uris == nil {
		p.uris = []string{"demo://" + p.set}
	}
	var entries []ledger.ScanEntry
	for _, u := range p.uris {
		entries = append(entries, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u})
	}
	ended, err := f.store.EndScan(ctx, end, entries)
	if err != nil {
		return contract.RoundResult{}, err
	}
	return contract.RoundResult{ScanID: id, Round: in.Round, SessionGeneration: in.SessionGeneration, Complete: p.failed == "",
		FailureKind: p.failed, ResourcePages: 2, TemplatePages: 1, Resources: 3, SetDigest: end.SetDigest,
		SnapshotNegotiated: sess.Caps.SnapshotIDs, SnapshotIDs: end.SnapshotIDs, SnapshotPages: end.SnapshotPages,
		SnapshotID: end.SnapshotID, ListChangedObserved: p.listChanged, StartedAt: started, EndedAt: ended}, nil
}

// registerRounds registers round as the round activity and, paired by activities.PairRounds,
// as the round-pair activity, as the worker's host registers both.
func registerRounds(env *testsuite.TestWorkflowEnvironment, st *ledger.Store, round func(context.Context, contract.RoundInput) (contract.RoundResult, error)) {
	env.RegisterActivityWithOptions(round, activity.RegisterOptions{Name: contract.ActDiscoveryRound})
	env.RegisterActivityWithOptions(func(ctx context.Context, in contract.RoundPairInput) ([]contract.RoundResult, error) {
		return activities.PairRounds(ctx, in, round, st.AbandonScan)
	}, activity.RegisterOptions{Name: contract.ActDiscoveryRoundPair})
}

type discoveryHarness struct {
	t   *testing.T
	ctx context.Context
	st  *ledger.Store
	src ledger.Source
	env *testsuite.TestWorkflowEnvironment
}

func newDiscoveryHarness(t *testing.T, snapshot bool) *discoveryHarness {
	t.Helper()
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "demo", Transport: ledger.TransportStdio, Command: []string{"demo"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, hostQueue, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.OpenSession(ctx, src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, SnapshotIDs: snapshot}); err != nil {
		t.Fatal(err)
	}
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestWorkflowEnvironment()
	env.SetTestTimeout(60 * time.Second)
	(&activities.Ledger{Store: st}).Register(env)
	(&activities.Catalog{Store: st}).Register(env)
	return &discoveryHarness{t: t, ctx: ctx, st: st, src: src, env: env}
}

// DiscoveryScanWorkflow reaches every proof level from the rounds it sees, and the catalog
// the ledger publishes has that level (R5-R8, R24).
func TestDiscoveryScanWorkflowLevels(t *testing.T) {
	tests := []struct {
		name     string
		snapshot bool // the session negotiated the snapshot extension
		// prior rounds recorded on the session before the scan (another scan's)
		prior      []scripted
		plays      []scripted
		wantLevel  string
		wantRounds int
		wantBasis  []int // round numbers of A and B
		wantReason string
	}{
		{
			name: "two equal rounds: UNPROVEN", plays: []scripted{{set: "S"}, {set: "S"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 2, wantBasis: []int{1, 2}, wantReason: "no snapshot extension",
		},
		{
			name: "negotiated ID on every page: PROVEN", snapshot: true, plays: []scripted{{set: "S", snapshot: "X"}, {set: "S", snapshot: "X"}},
			wantLevel: contract.ProofSnapshotProven, wantRounds: 2, wantBasis: []int{1, 2}, wantReason: "snapshot ID X",
		},
		{
			name: "IDs not negotiated: UNPROVEN", plays: []scripted{{set: "S", snapshot: "X"}, {set: "S", snapshot: "X"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 2, wantBasis: []int{1, 2}, wantReason: "not negotiated",
		},
		{
			name: "set changed during round A without list_changed: retried", plays: []scripted{{set: "S1"}, {set: "S2"}, {set: "S2"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 3, wantBasis: []int{2, 3},
		},
		{
			name: "list_changed during round B: retried", plays: []scripted{{set: "S"}, {set: "S", listChanged: 1}, {set: "S"}, {set: "S"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 4, wantBasis: []int{3, 4},
		},
		{
			name: "forged ID within the scan: never PROVEN", snapshot: true,
			plays:     []scripted{{set: "S1", snapshot: "X"}, {set: "S2", snapshot: "X"}, {set: "S2", snapshot: "X"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 3, wantBasis: []int{2, 3}, wantReason: "forged",
		},
		{
			name: "forged ID seen by an earlier scan: the ledger refuses PROVEN", snapshot: true,
			prior:     []scripted{{set: "OLD", snapshot: "X"}},
			plays:     []scripted{{set: "S", snapshot: "X"}, {set: "S", snapshot: "X"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 2, wantBasis: []int{1, 2}, wantReason: "ledger refused SNAPSHOT_PROVEN",
		},
		{
			name:      "a session that ends during a round",
			plays:     []scripted{{set: "S"}, {stale: true}, {set: "S"}, {set: "S"}},
			wantLevel: contract.ProofSnapshotUnproven, wantRounds: 4, wantBasis: []int{3, 4},
		},
		{
			name: "cursor cycles in every round: RECONCILIATION_REQUIRED",
			plays: []scripted{{failed: contract.RoundCursorCycle}, {failed: contract.RoundCursorCycle}, {failed: contract.RoundCursorCycle},
				{failed: contract.RoundCursorCycle}, {failed: contract.RoundCursorCycle}, {failed: contract.RoundCursorCycle}},
			wantLevel: contract.ProofReconciliationRequired, wantRounds: 6, wantReason: contract.RoundCursorCycle,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newDiscoveryHarness(t, tt.snapshot)
			if len(tt.prior) > 0 {
				prior := &fakeRounds{store: h.st, plays: tt.prior}
				for i := range tt.prior {
					run := "scan/demo/prior/run"
					if _, err := prior.round(h.ctx, contract.RoundInput{ScanKey: fmt.Sprintf("%s/round-%d", run, i+1), ScanRun: run,
						ScanWorkflowID: run, Round: i + 1, SourceID: h.src.ID, SessionGeneration: 1}); err != nil {
						t.Fatal(err)
					}
				}
			}
			f := &fakeRounds{store: h.st, plays: tt.plays}
			registerRounds(h.env, h.st, f.round)
			h.env.RegisterWorkflowWithOptions(workflows.DiscoveryScanWorkflow, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
			h.env.ExecuteWorkflow(contract.DiscoveryScanWorkflowName, contract.DiscoveryScanInput{SourceID: h.src.ID, Source: "demo"})
			if err := h.env.GetWorkflowError(); err != nil {
				t.Fatalf("workflow: %v", err)
			}
			var res contract.DiscoveryScanResult
			if err := h.env.GetWorkflowResult(&res); err != nil {
				t.Fatal(err)
			}
			c, err := h.st.CatalogByID(h.ctx, res.CatalogID)
			if err != nil {
				t.Fatal(err)
			}
			var basis []int
			for _, id := range c.BasisScanIDs {
				sc, err := h.st.ScanByID(h.ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				basis = append(basis, sc.Round)
			}
			type view struct {
				Level      string
				Catalog    string
				Rounds     int
				RoundsUsed int
				Basis      []int
			}
			want := view{tt.wantLevel, tt.wantLevel, tt.wantRounds, tt.wantRounds, tt.wantBasis}
			got := view{res.Level, string(c.Level), len(f.ran), c.RoundsUsed, basis}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("scan (-want +got):\n%s\nreason: %s", diff, res.Reason)
			}
			if !strings.Contains(res.Reason, tt.wantReason) || res.Reason != c.Reason {
				t.Errorf("reason %q (catalog %q) does not mention %q", res.Reason, c.Reason, tt.wantReason)
			}
			scans, err := h.st.ScansOfWorkflow(h.ctx, f.ran[0].ScanWorkflowID)
			if err != nil {
				t.Fatal(err)
			}
			for _, sc := range scans {
				if sc.Outcome == ledger.ScanRunning {
					t.Errorf("round %d left RUNNING", sc.Round)
				}
			}
		})
	}
}

// fakeScans stands in for DiscoveryScanWorkflow under SourceWorkflow: each scan takes 10 s of
// workflow time and publishes a catalog whose next check is a minute later.
type fakeScans struct {
	mu      sync.Mutex
	started []contract.DiscoveryScanInput
	ids     []string
}

func (f *fakeScans) scan(ctx workflow.Context, in contract.DiscoveryScanInput) (contract.DiscoveryScanResult, error) {
	f.mu.Lock()
	f.started = append(f.started, in)
	f.ids = append(f.ids, workflow.GetInfo(ctx).WorkflowExecution.ID)
	n := len(f.started)
	f.mu.Unlock()
	if err := workflow.Sleep(ctx, 10*time.Second); err != nil {
		return contract.DiscoveryScanResult{}, err
	}
	return contract.DiscoveryScanResult{CatalogID: int64(n), Level: contract.ProofSnapshotUnproven, NextCheckAt: workflow.Now(ctx).Add(time.Minute)}, nil
}

func (f *fakeScans) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

func sourceHarness(t *testing.T) (*discoveryHarness, *fakeScans) {
	h := newDiscoveryHarness(t, false)
	f := &fakeScans{}
	h.env.RegisterWorkflowWithOptions(workflows.SourceWorkflow, workflow.RegisterOptions{Name: contract.SourceWorkflowName})
	h.env.RegisterWorkflowWithOptions(f.scan, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
	return h, f
}

func (h *discoveryHarness) view() contract.SourceView {
	h.t.Helper()
	v, err := h.env.QueryWorkflow(contract.QuerySourceState)
	if err != nil {
		h.t.Fatal(err)
	}
	var out contract.SourceView
	if err := v.Get(&out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// A burst of list_changed and scan requests while a scan runs is coalesced into exactly one
// follow-up scan, which serves the requests; the catalogs are invalidated once per burst; the
// re-check timer from the catalog's nextCheckAt starts the next scan.
func TestSourceWorkflowCoalescesBursts(t *testing.T) {
	h, f := sourceHarness(t)
	type snap struct {
		Scans, ListChanged, Requests, Coalesced int64
		Running, Pending                        bool
		Assigned                                int
		Started                                 int
	}
	var views []snap
	take := func() {
		v := h.view()
		views = append(views, snap{v.Scans, v.ListChangedSignals, v.ScanRequests, v.Coalesced, v.Running != "", v.Pending, len(v.Assigned), f.count()})
	}
	h.env.RegisterDelayedCallback(func() {
		take() // the first scan runs
		for i := range 50 {
			h.env.SignalWorkflow(contract.SignalListChanged, contract.ListChanged{SessionGeneration: 1, Count: int64(i + 1)})
		}
		h.env.SignalWorkflow(contract.SignalScanRequest, contract.ScanRequest{ID: "r1", Reason: "cli"})
		h.env.SignalWorkflow(contract.SignalScanRequest, contract.ScanRequest{ID: "r1", Reason: "cli"}) // duplicate
		h.env.SignalWorkflow(contract.SignalScanRequest, contract.ScanRequest{ID: "r2", Reason: "cli"})
	}, time.Second)
	h.env.RegisterDelayedCallback(take, 5*time.Second)  // burst recorded, one scan due
	h.env.RegisterDelayedCallback(take, 15*time.Second) // the follow-up scan runs
	h.env.RegisterDelayedCallback(take, 25*time.Second) // idle until the re-check
	h.env.RegisterDelayedCallback(take, 85*time.Second) // the re-check timer started scan 3
	h.env.RegisterDelayedCallback(h.env.CancelWorkflow, 90*time.Second)
	h.env.ExecuteWorkflow(contract.SourceWorkflowName, contract.SourceInput{SourceID: h.src.ID, Source: "demo"})
	if err := h.env.GetWorkflowError(); !temporal.IsCanceledError(err) {
		t.Fatalf("workflow ended with %v, want cancelled", err)
	}
	want := []snap{
		{Scans: 1, Running: true, Started: 1},
		{Scans: 1, ListChanged: 50, Requests: 2, Coalesced: 51, Running: true, Pending: true, Started: 1},
		{Scans: 2, ListChanged: 50, Requests: 2, Coalesced: 51, Running: true, Assigned: 2, Started: 2},
		{Scans: 2, ListChanged: 50, Requests: 2, Coalesced: 51, Assigned: 2, Started: 2},
		{Scans: 3, ListChanged: 50, Requests: 2, Coalesced: 51, Running: true, Assigned: 2, Started: 3},
	}
	if diff := cmp.Diff(want, views); diff != "" {
		t.Errorf("source state over time (-want +got):\n%s", diff)
	}
	if len(f.ids) < 2 || !strings.HasPrefix(f.ids[1], "scan/demo/") || f.ids[0] == f.ids[1] {
		t.Errorf("scan workflow IDs %v", f.ids)
	}
	if !strings.Contains(f.started[1].Reason, "list_changed") || !strings.Contains(f.started[2].Reason, "scheduled re-check") {
		t.Errorf("scan reasons %q, %q", f.started[1].Reason, f.started[2].Reason)
	}
}

// When the server suggests it, SourceWorkflow continues as new once no scan runs, carrying its
// whole state.
func TestSourceWorkflowContinuesAsNew(t *testing.T) {
	h, f := sourceHarness(t)
	h.env.RegisterDelayedCallback(func() {
		h.env.SignalWorkflow(contract.SignalScanRequest, contract.ScanRequest{ID: "r1"})
		h.env.SignalWorkflow(contract.SignalListChanged, contract.ListChanged{SessionGeneration: 1, Count: 1})
	}, time.Second)
	// Suggested while scan 2 runs: the workflow continues as new once it has finished.
	h.env.RegisterDelayedCallback(func() { h.env.SetContinueAsNewSuggested(true) }, 15*time.Second)
	h.env.ExecuteWorkflow(contract.SourceWorkflowName, contract.SourceInput{SourceID: h.src.ID, Source: "demo", RecheckSeconds: 60})
	var can *workflow.ContinueAsNewError
	if err := h.env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("workflow ended with %v, want continue-as-new", err)
	}
	var next contract.SourceInput
	if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
		t.Fatal(err)
	}
	if next.State == nil || next.RecheckSeconds != 60 || next.SourceID != h.src.ID {
		t.Fatalf("next input %+v", next)
	}
	st := next.State
	got := []any{st.Scans, st.ScanRequests, st.ListChangedSignals, st.ContinuedAsNew, st.Pending, len(st.Assigned), st.NextCheckAt.IsZero(), f.count()}
	if diff := cmp.Diff([]any{int64(2), int64(1), int64(1), 1, false, 1, false, 2}, got); diff != "" {
		t.Errorf("carried state: scans, requests, list_changed, CANs, pending, assigned, no next check, scans run (-want +got):\n%s", diff)
	}
}

// tombstoneParent is what SubscriptionWorkflow does in TOMBSTONE_PENDING: run a
// reconciliation scan as a child and offer its catalog to ConfirmTombstone.
func tombstoneParent(ctx workflow.Context, req contract.ReconcileScanRequest) (contract.ConfirmTombstoneOutput, error) {
	var res contract.DiscoveryScanResult
	if err := workflows.StartReconciliationScan(ctx, req).Get(ctx, &res); err != nil {
		return contract.ConfirmTombstoneOutput{}, err
	}
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: time.Minute})
	var out contract.ConfirmTombstoneOutput
	err := workflow.ExecuteLocalActivity(lctx, contract.ActConfirmTombstone, contract.ConfirmTombstoneInput{
		SubscriptionID: req.SubscriptionID, Generation: req.Generation, CatalogID: res.CatalogID,
	}).Get(ctx, &out)
	return out, err
}

// A not-found read leaves the subscription TOMBSTONE_PENDING; the reconciliation scan that
// StartReconciliationScan runs publishes a catalog, and ConfirmTombstone confirms the deletion
// when the catalog does not list the URI, or refuses with RESOURCE_PRESENT when it does (R21).
func TestReconciliationScanConfirmsTombstone(t *testing.T) {
	const gone = "demo://gone"
	tests := []struct {
		name    string
		uris    []string
		outcome mcpsync.Outcome
		refusal mcpsync.TombstoneRefusal
		state   mcpsync.State
	}{
		{"deleted", []string{"demo://other"}, mcpsync.OutcomeTransitioned, "", mcpsync.StateUnsubscribing},
		{"present again", []string{"demo://other", gone}, mcpsync.OutcomeRefused, mcpsync.TombstoneResourcePresent, mcpsync.StateTombstonePending},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newDiscoveryHarness(t, false)
			if _, _, err := h.st.GrantAccess(h.ctx, "p", h.src.ID, "test"); err != nil {
				t.Fatal(err)
			}
			sub, err := h.st.EnsureSubscription(h.ctx, ledger.EnsureSpec{Principal: "p", SourceID: h.src.ID, URI: gone, ServerURI: gone, WorkflowID: "wf"})
			if err != nil {
				t.Fatal(err)
			}
			for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){h.st.BeginSubscribe, h.st.Activate} {
				if r, err := step(h.ctx, sub.ID, sub.Generation, 1); err != nil || !r.Outcome.OK() {
					t.Fatalf("activate: %+v %v", r, err)
				}
			}
			d, err := h.st.AllocateReadOrdinal(h.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
				SessionGeneration: 1, URI: gone, RequestID: "r1", Reason: mcpsync.ReasonNotification})
			if err != nil {
				t.Fatal(err)
			}
			if o, err := h.st.RecordNotFound(h.ctx, ledger.NotFoundRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
				SessionGeneration: 1, URI: gone, Ordinal: d.Ordinal, RequestID: "r1"}); err != nil || o != mcpsync.OutcomeTombstonePending {
				t.Fatalf("not found: %s %v", o, err)
			}
			f := &fakeRounds{store: h.st, plays: []scripted{{set: "S", uris: tt.uris}, {set: "S", uris: tt.uris}}}
			registerRounds(h.env, h.st, f.round)
			h.env.RegisterWorkflowWithOptions(workflows.DiscoveryScanWorkflow, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
			h.env.RegisterWorkflow(tombstoneParent)
			h.env.ExecuteWorkflow(tombstoneParent, contract.ReconcileScanRequest{SourceID: h.src.ID, Source: "demo",
				SubscriptionID: sub.ID, Generation: sub.Generation, ReadOrdinal: d.Ordinal})
			if err := h.env.GetWorkflowError(); err != nil {
				t.Fatal(err)
			}
			var out contract.ConfirmTombstoneOutput
			if err := h.env.GetWorkflowResult(&out); err != nil {
				t.Fatal(err)
			}
			after, err := h.st.SubscriptionByID(h.ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			got := []string{string(out.Outcome), string(out.Refusal), string(after.State)}
			if diff := cmp.Diff([]string{string(tt.outcome), string(tt.refusal), string(tt.state)}, got); diff != "" {
				t.Errorf("outcome, refusal, state (-want +got):\n%s", diff)
			}
			if want := contract.ReconcileScanWorkflowID(contract.ReconcileScanRequest{Source: "demo", SubscriptionID: sub.ID,
				Generation: sub.Generation, ReadOrdinal: d.Ordinal}); f.ran[0].ScanWorkflowID != want {
				t.Errorf("scan workflow %s, want %s", f.ran[0].ScanWorkflowID, want)
			}
		})
	}
}
