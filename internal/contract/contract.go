// Package contract holds what workflows and activities exchange: activity and signal names,
// their payloads, task queues, workflow IDs and search attributes. It imports neither pgx nor
// the MCP SDK, so workflow code stays free of I/O libraries, and it is the only package both
// sides share. Payloads carry digests and counters, never resource bodies.
package contract

import (
	"crypto/sha256"
	"encoding/hex"

	"go.temporal.io/sdk/temporal"
)

// TaskQueue is the shared queue of workflows and ledger activities. Session-bound MCP
// activities run on the queue of the worker that holds the source's session (Session.HostQueue).
const TaskQueue = "mcpsync"

// Workflow type names.
const (
	SubscriptionWorkflowName = "SubscriptionWorkflow"
)

// Signal names.
const (
	SignalResourceUpdated = "resource-updated"
	SignalUnsubscribe     = "unsubscribe"
	SignalSessionChanged  = "session-changed"
	SignalRevoke          = "revoke"
	SignalReconcile       = "reconcile"
)

// Update names.
const (
	// UpdateResourceUpdated delivers a ResourceUpdated as a Temporal workflow update instead of
	// the signal of the same name (issue 16): the server dispatches it in a speculative workflow
	// task it persists once, where a signal is persisted on arrival and again with the task it
	// causes. The subscription workflow's handler never rejects it; a rejection means a worker
	// without the handler ran the task, and the host then sends the signal instead.
	UpdateResourceUpdated = "resource-updated"
)

// Query names.
const (
	QueryState = "state"
)

// Ledger activity names. They run as local activities next to the workflow: each is one short
// Postgres transaction.
const (
	ActEnsureSubscription         = "EnsureSubscription"
	ActCurrentSession             = "CurrentSession"
	ActBeginSubscribe             = "BeginSubscribe"
	ActActivate                   = "Activate"
	ActMarkReconciliationRequired = "MarkReconciliationRequired"
	ActRestoreFromTombstone       = "RestoreFromTombstone"
	ActBeginUnsubscribe           = "BeginUnsubscribe"
	ActCompleteUnsubscribe        = "CompleteUnsubscribe"
	ActMarkUnsubscribeUnknown     = "MarkUnsubscribeUnknown"
	ActAllocateReadOrdinal        = "AllocateReadOrdinal"
	ActAcceptResourceVersion      = "AcceptResourceVersion"
	ActRecordNotFound             = "RecordNotFound"
	ActSubscriptionState          = "SubscriptionState"
)

// Session-bound activity names: they run on the host queue of the worker holding the session.
const (
	ActMCPSubscribe   = "MCPSubscribe"
	ActMCPUnsubscribe = "MCPUnsubscribe"
	ActMCPRead        = "MCPRead"
)

// Error types of non-retryable application errors, for errors.As on *temporal.ApplicationError.
const (
	// ErrTypeStaleSession: the call carried a session generation the host no longer holds.
	ErrTypeStaleSession = "StaleSession"
	// ErrTypePermanent: a retry cannot change the answer: the MCP server refused the call in
	// a way a retry cannot fix, or the ledger reported a malformed request (ErrInvalid), a
	// missing row (ErrNotFound) or a principal without a standing grant (ErrNoGrant). Ledger
	// refusals are outcomes in the activities' results, never errors of this type.
	ErrTypePermanent = "PermanentMCPError"
	// ErrTypeNoGrant: EnsureSubscription found no standing grant of the principal on the
	// source (R23), so it opens nothing. When the subscription's ledger row is open all the
	// same (its workflow ended, or lost a workflow task, before or while the grant was revoked)
	// the error's details are that row's SubscriptionRef, for the workflow to close it
	// through the close fence.
	ErrTypeNoGrant = "NoStandingGrant"
)

// Search attributes kept current by SubscriptionWorkflow, so the Temporal UI finds any
// subscription by source, URI, state or principal.
var (
	SearchSource    = temporal.NewSearchAttributeKeyKeyword("McpsyncSource")
	SearchURI       = temporal.NewSearchAttributeKeyKeyword("McpsyncURI")
	SearchState     = temporal.NewSearchAttributeKeyKeyword("McpsyncState")
	SearchPrincipal = temporal.NewSearchAttributeKeyKeyword("McpsyncPrincipal")
)

// SearchAttributeNames lists the project's search attributes (all Keyword), for registering
// them on a namespace.
var SearchAttributeNames = []string{"McpsyncSource", "McpsyncURI", "McpsyncState", "McpsyncPrincipal"}

// SubscriptionWorkflowID derives the workflow ID of (principal, source, normalized URI), so
// subscribing twice reaches the same workflow. The URI is hashed to keep the ID short and
// free of characters the UI escapes; the search attributes carry the readable values.
func SubscriptionWorkflowID(principal, source, normalizedURI string) string {
	h := sha256.Sum256([]byte(principal + "\x00" + source + "\x00" + normalizedURI))
	return "sub/" + source + "/" + hex.EncodeToString(h[:12])
}
