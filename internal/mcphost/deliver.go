package mcphost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Updater delivers Temporal workflow updates; a Temporal client satisfies it. A Signaler that
// also implements it lets the host deliver notifications by update (Delivery).
type Updater interface {
	UpdateWorkflow(ctx context.Context, options client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error)
}

// Delivery is how the host hands a routed resources/updated notification to the workflows of
// the subscriptions it names (issue 16). The zero value is DeliverUpdate.
type Delivery int

const (
	// DeliverUpdate sends each notification as the workflow update
	// contract.UpdateResourceUpdated when the Signaler implements Updater (else as a signal).
	// The server persists an update once, in the workflow task that handles it, where a signal
	// is persisted on arrival and again with the task it causes: about half of Temporal's
	// PostgreSQL work per notification (issue 16's measurements). An update is accepted only
	// when that task completes, so the host keeps a bounded number in flight per session
	// (DefaultUpdatesInFlight) instead of waiting for each, and retries each under its update ID until
	// it is accepted (one admitted but not accepted is lost if the server restarts) or its
	// workflow is gone. One the workflow rejects — a worker without the handler ran its task, as
	// during a rolling upgrade — or that the server refuses (updates disabled) is sent as the
	// signal instead.
	DeliverUpdate Delivery = iota
	// DeliverSignal sends each notification as the signal contract.SignalResourceUpdated,
	// durable when the call returns; a session's routing lane waits for each.
	DeliverSignal
)

// String returns the delivery's name as ParseDelivery reads it.
func (d Delivery) String() string {
	if d == DeliverSignal {
		return "signal"
	}
	return "update"
}

// ParseDelivery reads a delivery name: "update" (also the empty string) or "signal".
func ParseDelivery(s string) (Delivery, error) {
	switch strings.TrimSpace(s) {
	case "", "update":
		return DeliverUpdate, nil
	case "signal":
		return DeliverSignal, nil
	}
	return 0, fmt.Errorf("notification delivery %q: want update or signal", s)
}

// DefaultUpdatesInFlight bounds the notification updates a session has sent and not yet seen
// accepted; routing waits for a free slot, so a slow Temporal slows routing (and lets the next
// batch of notifications grow) instead of piling up calls.
const DefaultUpdatesInFlight = 256

// updatesInFlight is the bound a new session takes; tests lower it (export_bounds_test.go).
var updatesInFlight = DefaultUpdatesInFlight

// updateDeadline bounds the delivery of one update, retries included.
const updateDeadline = time.Minute

// updateRetryMax bounds the wait between two attempts of an update.
const updateRetryMax = 5 * time.Second

// updater returns the Signaler as an Updater when the host delivers by update and it can.
func (h *Host) updater() (Updater, bool) {
	if h.opts.Delivery != DeliverUpdate {
		return nil, false
	}
	u, ok := h.opts.Signaler.(Updater)
	return u, ok
}

// deliver delivers u to the workflow of t and notes it pending (noteSignalled). By signal it
// returns once the signal is delivered, and notes it only then. By update it notes it first and
// sends the update in the background, once a slot is free (DefaultUpdatesInFlight); an update
// that finally fails clears that note (forgetSignalled), so that the next notification of the
// URI is delivered again. After route has ended (endDeliveries) an update is sent before deliver
// returns.
func (c *Conn) deliver(ctx context.Context, norm string, t ledger.NotificationTarget, u contract.ResourceUpdated, log *zap.Logger) {
	up, byUpdate := c.host.updater()
	if !byUpdate {
		if c.signal(ctx, t.WorkflowID, u, log) {
			c.noteSignalled(norm, t, u.ReceivedAt)
		}
		return
	}
	c.noteSignalled(norm, t, u.ReceivedAt)
	send := func() {
		// The delivery may outlive the routing call that started it; it keeps its trace.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), updateDeadline)
		defer cancel()
		defer context.AfterFunc(c.host.graceOver, cancel)() // a stopping host waits only so long
		byUpdate, err := DeliverNotification(dctx, up, c.host.opts.Signaler, t.WorkflowID, u)
		switch {
		case err != nil && c.host.graceOver.Err() != nil:
			c.forgetSignalled(norm, t, u.ReceivedAt)
			log.Info("notification delivery abandoned: the host is stopping (the next session re-reads)", zap.String("workflow", t.WorkflowID))
		case err != nil:
			c.forgetSignalled(norm, t, u.ReceivedAt)
			log.Warn("delivering a notification to its subscription failed", zap.String("workflow", t.WorkflowID), zap.Error(err))
		case !byUpdate:
			log.Debug("notification update refused; signalled instead", zap.String("workflow", t.WorkflowID))
		}
	}
	c.dmu.Lock()
	if c.dclosed || c.slots == nil {
		c.dmu.Unlock()
		send()
		return
	}
	c.deliveries.Add(1)
	c.dmu.Unlock()
	c.slotWaits.Add(1)
	c.slots <- struct{}{}
	c.slotWaits.Add(-1)
	go func() {
		defer func() { <-c.slots; c.deliveries.Done() }()
		send()
	}()
}

