package contract

import "time"

// StartBatchWorkflowName is the workflow a bulk subscribe hands a batch of starts to (issue 16
// item 4): its one activity, ActStartSubscriptions, starts the batch's subscription workflows
// from a worker's own Temporal client, so that each start is eager — the server hands the new
// workflow's first workflow task back in the start's answer, to that worker, instead of
// dispatching it through the task queue — which a CLI process, polling no task queue, cannot
// ask for. Each start is launch.SubscriptionEager's (idempotent, conflict policy
// USE_EXISTING); no fence or ledger transition is part of it. Only a bulk subscribe whose start
// window is at most EagerWindowMax uses it.
const StartBatchWorkflowName = "StartBatchWorkflow"

// ActStartSubscriptions starts the subscription workflows of a StartBatchInput on the worker
// that runs it (a regular activity on TaskQueue).
const ActStartSubscriptions = "StartSubscriptions"

// StartBatchMax bounds the URIs of one batch, and StartBatchMaxBytes the bytes of their URIs
// (normalized and as the server spells them): a batch is one workflow input and one activity
// input in Temporal history, kept far below the server's payload limits.
const (
	StartBatchMax      = 100
	StartBatchMaxBytes = 128 << 10
)

// EagerWindowMax is the largest start window (subscriptions started and not yet ACTIVE) with
// which a bulk subscribe hands its starts to the worker: an eager first workflow task is
// started, and its timeout runs, from the moment the workflow is created, so the window is
// what bounds how many of them the worker holds at once. At 200 none timed out on 2 cores; a
// burst of 1,000 timed half of them out. A larger window, or none, starts from the CLI.
const EagerWindowMax = 200

// StartBatchTimeout bounds one batch workflow: a worker that does not know the workflow type
// (an older binary) never completes it, and the caller then starts the batch's URIs itself.
const StartBatchTimeout = time.Minute

// StartBatchInput is a batch of subscriptions of one principal on one source to start. It
// carries URIs (identifiers), never resource bodies.
type StartBatchInput struct {
	Principal       string
	Source          string
	SourceID        int64
	BackstopSeconds int
	PollSeconds     int
	// Parallel is how many starts are in flight at once (at least 1).
	Parallel int
	Items    []StartItem
}

// StartItem is one URI of a StartBatchInput.
type StartItem struct {
	URI       string // normalized
	ServerURI string // as the server spells it
}

// Subscription is the SubscriptionInput of item i.
func (in StartBatchInput) Subscription(i int) SubscriptionInput {
	return SubscriptionInput{
		Principal: in.Principal, Source: in.Source, SourceID: in.SourceID,
		URI: in.Items[i].URI, ServerURI: in.Items[i].ServerURI,
		BackstopSeconds: in.BackstopSeconds, PollSeconds: in.PollSeconds,
	}
}

// StartBatchOutput answers a StartBatchInput item by item: Errors[i] is "" when item i's
// workflow was started (or found running), else why its start failed. (Whether a start was
// eager is in the started workflow's first event, EagerExecutionAccepted.)
type StartBatchOutput struct {
	Errors []string
}
