package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/launch"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"reconcile", "SOURCE [URI] [--principal P] [--json]: re-run subscriptions that failed or sit in RECONCILIATION_REQUIRED", reconcile})
}

type reconcileJSON struct {
	URI        string        `json:"uri"`
	Principal  string        `json:"principal"`
	State      mcpsync.State `json:"state"`
	Reason     string        `json:"reason,omitempty"`
	WorkflowID string        `json:"workflowId"`
	Action     string        `json:"action"`
}

// subscriptionInput rebuilds the workflow input of a subscription from the ledger.
func subscriptionInput(src ledger.Source, s ledger.Subscription) contract.SubscriptionInput {
	return contract.SubscriptionInput{
		Principal: s.Principal, Source: src.Name, SourceID: src.ID, URI: s.URI, ServerURI: s.ServerURI,
		BackstopSeconds: src.BackstopSeconds, PollSeconds: src.PollSeconds,
	}
}

// reconcile signals running workflows of subscriptions that are not ACTIVE to try again now,
// and restarts the workflow of every subscription whose workflow is no longer running
// although the ledger says it is not CLOSED (a failed or terminated run).
func reconcile(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync reconcile SOURCE [URI] [--principal P] [--json]"
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	principal := fs.String("principal", "", "only this principal")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "SOURCE", "[URI]")
	if err != nil {
		return err
	}
	f := ledger.SubscriptionFilter{Principal: *principal}
	if len(pos) == 2 {
		if f.URI, err = normalizeURI(pos[1]); err != nil {
			return err
		}
	}
	st, src, err := e.storeSource(ctx, pos[0])
	if err != nil {
		return err
	}
	f.Source = src.Name
	subs, err := st.ListSubscriptions(ctx, f)
	if err != nil {
		return err
	}
	if len(subs) == 0 && len(pos) == 2 {
		return notFoundErr("no subscription to %s on %s", f.URI, src.Name)
	}
	tc, err := e.temporal(ctx)
	if err != nil {
		return err
	}
	var out []reconcileJSON
	for _, s := range subs {
		r := reconcileJSON{URI: s.URI, Principal: s.Principal, State: s.State, Reason: s.StateReason, WorkflowID: s.WorkflowID}
		if s.State == mcpsync.StateClosed {
			r.Action = "none (closed)"
			out = append(out, r)
			continue
		}
		running := false
		desc, err := tc.DescribeWorkflowExecution(ctx, s.WorkflowID, "")
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
		case err != nil:
			return fmt.Errorf("describing %s: %w", s.WorkflowID, err)
		default:
			running = desc.GetWorkflowExecutionInfo().GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_RUNNING
		}
		switch {
		case !running:
			if _, err := launch.Subscription(ctx, tc, e.Config.Namespace, s.WorkflowID, subscriptionInput(src, s)); err != nil {
				return fmt.Errorf("restarting %s: %w", s.WorkflowID, err)
			}
			r.Action = "restarted workflow"
		case s.State == mcpsync.StateActive:
			r.Action = "none (active)"
		default:
			if err := tc.SignalWorkflow(ctx, s.WorkflowID, "", contract.SignalReconcile, contract.Reconcile{ID: newID()}); err != nil {
				return fmt.Errorf("signalling %s: %w", s.WorkflowID, err)
			}
			r.Action = "asked to reconcile now"
		}
		out = append(out, r)
	}
	if *asJSON {
		return writeJSON(e.Stdout, out)
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "URI\tPRINCIPAL\tSTATE\tACTION\tREASON")
	for _, r := range out {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.URI, visible(r.Principal), r.State, r.Action, visible(orDash(r.Reason)))
	}
	return tw.Flush()
}
