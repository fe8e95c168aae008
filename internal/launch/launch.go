// Package launch starts subscription workflows the one way every caller (the CLI, the MCP
// gateway, reconciliation) must: idempotently, with the search attributes and UI metadata the
// workflow is listed by.
package launch

import (
	"context"
	"sync"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/searchattr"
)

// ensured remembers the clients and namespaces whose search attributes Subscription has seen
// registered: a bulk subscribe or a gateway starts thousands of workflows, and listing the
// namespace's attributes before each start was one more round trip per start (issue 16
// item 4). Registered attributes are not removed while a process runs.
var ensured sync.Map

type ensuredKey struct {
	c  client.Client
	ns string
}

// Subscription starts (or finds running: conflict policy USE_EXISTING) the workflow wfID of a
// subscription, registering the search attributes it is started with if the namespace lacks
// them (no worker may have run yet). The workflow carries a static summary and details for the
// Temporal UI. Starting twice with the same wfID never creates a second run.
func Subscription(ctx context.Context, tc client.Client, namespace, wfID string, in contract.SubscriptionInput) (client.WorkflowRun, error) {
	return start(ctx, tc, namespace, wfID, in, false)
}

// SubscriptionEager is Subscription asking for eager execution: when tc is the client of a
// worker in this process that polls contract.TaskQueue and has a free workflow-task slot, the
// server hands the new workflow's first workflow task back in the start's answer and that
// worker runs it at once — no transfer task, no trip through matching, a third less of the
// server's and PostgreSQL's work per start (issue 16 item 4). Otherwise it is a plain start.
//
// An eager task's timeout runs from the start, not from when a worker has room for it: the
// caller must bound how many eagerly started workflows may still be in their first workflow
// task (the bulk subscribe's start window, contract.EagerWindowMax). A burst of a thousand
// eager starts into one worker timed half of those tasks out.
func SubscriptionEager(ctx context.Context, tc client.Client, namespace, wfID string, in contract.SubscriptionInput) (client.WorkflowRun, error) {
	return start(ctx, tc, namespace, wfID, in, true)
}

func start(ctx context.Context, tc client.Client, namespace, wfID string, in contract.SubscriptionInput, eager bool) (client.WorkflowRun, error) {
	key := ensuredKey{tc, namespace}
	if _, done := ensured.Load(key); !done {
		if err := searchattr.Ensure(ctx, tc, namespace); err != nil {
			return nil, err
		}
		ensured.Store(key, true)
	}
	return tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       wfID,
		TaskQueue:                contract.TaskQueue,
		WorkflowIDConflictPolicy: enums.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		EnableEagerStart:         eager,
		// What the Temporal UI shows without decoding payloads (issue 17 part 7).
		StaticSummary: contract.SubscriptionSummary(in),
		StaticDetails: contract.SubscriptionStaticDetails(in),
		TypedSearchAttributes: temporal.NewSearchAttributes(
			contract.SearchSource.ValueSet(in.Source), contract.SearchURI.ValueSet(in.URI),
			contract.SearchPrincipal.ValueSet(in.Principal), contract.SearchState.ValueSet(string(mcpsync.StateDiscovered)),
		),
	}, contract.SubscriptionWorkflowName, in)
}
