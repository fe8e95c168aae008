package workflows

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// Bounds of the lists a SourceWorkflow keeps in its state.
const (
	sourceKeepReasons  = 8
	sourceKeepAssigned = 32
	sourceKeepSeen     = 64
)

// SourceHistoryThreshold continues a SourceWorkflow as new once its history reaches this many
// events even if the server has not suggested it yet. A variable so that tests can lower it.
var SourceHistoryThreshold = 10000

type source struct {
	ctx     workflow.Context
	in      contract.SourceInput
	st      *contract.SourceState
	log     log.Logger
	recheck time.Duration

	listCh, reqCh workflow.ReceiveChannel

	running   workflow.ChildWorkflowFuture
	runningID string
	timer     workflow.Future
	cancel    workflow.CancelFunc

	// unrecorded is the list_changed received and not yet recorded in the ledger
	// (recordListChanged); nil when there is none.
	unrecorded *contract.ListChanged
}

// versionRecordEveryListChanged marks the runs that record every list_changed in the ledger
// (recordListChanged); runs without it recorded one per scan started.
const versionRecordEveryListChanged = "record-every-list-changed"

// SourceWorkflow is the long-lived workflow of one source (workflow ID
// contract.SourceWorkflowID). It runs a DiscoveryScanWorkflow child when a scan is due: a
// list_changed signal (which also invalidates the source's catalogs, R3), a scan request (the
// CLI, a new session), or the re-check timer set from the last catalog's nextCheckAt. At most
// one scan runs at a time, and every trigger that arrives while one runs or is already due is
// coalesced into a single follow-up scan that starts after it. It continues as new when the
// server suggests it (or at SourceHistoryThreshold), with no scan running and its signals
// drained into the state.
func SourceWorkflow(ctx workflow.Context, in contract.SourceInput) error {
	w := &source{
		ctx: ctx, in: in, log: workflow.GetLogger(ctx), recheck: DiscoveryRecheck,
		listCh: workflow.GetSignalChannel(ctx, contract.SignalListChanged),
		reqCh:  workflow.GetSignalChannel(ctx, contract.SignalScanRequest),
	}
	if in.RecheckSeconds > 0 {
		w.recheck = time.Duration(in.RecheckSeconds) * time.Second
	}
	w.st = in.State
	if w.st == nil {
		// Never scanned: the first scan is due at once.
		w.st = &contract.SourceState{Pending: true, PendingReasons: []string{"first scan"}}
	}
	if err := workflow.SetQueryHandler(ctx, contract.QuerySourceState, func() (contract.SourceView, error) {
		return w.view(), nil
	}); err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if w.running == nil && w.st.Pending {
			w.drainSignals() // fold triggers already delivered into this scan
			w.recordListChanged()
			w.startScan()
		}
		if w.running == nil && w.shouldContinueAsNew() {
			if err := w.continueAsNew(); err != nil {
				return err
			}
			// A list_changed could not be recorded: not continued, tried again below.
		}
		w.ensureTimer()
		sel := workflow.NewSelector(ctx)
		w.addSignals(sel)
		if w.running != nil {
			sel.AddFuture(w.running, func(f workflow.Future) { w.scanDone(f) })
		}
		if w.timer != nil {
			sel.AddFuture(w.timer, func(workflow.Future) {
				// The next check time comes from the scan this starts.
				w.timer, w.cancel, w.st.NextCheckAt = nil, nil, time.Time{}
				w.due("scheduled re-check")
			})
		}
		sel.Select(ctx)
		w.recordListChanged()
	}
}

func (w *source) addSignals(sel workflow.Selector) {
	sel.AddReceive(w.listCh, func(c workflow.ReceiveChannel, _ bool) {
		var lc contract.ListChanged
		c.Receive(w.ctx, &lc)
		w.onListChanged(lc)
	})
	sel.AddReceive(w.reqCh, func(c workflow.ReceiveChannel, _ bool) {
		var r contract.ScanRequest
		c.Receive(w.ctx, &r)
		w.onRequest(r)
	})
}

// onListChanged notes a list_changed for recordListChanged (a notification may only
// invalidate, R3) and makes a scan due.
func (w *source) onListChanged(lc contract.ListChanged) {
	w.st.ListChangedSignals++
	if w.unrecorded == nil {
		w.unrecorded = &lc
	}
	w.due(fmt.Sprintf("list_changed (generation %d)", lc.SessionGeneration))
}

// recordListChanged records the list_changed received since the last record in the ledger
// (InvalidateCatalogs), once for all of those already delivered: it invalidates every catalog
// published so far, and the catalog of a scan whose round A began before the record is
// published invalidated (PublishCatalog), even when the list_changed arrives between round B's
// end and the publication (R3, R6). Every list_changed is recorded, also while a scan runs
// whose earlier list_changed was recorded already: that record may have preceded round A. A
// record that fails stays due and is tried again on the next turn.
func (w *source) recordListChanged() {
	if w.unrecorded == nil {
		return
	}
	every := patched(w.ctx, versionRecordEveryListChanged)
	if !every {
		// Runs recorded before: once per scan started, a failure dropped.
		lc := *w.unrecorded
		w.unrecorded = nil
		if !w.st.Invalidated && w.invalidate(lc) {
			w.st.Invalidated = true
		}
		return
	}
	w.drainSignals() // one record for every list_changed already delivered
	if w.invalidate(*w.unrecorded) {
		w.unrecorded = nil
		w.st.Invalidated = true
	}
}

