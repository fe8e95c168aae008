// Package activities holds mcpsync's Temporal activities: ledger activities (each one
// Postgres transaction of internal/ledger, run as local activities next to the workflow) and
// session-bound MCP activities (run on the task queue of the worker holding the session).
// Activities never import workflow code; both sides speak internal/contract.
package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/metrics"
	"github.com/mcpsync/mcpsync/internal/tracing"
)

// Registry is where activities are registered (a Temporal worker).
type Registry interface {
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// Ledger runs the ledger's guarded transitions as activities. Every method returns the
// ledger's typed outcome; an error means the ledger could not decide (retryable), or the
// request was malformed (non-retryable PermanentMCPError type).
type Ledger struct {
	Store *ledger.Store
	// Metrics, if set, counts outcomes, reads by reason and latencies (issue 17, part 2).
	Metrics *metrics.Metrics
}

// Register registers every ledger activity under its contract name.
func (a *Ledger) Register(r Registry) {
	for name, fn := range map[string]any{
		contract.ActEnsureSubscription:         a.EnsureSubscription,
		contract.ActCurrentSession:             a.CurrentSession,
		contract.ActBeginSubscribe:             a.BeginSubscribe,
		contract.ActActivate:                   a.Activate,
		contract.ActMarkReconciliationRequired: a.MarkReconciliationRequired,
		contract.ActRestoreFromTombstone:       a.RestoreFromTombstone,
		contract.ActBeginUnsubscribe:           a.BeginUnsubscribe,
		contract.ActCompleteUnsubscribe:        a.CompleteUnsubscribe,
		contract.ActMarkUnsubscribeUnknown:     a.MarkUnsubscribeUnknown,
		contract.ActAllocateReadOrdinal:        a.AllocateReadOrdinal,
		contract.ActAcceptResourceVersion:      a.AcceptResourceVersion,
		contract.ActRecordNotFound:             a.RecordNotFound,
		contract.ActSubscriptionState:          a.SubscriptionState,
		contract.ActRecordTombstoneProbe:       a.RecordTombstoneProbe,
		contract.ActConfirmTombstoneByReads:    a.ConfirmTombstoneByReads,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// permanent turns a ledger error a retry cannot change (ErrInvalid, ErrNotFound, ErrNoGrant)
// into a non-retryable application error of type contract.ErrTypePermanent; every other error
// is returned as is, for Temporal to retry. Refusals never get here: the ledger returns them
// as outcomes (see the ledger package's error rule).
func permanent(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ledger.ErrInvalid) || errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrNoGrant) {
		return temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypePermanent, err)
	}
	return err
}

func ref(s ledger.Subscription) contract.SubscriptionRef {
	return contract.SubscriptionRef{
		ID: s.ID, Generation: s.Generation, SessionGeneration: s.SessionGeneration,
		State: s.State, Reason: s.StateReason, LastIssuedOrdinal: s.LastIssuedOrdinal,
		LastAcceptedOrdinal: s.LastAcceptedOrdinal, LastAcceptedDigest: s.LastAcceptedDigest,
		CloseEpoch: s.CloseEpoch,
	}
}

// EnsureSubscription creates or finds the subscription's ledger row (a CLOSED one reopens
// under the next generation).
func (a *Ledger) EnsureSubscription(ctx context.Context, in contract.EnsureInput) (contract.SubscriptionRef, error) {
	s, err := a.Store.EnsureSubscription(ctx, ledger.EnsureSpec{
		Principal: in.Principal, SourceID: in.SourceID, URI: in.URI, ServerURI: in.ServerURI, WorkflowID: in.WorkflowID,
	})
	if errors.Is(err, ledger.ErrNoGrant) {
		return contract.SubscriptionRef{}, a.noGrant(ctx, in, err)
	}
	if err != nil {
		return contract.SubscriptionRef{}, permanent(err)
	}
	return ref(s), nil
}

// noGrant is EnsureSubscription's answer when the principal holds no standing grant: a
// non-retryable error of type contract.ErrTypeNoGrant, carrying the subscription's row when it
// is open all the same, so that the workflow closes it (R23, R18) rather than leave it open with
// no workflow. A failed look-up is returned as is, for the whole call to be retried.
func (a *Ledger) noGrant(ctx context.Context, in contract.EnsureInput, err error) error {
	s, lerr := a.Store.SubscriptionOf(ctx, in.Principal, in.SourceID, in.URI)
	switch {
	case errors.Is(lerr, ledger.ErrNotFound):
		return temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypeNoGrant, err)
	case lerr != nil:
		return fmt.Errorf("%w (looking up the open subscription: %w)", err, lerr)
	case s.State == mcpsync.StateClosed || s.WorkflowID != in.WorkflowID:
		// Closed, or another workflow's: nothing for this one to close.
		return temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypeNoGrant, err)
	}
	return temporal.NewNonRetryableApplicationError(err.Error(), contract.ErrTypeNoGrant, err, ref(s))
}

