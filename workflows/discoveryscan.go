package workflows

import (
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/proof"
)

// Tunables of the discovery workflows. Variables so that tests can shorten them.
var (
	// DiscoveryRetryDelay is the first wait before a round that follows a failed or
	// disagreeing one; it doubles up to DiscoveryRetryMax.
	DiscoveryRetryDelay = time.Second
	// DiscoveryRetryMax bounds the wait between rounds.
	DiscoveryRetryMax = 30 * time.Second
	// DiscoveryRecheck is the default re-check period of a catalog: its nextCheckAt, and part
	// of its staleness bound.
	DiscoveryRecheck = 5 * time.Minute
	// DiscoveryReconcileRetry is when a source re-scans after RECONCILIATION_REQUIRED or a
	// failed scan.
	DiscoveryReconcileRetry = time.Minute
	// DiscoveryRoundTimeout bounds one round; DiscoveryHeartbeat is its heartbeat timeout
	// (every page heartbeats).
	DiscoveryRoundTimeout = 30 * time.Minute
	DiscoveryHeartbeat    = 30 * time.Second
	// DiscoveryMaxPages caps the pages of one round when the input does not (R8).
	DiscoveryMaxPages = 20000
)

// DiscoveryScanWorkflow runs discovery rounds on a source's live session until two
// consecutive rounds agree or the round bound is reached, then publishes the catalog through
// the ledger, which re-checks the rounds (R4-R8, R24):
//   - SNAPSHOT_PROVEN: rounds A and B agree and every page of both carried one ID of a
//     negotiated snapshot extension;
//   - SNAPSHOT_UNPROVEN: rounds A and B agree (same session, same set, no list_changed), with
//     measuredAt, a staleness bound and nextCheckAt;
//   - RECONCILIATION_REQUIRED: no agreeing pair within the bound.
//
// Each round is one session-bound activity on the host holding the session; cursors never
// reach the workflow, only digests and counts (R2). The workflow's rounds are decided by the
// pure package workflows/proof.
func DiscoveryScanWorkflow(ctx workflow.Context, in contract.DiscoveryScanInput) (contract.DiscoveryScanResult, error) {
	info := workflow.GetInfo(ctx)
	s := &scan{
		ctx: ctx, in: in, wfID: info.WorkflowExecution.ID,
		run:     info.WorkflowExecution.ID + "/" + info.WorkflowExecution.RunID,
		policy:  proof.Policy{MaxRounds: in.MaxRounds},
		recheck: DiscoveryRecheck,
	}
	if in.RecheckSeconds > 0 {
		s.recheck = time.Duration(in.RecheckSeconds) * time.Second
	}
	if s.in.MaxPages <= 0 {
		s.in.MaxPages = DiscoveryMaxPages
	}
	waits := 0
	for {
		d := proof.Decide(s.rounds, s.policy)
		if d.Publish {
			return s.publish(d)
		}
		if d.Retry {
			if err := workflow.Sleep(ctx, backoff(waits, DiscoveryRetryDelay, DiscoveryRetryMax)); err != nil {
				return contract.DiscoveryScanResult{}, err
			}
			waits++
		}
		s.rounds = append(s.rounds, s.round(len(s.rounds)+1))
	}
}

type scan struct {
	ctx     workflow.Context
	in      contract.DiscoveryScanInput
	wfID    string
	run     string
	policy  proof.Policy
	recheck time.Duration
	rounds  []contract.RoundResult
	// sess is the session the last round ran on; the next round reuses it unless that round
	// found it gone (a stale generation fails the round at once, so reusing is safe).
	sess contract.SessionInfo
}