// invalidate records lc in the ledger and reports whether the ledger answered.
func (w *source) invalidate(lc contract.ListChanged) bool {
	var n int64
	if err := ledgerLocal(w.ctx, contract.ActInvalidateCatalogs, contract.InvalidateInput{
		SourceID: w.in.SourceID, Reason: fmt.Sprintf("list_changed on session generation %d", lc.SessionGeneration),
	}, &n); err != nil {
		w.log.Warn("recording list_changed failed", "error", err)
		return false
	}
	return true
}

func (w *source) onRequest(r contract.ScanRequest) {
	if r.ID != "" {
		for _, id := range w.st.SeenRequests {
			if id == r.ID {
				return
			}
		}
		w.st.SeenRequests = keepLast(append(w.st.SeenRequests, r.ID), sourceKeepSeen)
		w.st.PendingRequests = append(w.st.PendingRequests, r.ID)
	}
	w.st.ScanRequests++
	reason := r.Reason
	if reason == "" {
		reason = "requested"
	}
	w.due(reason)
}

// due makes a scan due; a trigger for a scan already due is coalesced into it.
func (w *source) due(reason string) {
	if w.st.Pending {
		w.st.Coalesced++
	}
	w.st.Pending = true
	w.st.PendingReasons = keepLast(append(w.st.PendingReasons, reason), sourceKeepReasons)
}

// startScan starts the due scan as a child and assigns the waiting requests to it.
func (w *source) startScan() {
	w.st.Scans++
	info := workflow.GetInfo(w.ctx)
	first := info.FirstRunID
	if len(first) > 8 {
		first = first[:8]
	}
	id := fmt.Sprintf("scan/%s/%s-%d", w.in.Source, first, w.st.Scans)
	for _, req := range w.st.PendingRequests {
		w.st.Assigned = append(w.st.Assigned, contract.ScanAssignment{RequestID: req, ScanWorkflowID: id})
	}
	w.st.Assigned = keepLast(w.st.Assigned, sourceKeepAssigned)
	reason := strings.Join(w.st.PendingReasons, "; ")
	w.st.Pending, w.st.PendingReasons, w.st.PendingRequests, w.st.Invalidated = false, nil, nil, false
	ctx := workflow.WithChildOptions(w.ctx, workflow.ChildWorkflowOptions{WorkflowID: id, TaskQueue: contract.TaskQueue})
	w.running = workflow.ExecuteChildWorkflow(ctx, contract.DiscoveryScanWorkflowName, contract.DiscoveryScanInput{
		SourceID: w.in.SourceID, Source: w.in.Source, Reason: reason, RecheckSeconds: int(w.recheck / time.Second),
	})
	w.runningID = id
}

// scanDone records a finished scan and sets the re-check timer from its nextCheckAt.
func (w *source) scanDone(f workflow.Future) {
	var res contract.DiscoveryScanResult
	err := f.Get(w.ctx, &res)
	w.st.LastScanID = w.runningID
	w.running, w.runningID = nil, ""
	now := workflow.Now(w.ctx)
	if err != nil {
		w.log.Warn("discovery scan failed", "scan", w.st.LastScanID, "error", err)
		w.st.NextCheckAt = now.Add(DiscoveryReconcileRetry)
	} else {
		w.st.LastCatalogID, w.st.LastLevel, w.st.NextCheckAt = res.CatalogID, res.Level, res.NextCheckAt
	}
	w.resetTimer()
}

func (w *source) resetTimer() {
	if w.cancel != nil {
		w.cancel()
	}
	w.timer, w.cancel = nil, nil
}

// ensureTimer arms the re-check timer for NextCheckAt when none is armed.
func (w *source) ensureTimer() {
	if w.timer != nil || w.st.NextCheckAt.IsZero() {
		return
	}
	d := max(w.st.NextCheckAt.Sub(workflow.Now(w.ctx)), time.Second)
	ctx, cancel := workflow.WithCancel(w.ctx)
	w.timer, w.cancel = workflow.NewTimer(ctx, d), cancel
}

func (w *source) shouldContinueAsNew() bool {
	info := workflow.GetInfo(w.ctx)
	return info.GetContinueAsNewSuggested() || info.GetCurrentHistoryLength() >= SourceHistoryThreshold
}

// drainSignals records every signal already delivered, without blocking.
func (w *source) drainSignals() {
	for {
		sel := workflow.NewSelector(w.ctx)
		w.addSignals(sel)
		if !sel.HasPending() {
			return
		}
		sel.Select(w.ctx)
	}
}

// continueAsNew drains delivered signals into the state, records their list_changed, and
// continues as new with it. It returns nil, not continuing, while a list_changed cannot be
// recorded: the record is not carried over.
func (w *source) continueAsNew() error {
	w.drainSignals()
	w.recordListChanged()
	if w.unrecorded != nil {
		return nil
	}
	if err := workflow.Await(w.ctx, func() bool { return workflow.AllHandlersFinished(w.ctx) }); err != nil {
		return err
	}
	w.resetTimer()
	w.st.ContinuedAsNew++
	next := w.in
	next.State = w.st
	return workflow.NewContinueAsNewError(w.ctx, contract.SourceWorkflowName, next)
}

func (w *source) view() contract.SourceView {
	return contract.SourceView{
		Source: w.in.Source, Running: w.runningID, Pending: w.st.Pending, Scans: w.st.Scans,
		Assigned: w.st.Assigned, LastCatalogID: w.st.LastCatalogID, LastLevel: w.st.LastLevel,
		LastScanID: w.st.LastScanID, NextCheckAt: w.st.NextCheckAt,
		ListChangedSignals: w.st.ListChangedSignals, ScanRequests: w.st.ScanRequests, Coalesced: w.st.Coalesced,
	}
}

func keepLast[T any](s []T, n int) []T {
	if len(s) > n {
		return append([]T(nil), s[len(s)-n:]...)
	}
	return s
}
