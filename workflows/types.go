package workflows

import "github.com/mcpsync/mcpsync/internal/contract"

// ByType is every workflow function by the type name it is registered under: what a worker
// registers (internal/workerapp) and what the replay tests replay recorded histories with.
// Callers must not modify it.
var ByType = map[string]any{
	contract.SubscriptionWorkflowName:  SubscriptionWorkflow,
	contract.SourceWorkflowName:        SourceWorkflow,
	contract.DiscoveryScanWorkflowName: DiscoveryScanWorkflow,
	contract.StartBatchWorkflowName:    StartBatchWorkflow,
}