// SubscriptionState returns the ledger's view of a subscription.
func (a *Ledger) SubscriptionState(ctx context.Context, id int64) (contract.SubscriptionRef, error) {
	s, err := a.Store.SubscriptionByID(ctx, id)
	if err != nil {
		return contract.SubscriptionRef{}, permanent(err)
	}
	return ref(s), nil
}

// CurrentSession reports the source's live session, or Live=false when it has none.
func (a *Ledger) CurrentSession(ctx context.Context, sourceID int64) (contract.SessionInfo, error) {
	// With the source's periods as they are now, so that a `source update` reaches running
	// subscriptions when they establish themselves on the next session.
	s, err := a.Store.CurrentSessionAndPeriods(ctx, sourceID)
	if errors.Is(err, ledger.ErrNoSession) {
		return contract.SessionInfo{}, nil
	}
	if err != nil {
		return contract.SessionInfo{}, err
	}
	return contract.SessionInfo{
		Live: true, Generation: s.Generation, HostQueue: s.HostQueue, CanSubscribe: s.Caps.Subscribe,
		ListChanged: s.Caps.ListChanged, SnapshotIDs: s.Caps.SnapshotIDs,
		BackstopSeconds: s.BackstopSeconds, PollSeconds: s.PollSeconds, DefinitionVersion: s.DefinitionVersion,
	}, nil
}

func transition(r ledger.TransitionResult, err error) (contract.TransitionOutput, error) {
	if err != nil {
		return contract.TransitionOutput{}, permanent(err)
	}
	return contract.TransitionOutput{Outcome: r.Outcome, State: r.State, Reason: r.Reason}, nil
}

// BeginSubscribe moves the subscription to SUBSCRIBING on the given live session.
func (a *Ledger) BeginSubscribe(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	return transition(a.Store.BeginSubscribe(ctx, in.SubscriptionID, in.Generation, in.SessionGeneration))
}

// Activate moves SUBSCRIBING to ACTIVE on the same, still current session.
func (a *Ledger) Activate(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	return transition(a.Store.ActivateWatch(ctx, in.SubscriptionID, in.Generation, in.SessionGeneration, in.NotAcknowledged))
}

// MarkReconciliationRequired parks a live subscription in RECONCILIATION_REQUIRED.
func (a *Ledger) MarkReconciliationRequired(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	return transition(a.Store.MarkReconciliationRequired(ctx, in.SubscriptionID, in.Generation, in.Reason))
}

// RecordTombstoneProbe records a repeated not-found read of a TOMBSTONE_PENDING subscription
// (R21); a refusal is an outcome, not an error.
func (a *Ledger) RecordTombstoneProbe(ctx context.Context, in contract.TombstoneProbeInput) (contract.TombstoneProbeOutput, error) {
	r, err := a.Store.RecordTombstoneProbe(ctx, ledger.TombstoneProbeRequest{SubscriptionID: in.SubscriptionID,
		Generation: in.Generation, SessionGeneration: in.SessionGeneration, RequestID: in.RequestID})
	if err != nil {
		return contract.TombstoneProbeOutput{}, permanent(err)
	}
	return contract.TombstoneProbeOutput{Outcome: r.Outcome, State: r.State, Probes: r.Probes,
		Required: ledger.TombstoneProbesRequired}, nil
}

// ConfirmTombstoneByReads confirms a TOMBSTONE_PENDING subscription's deletion by its
// recorded not-found probes (R21); a refusal is an outcome, not an error.
func (a *Ledger) ConfirmTombstoneByReads(ctx context.Context, in contract.ConfirmByReadsInput) (contract.ConfirmTombstoneOutput, error) {
	r, err := a.Store.ConfirmTombstoneByReads(ctx, ledger.ConfirmByReadsRequest{SubscriptionID: in.SubscriptionID, Generation: in.Generation})
	if err != nil {
		return contract.ConfirmTombstoneOutput{}, permanent(err)
	}
	return contract.ConfirmTombstoneOutput{Outcome: r.Outcome, Refusal: r.Refusal, State: r.State, ReadOrdinal: r.ReadOrdinal,
		CloseOrdinal: r.CloseOrdinal, CloseEpoch: r.CloseEpoch, VersionID: r.VersionID}, nil
}

// RestoreFromTombstone moves TOMBSTONE_PENDING back to ACTIVE.
func (a *Ledger) RestoreFromTombstone(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	return transition(a.Store.RestoreFromTombstone(ctx, in.SubscriptionID, in.Generation, in.SessionGeneration))
}

// BeginUnsubscribe passes the close fence (R18).
func (a *Ledger) BeginUnsubscribe(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	r, err := a.Store.BeginUnsubscribe(ctx, in.SubscriptionID, in.Generation, in.Reason)
	if err != nil {
		return contract.TransitionOutput{}, permanent(err)
	}
	if r.Outcome == mcpsync.OutcomeTransitioned {
		a.Metrics.CloseFencePassed(ctx, a.Store.Pool(), in.SubscriptionID, in.Generation)
	}
	return contract.TransitionOutput{
		Outcome: r.Outcome, State: r.State, CloseOrdinal: r.CloseOrdinal, CloseEpoch: r.CloseEpoch,
	}, nil
}

