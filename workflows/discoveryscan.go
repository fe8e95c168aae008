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
		if len(s.rounds) == 0 && patched(ctx, versionRoundPair) {
			// Rounds A and B in one activity: B begins as soon as A has ended.
			s.rounds = append(s.rounds, s.pair()...)
			continue
		}
		s.rounds = append(s.rounds, s.round(len(s.rounds)+1))
	}
}

// versionRoundPair (issue 16 item 5): a scan runs rounds A and B in one activity
// (contract.ActDiscoveryRoundPair); a run that reached its first round before this patch ran
// each round in an activity of its own.
const versionRoundPair = "round-pair"

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
	sess, failed := s.session(n)
	if failed != nil {
		return *failed
	}
	in := s.roundInput(n, sess)
	var r contract.RoundResult
	err := workflow.ExecuteActivity(s.roundContext(sess), contract.ActDiscoveryRound, in).Get(s.ctx, &r)
	if err == nil {
		return r
	}
	return s.abandoned(in, err)
}

// pair runs rounds A and B on the source's current session in one activity
// (activities.DiscoveryRoundPair): A's result, then B's if A completed. When the activity
// fails, neither round is known to have ended: both are abandoned and failed.
func (s *scan) pair() []contract.RoundResult {
	sess, failed := s.session(1)
	if failed != nil {
		return []contract.RoundResult{*failed}
	}
	in := contract.RoundPairInput{A: s.roundInput(1, sess), B: s.roundInput(2, sess)}
	var rs []contract.RoundResult
	err := workflow.ExecuteActivity(s.roundContext(sess), contract.ActDiscoveryRoundPair, in).Get(s.ctx, &rs)
	if err == nil && len(rs) > 0 && len(rs) <= 2 {
		return rs
	}
	if err == nil {
		err = fmt.Errorf("the round pair returned %d rounds", len(rs))
	}
	return []contract.RoundResult{s.abandoned(in.A, err), s.abandoned(in.B, err)}
}

// session returns the session round n runs on: the last round's while it completed on a live
// one, else the source's current session; or, when there is none, the failed round n.
func (s *scan) session(n int) (contract.SessionInfo, *contract.RoundResult) {
	sess := s.sess
	if last := len(s.rounds) - 1; !sess.Live || last < 0 || !s.rounds[last].Complete {
		var msg string
		if err := ledgerLocal(s.ctx, contract.ActCurrentSession, s.in.SourceID, &sess); err != nil {
			msg = "looking up the session: " + err.Error()
		} else if !sess.Live {
			msg = fmt.Sprintf("source %s has no live session", s.in.Source)
		}
		if msg != "" {
			return sess, &contract.RoundResult{Round: n, FailureKind: contract.RoundNoSession, Failure: msg}
		}
	}
	s.sess = sess
	return sess, nil
}

func (s *scan) roundInput(n int, sess contract.SessionInfo) contract.RoundInput {
	return contract.RoundInput{
		ScanKey: fmt.Sprintf("%s/round-%d", s.run, n), ScanRun: s.run, ScanWorkflowID: s.wfID, Round: n,
		SourceID: s.in.SourceID, SessionGeneration: sess.Generation, MaxPages: s.in.MaxPages,
	}
}

// roundContext is the activity context of a round on sess: its host's queue, the round's
// timeouts, and one attempt (the workflow retries rounds itself: an attempt is a round).
func (s *scan) roundContext(sess contract.SessionInfo) workflow.Context {
	return workflow.WithActivityOptions(s.ctx, workflow.ActivityOptions{
		TaskQueue:              sess.HostQueue,
		ScheduleToStartTimeout: 10 * time.Second,
		StartToCloseTimeout:    DiscoveryRoundTimeout,
		HeartbeatTimeout:       DiscoveryHeartbeat,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
	})
}

// abandoned fails the round of in, whose activity failed with err, in the ledger and returns
// it as a failed round.
func (s *scan) abandoned(in contract.RoundInput, err error) contract.RoundResult {
	kind := contract.RoundAbandoned
	switch {
	case isStaleSession(err):
		kind = contract.RoundStaleSession
	case isScheduleTimeout(err):
		kind = contract.RoundHostUnreachable
	}
	var ok bool
	if aerr := ledgerLocal(s.ctx, contract.ActAbandonScan, contract.AbandonInput{ScanKey: in.ScanKey, Reason: kind + ": " + rootMessage(err)}, &ok); aerr != nil {
		// The round is failed here whatever the ledger says: its row only stays RUNNING, and
		// a RUNNING round never proves anything (R24).
		workflow.GetLogger(s.ctx).Warn("abandoning the round in the ledger failed", "scanKey", in.ScanKey, "error", aerr)
	}
	return contract.RoundResult{Round: in.Round, SessionGeneration: in.SessionGeneration, FailureKind: kind, Failure: rootMessage(err)}
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