// endDeliveries waits for the updates in flight; any later one is sent synchronously.
func (c *Conn) endDeliveries() {
	c.dmu.Lock()
	c.dclosed = true
	c.dmu.Unlock()
	c.deliveries.Wait()
}

// signal delivers u as the resource-updated signal, with retries.
func (c *Conn) signal(ctx context.Context, workflowID string, u contract.ResourceUpdated, log *zap.Logger) bool {
	sig := c.host.opts.Signaler
	if err := retry(ctx, func(ctx context.Context) error {
		return sig.SignalWorkflow(ctx, workflowID, "", contract.SignalResourceUpdated, u)
	}); err != nil {
		log.Warn("signalling subscription failed", zap.String("workflow", workflowID), zap.Error(err))
		return false
	}
	return true
}

// DeliverNotification delivers u to the workflow workflowID as the resource-updated workflow
// update and waits until the workflow has accepted it (byUpdate true), retrying with a growing
// pause until ctx ends. Its update ID names the notification (session generation and sequence
// number), so a retry after a lost reply, or after the server lost an update it had admitted,
// is the same update, never a second one; one the server aborted because the run continued as
// new goes to the next run. A workflow that is gone ends it with the server's NotFound. An
// update that will not be taken as one — the workflow rejected it (a worker without the
// handler ran its task), the run has had as many updates as the server allows, or the server
// refuses updates — is sent as the signal of the same name instead (byUpdate false), with
// retries.
func DeliverNotification(ctx context.Context, up Updater, sig Signaler, workflowID string, u contract.ResourceUpdated) (byUpdate bool, err error) {
	opts := client.UpdateWorkflowOptions{
		UpdateID:     fmt.Sprintf("notification-%d-%d", u.SessionGeneration, u.Seq),
		WorkflowID:   workflowID,
		UpdateName:   contract.UpdateResourceUpdated,
		Args:         []any{u},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	}
	wait := 100 * time.Millisecond
	for {
		err := updateOnce(ctx, up, opts)
		switch {
		case err == nil:
			return true, nil
		case refusedUpdate(err):
			if serr := retry(ctx, func(ctx context.Context) error {
				return sig.SignalWorkflow(ctx, workflowID, "", contract.SignalResourceUpdated, u)
			}); serr != nil {
				return false, fmt.Errorf("update refused (%w), and the signal failed: %w", err, serr)
			}
			return false, nil
		case isNotFound(err):
			return true, err
		}
		select {
		case <-ctx.Done():
			return true, fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, updateRetryMax)
	}
}

// updateOnce sends the update and waits for its outcome; the handler completes in the workflow
// task that accepts it, so the outcome comes with the acceptance.
func updateOnce(ctx context.Context, up Updater, opts client.UpdateWorkflowOptions) error {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h, err := up.UpdateWorkflow(actx, opts)
	if err != nil {
		return err
	}
	return h.Get(actx, nil)
}

// refusedUpdate reports whether err says the update will not be taken as one: the workflow
// rejected it or its handler failed (an application error: the handler never fails, so a worker
// without it ran the task), the run has received as many updates as the server allows
// (FailedPrecondition; history.maxTotalUpdates), or the server does not offer updates.
func refusedUpdate(err error) bool {
	if _, ok := errors.AsType[*temporal.ApplicationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*serviceerror.FailedPrecondition](err); ok {
		return true
	}
	if _, ok := errors.AsType[*serviceerror.PermissionDenied](err); ok {
		return true
	}
	_, ok := errors.AsType[*serviceerror.Unimplemented](err)
	return ok
}

// isNotFound reports whether err is the server's NotFound: the workflow has completed (or
// never existed), so nothing is left to deliver to.
func isNotFound(err error) bool {
	_, ok := errors.AsType[*serviceerror.NotFound](err)
	return ok
}