// CompleteUnsubscribe closes the subscription (R20: never back to ACTIVE).
func (a *Ledger) CompleteUnsubscribe(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	return transition(a.Store.CompleteUnsubscribe(ctx, in.SubscriptionID, in.Generation, in.CloseEpoch))
}

// MarkUnsubscribeUnknown records a lost unsubscribe acknowledgement (R20).
func (a *Ledger) MarkUnsubscribeUnknown(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	return transition(a.Store.MarkUnsubscribeUnknown(ctx, in.SubscriptionID, in.Generation, in.CloseEpoch, in.Reason))
}

// AllocateReadOrdinal issues a readOrdinal by compare-and-set (R14).
func (a *Ledger) AllocateReadOrdinal(ctx context.Context, in contract.AllocateInput) (contract.AllocateOutput, error) {
	d, err := a.Store.AllocateReadOrdinal(ctx, ledger.AllocateRequest{
		SubscriptionID: in.SubscriptionID, Generation: in.Generation, SessionGeneration: in.SessionGeneration,
		URI: in.URI, RequestID: in.RequestID, Reason: in.Reason,
	})
	if err != nil {
		return contract.AllocateOutput{}, permanent(err)
	}
	if d.Outcome == mcpsync.OutcomeAllocated {
		a.Metrics.ReadIssued(in.Reason)
	}
	return contract.AllocateOutput{Outcome: d.Outcome, Ordinal: d.Ordinal, State: d.State}, nil
}

// AcceptResourceVersion offers a read to the single acceptance point (R16). A read whose
// contents were over the source's size bound (Read.TooLarge) passes the same ordinal fence and
// leaves a TOO_LARGE receipt instead of a version (ledger.RecordTooLarge, issue 14 item 6).
func (a *Ledger) AcceptResourceVersion(ctx context.Context, in contract.AcceptInput) (contract.AcceptOutput, error) {
	return a.accept(ctx, in, nil)
}

// accept is AcceptResourceVersion, storing body (when not nil: the body of in.Read, held in
// this process and never in a Temporal payload) in the acceptance's own transaction
// (ledger.AcceptRequest.Body).
func (a *Ledger) accept(ctx context.Context, in contract.AcceptInput, body []byte) (contract.AcceptOutput, error) {
	ctx, span := tracing.Start(ctx, tracing.SpanLedgerAccept, trace.SpanKindClient, tracing.AttrSubID.Int64(in.SubscriptionID), tracing.AttrOrdinal.Int64(in.Ordinal))
	defer span.End() // issue 17: the acceptance point's transaction in the update's trace
	if in.Read.TooLarge {
		o, err := a.Store.RecordTooLarge(ctx, ledger.TooLargeRequest{
			SubscriptionID: in.SubscriptionID, Generation: in.Generation, SessionGeneration: in.SessionGeneration,
			URI: in.URI, Ordinal: in.Ordinal, RequestID: in.RequestID, Size: in.Read.Size, MaxBytes: in.Read.MaxBytes,
		})
		if err != nil {
			return contract.AcceptOutput{}, permanent(err)
		}
		a.Metrics.Accepted(o, "", time.Time{})
		return contract.AcceptOutput{Outcome: o}, nil
	}
	r, err := a.Store.AcceptResourceVersion(ctx, ledger.AcceptRequest{
		SubscriptionID: in.SubscriptionID, Generation: in.Generation, SessionGeneration: in.SessionGeneration,
		URI: in.URI, Ordinal: in.Ordinal, RequestID: in.RequestID,
		Version: ledger.VersionInfo{
			MIMEType: in.Read.MIMEType, Digest: in.Read.Digest, Size: in.Read.Size,
			ServerName: in.Read.ServerName, ServerVersion: in.Read.ServerVersion, LastModified: in.Read.LastModified,
		},
		Body: body,
	})
	if err != nil {
		return contract.AcceptOutput{}, permanent(err)
	}
	a.Metrics.Accepted(r.Outcome, workflowID(ctx), in.Read.SentAt)
	return contract.AcceptOutput{Outcome: r.Outcome, VersionID: r.VersionID}, nil
}

// RecordNotFound passes a not-found answer through the ordinal fence (R21).
func (a *Ledger) RecordNotFound(ctx context.Context, in contract.AcceptInput) (mcpsync.Outcome, error) {
	o, err := a.Store.RecordNotFound(ctx, ledger.NotFoundRequest{
		SubscriptionID: in.SubscriptionID, Generation: in.Generation, SessionGeneration: in.SessionGeneration,
		URI: in.URI, Ordinal: in.Ordinal, RequestID: in.RequestID,
	})
	if err != nil {
		return "", permanent(err)
	}
	a.Metrics.NotFound(o)
	return o, nil
}

// workflowID is the ID of the workflow that scheduled the running activity ("" outside one).
func workflowID(ctx context.Context) string {
	if !activity.IsActivity(ctx) {
		return ""
	}
	return activity.GetInfo(ctx).WorkflowExecution.ID
}