// round runs round n on the source's current session. A round that could not run, or whose
// activity failed, is returned as a failed round.
func (s *scan) round(n int) contract.RoundResult {
	failed := func(gen int64, kind, msg string) contract.RoundResult {
		return contract.RoundResult{Round: n, SessionGeneration: gen, FailureKind: kind, Failure: msg}
	}
	sess := s.sess
	if last := len(s.rounds) - 1; !sess.Live || last < 0 || !s.rounds[last].Complete {
		if err := ledgerLocal(s.ctx, contract.ActCurrentSession, s.in.SourceID, &sess); err != nil {
			return failed(0, contract.RoundNoSession, "looking up the session: "+err.Error())
		}
		if !sess.Live {
			return failed(0, contract.RoundNoSession, fmt.Sprintf("source %s has no live session", s.in.Source))
		}
	}
	s.sess = sess
	key := fmt.Sprintf("%s/round-%d", s.run, n)
	ctx := workflow.WithActivityOptions(s.ctx, workflow.ActivityOptions{
		TaskQueue:              sess.HostQueue,
		ScheduleToStartTimeout: 10 * time.Second,
		StartToCloseTimeout:    DiscoveryRoundTimeout,
		HeartbeatTimeout:       DiscoveryHeartbeat,
		// The workflow retries rounds itself: an activity attempt is a round.
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var r contract.RoundResult
	err := workflow.ExecuteActivity(ctx, contract.ActDiscoveryRound, contract.RoundInput{
		ScanKey: key, ScanRun: s.run, ScanWorkflowID: s.wfID, Round: n, SourceID: s.in.SourceID,
		SessionGeneration: sess.Generation, MaxPages: s.in.MaxPages,
	}).Get(s.ctx, &r)
	if err == nil {
		return r
	}
	kind := contract.RoundAbandoned
	switch {
	case isStaleSession(err):
		kind = contract.RoundStaleSession
	case isScheduleTimeout(err):
		kind = contract.RoundHostUnreachable
	}
	var ok bool
	if aerr := ledgerLocal(s.ctx, contract.ActAbandonScan, contract.AbandonInput{ScanKey: key, Reason: kind + ": " + rootMessage(err)}, &ok); aerr != nil {
		// The round is failed here whatever the ledger says: its row only stays RUNNING, and
		// a RUNNING round never proves anything (R24).
		workflow.GetLogger(s.ctx).Warn("abandoning the round in the ledger failed", "scanKey", key, "error", aerr)
	}
	return failed(sess.Generation, kind, rootMessage(err))
}

// publish asks the ledger to publish the decided level; if the ledger's own check refuses it,
// the next lower level is tried.
func (s *scan) publish(d proof.Decision) (contract.DiscoveryScanResult, error) {
	level, reason := d.Level, d.Reason
	for {
		in := contract.PublishInput{
			CatalogKey: s.run, ScanWorkflowID: s.wfID, SourceID: s.in.SourceID, Level: level,
			Reason: reason, RoundsUsed: len(s.rounds), RecheckSeconds: int(s.recheck / time.Second),
		}
		var basis contract.RoundResult
		if level == contract.ProofReconciliationRequired {
			in.RecheckSeconds = int(min(s.recheck, DiscoveryReconcileRetry) / time.Second)
			for _, r := range s.rounds {
				if r.Complete {
					basis, in.EntriesScanID = r, r.ScanID
				}
			}
			if n := len(s.rounds); n > 0 {
				in.SessionGeneration = s.rounds[n-1].SessionGeneration
			}
		} else {
			a := s.rounds[d.Basis[0]]
			basis = s.rounds[d.Basis[1]]
			in.BasisScanIDs = []int64{a.ScanID, basis.ScanID}
			in.SessionGeneration = basis.SessionGeneration
		}
		in.RecheckSeconds = max(in.RecheckSeconds, 1)
		var out contract.PublishOutput
		if err := ledgerLocal(s.ctx, contract.ActPublishCatalog, in, &out); err != nil {
			return contract.DiscoveryScanResult{}, fmt.Errorf("publishing the catalog: %w", err)
		}
		if out.Published {
			return contract.DiscoveryScanResult{
				CatalogID: out.CatalogID, Level: out.Level, Reason: reason, SessionGeneration: in.SessionGeneration,
				Rounds: len(s.rounds), Resources: basis.Resources, Templates: basis.Templates,
				SetDigest: basis.SetDigest, MeasuredAt: out.MeasuredAt, NextCheckAt: out.NextCheckAt,
				StalenessBoundSeconds: out.StalenessBoundSeconds,
			}, nil
		}
		if level == contract.ProofReconciliationRequired {
			return contract.DiscoveryScanResult{}, errors.New("the ledger refused a RECONCILIATION_REQUIRED catalog")
		}
		reason = fmt.Sprintf("%s; the ledger refused %s: %s", reason, level, out.Refusal)
		level = proof.Downgrade(level)
	}
}

// StartReconciliationScan starts a DiscoveryScanWorkflow as a child of the calling workflow,
// to confirm or refute the deletion a not-found read reported (R21), and returns its future
// at once so that the caller keeps serving its signals while the scan runs. The child's
// rounds all start after this call, hence after the not-found read was dispatched.
//
// Usage from SubscriptionWorkflow in TOMBSTONE_PENDING:
//
//	f := StartReconciliationScan(ctx, contract.ReconcileScanRequest{SourceID: ..., Source: ...,
//		SubscriptionID: ..., Generation: ..., ReadOrdinal: ordinal, Attempt: attempts})
//	// await f while serving signals, then:
//	var res contract.DiscoveryScanResult
//	err := f.Get(ctx, &res)
//	// then the local activity contract.ActConfirmTombstone with
//	// contract.ConfirmTombstoneInput{SubscriptionID, Generation, CatalogID: res.CatalogID}.
func StartReconciliationScan(ctx workflow.Context, req contract.ReconcileScanRequest) workflow.ChildWorkflowFuture {
	ctx = workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:            contract.ReconcileScanWorkflowID(req),
		TaskQueue:             contract.TaskQueue,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_TERMINATE,
	})
	return workflow.ExecuteChildWorkflow(ctx, contract.DiscoveryScanWorkflowName, contract.DiscoveryScanInput{
		SourceID: req.SourceID, Source: req.Source,
		Reason: fmt.Sprintf("tombstone check: subscription %d generation %d, read %d answered not found",
			req.SubscriptionID, req.Generation, req.ReadOrdinal),
	})
}

// ledgerLocal runs a ledger activity as a local activity (one short Postgres transaction).
func ledgerLocal(ctx workflow.Context, name string, arg any, out any) error {
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 10 * time.Minute,
		StartToCloseTimeout:    time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        200 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        15 * time.Second,
			NonRetryableErrorTypes: []string{contract.ErrTypePermanent},
		},
	})
	return workflow.ExecuteLocalActivity(lctx, name, arg).Get(ctx, out)
}
