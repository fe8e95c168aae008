package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/mcpsync/mcpsync"
)

// Workflow type names of discovery.
const (
	// SourceWorkflowName is the long-lived workflow of one source: it runs discovery scans on
	// list_changed, on a new session, on request and on a schedule.
	SourceWorkflowName = "SourceWorkflow"
	// DiscoveryScanWorkflowName runs rounds until it can publish a catalog (R4-R8).
	DiscoveryScanWorkflowName = "DiscoveryScanWorkflow"
)

// Signal and query names of SourceWorkflow.
const (
	// SignalListChanged carries a ListChanged from the session host.
	SignalListChanged = "list-changed"
	// SignalScanRequest carries a ScanRequest (CLI, new session).
	SignalScanRequest = "scan-request"
	// QuerySourceState returns a SourceView.
	QuerySourceState = "source-state"
)

// Discovery activity names. ActDiscoveryRound and ActDiscoveryRoundPair are session-bound
// (host queue); the others are ledger activities run as local activities.
const (
	ActDiscoveryRound     = "DiscoveryRound"
	ActDiscoveryRoundPair = "DiscoveryRoundPair"
	ActAbandonScan        = "AbandonScan"
	ActPublishCatalog     = "PublishCatalog"
	ActInvalidateCatalogs = "InvalidateCatalogs"
	ActConfirmTombstone   = "ConfirmTombstone"
)

// Proof levels of a published catalog (R5-R7).
const (
	// ProofSnapshotProven: two consecutive rounds on one session whose every page carried the
	// same ID of a negotiated snapshot extension, with equal sets (R5).
	ProofSnapshotProven = "SNAPSHOT_PROVEN"
	// ProofSnapshotUnproven: two consecutive rounds on one session with equal sets and no
	// list_changed in either (R6, R7). Never handed to integrity tasks.
	ProofSnapshotUnproven = "SNAPSHOT_UNPROVEN"
	// ProofReconciliationRequired: no two rounds agreed within the bound. Accepted by nobody.
	ProofReconciliationRequired = "RECONCILIATION_REQUIRED"
)

// Round failure kinds (R8 and the ways a session-bound round can end early).
const (
	// RoundCursorCycle: a cursor came back that the round had already followed.
	RoundCursorCycle = "CURSOR_CYCLE"
	// RoundPageCap: the round reached its page cap.
	RoundPageCap = "PAGE_CAP"
	// RoundCursorError: the server rejected a cursor (invalid, expired, from an old session).
	RoundCursorError = "CURSOR_ERROR"
	// RoundStaleSession: the session ended or was replaced during the round.
	RoundStaleSession = "STALE_SESSION"
	// RoundListError: any other error of a list request.
	RoundListError = "LIST_ERROR"
	// RoundNoSession: the source had no live session when the round was due.
	RoundNoSession = "NO_SESSION"
	// RoundHostUnreachable: the host holding the session did not pick the round up.
	RoundHostUnreachable = "HOST_UNREACHABLE"
	// RoundAbandoned: the round's activity ended without recording its end (timeout, crash).
	RoundAbandoned = "ABANDONED"
	// RoundEntryCap: a page listed more entries than the per-page cap, or the round more than
	// its per-round cap (issue 14 item 6): the round is not proof of anything.
	RoundEntryCap = "ENTRY_CAP"
)

// SourceWorkflowID is the workflow ID of a source's SourceWorkflow.
func SourceWorkflowID(source string) string { return "source/" + source }

// ReconcileScanWorkflowID is the workflow ID of the DiscoveryScanWorkflow a subscription runs
// to confirm a tombstone: one per (subscription generation, not-found ordinal, attempt).
func ReconcileScanWorkflowID(req ReconcileScanRequest) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%d/%d/%d/%d", req.SubscriptionID, req.Generation, req.ReadOrdinal, req.Attempt))
	return "scan/" + req.Source + "/tombstone-" + hex.EncodeToString(h[:8])
}

// SourceInput starts (or continues) a SourceWorkflow.
type SourceInput struct {
	SourceID int64
	Source   string
	// RecheckSeconds is the period of scheduled re-checks; 0 means the default (300).
	RecheckSeconds int
	// State is nil on the first run and carries everything through continue-as-new.
	State *SourceState
}

// SourceState is the whole state of a SourceWorkflow, carried through continue-as-new.
type SourceState struct {
	// Pending: a scan is due (signals and timers that arrived since the last scan started).
	Pending         bool
	PendingReasons  []string // newest last, bounded
	PendingRequests []string // scan request IDs waiting for the next scan
	// Scans counts scans started; it numbers their workflow IDs.
	Scans int64
	// Invalidated: the catalogs of the source were invalidated since the last scan started,
	// so a burst of list_changed invalidates once.
	Invalidated bool
	// Assigned maps recent scan requests to the scan that serves them (bounded).
	Assigned      []ScanAssignment
	SeenRequests  []string // recent request IDs, for dedupe (bounded)
	LastCatalogID int64
	LastLevel     string
	LastScanID    string
	NextCheckAt   time.Time
	// Counters, so coalescing can be measured.
	ListChangedSignals int64
	ScanRequests       int64
	Coalesced          int64 // triggers folded into an already pending scan
	ContinuedAsNew     int
}

// ScanAssignment says which scan workflow serves a scan request.
type ScanAssignment struct {
	RequestID      string
	ScanWorkflowID string
}

// ListChanged is the session host's signal for notifications/resources/list_changed.
type ListChanged struct {
	SessionGeneration int64
	Count             int64 // list_changed received on the session so far
}

// ScanRequest asks a SourceWorkflow for a scan that starts after the request arrived.
type ScanRequest struct {
	ID     string
	Reason string
}

// SourceView is what the source-state query returns.
type SourceView struct {
	Source             string
	Running            string // the scan workflow running now, if any
	Pending            bool
	Scans              int64
	Assigned           []ScanAssignment
	LastCatalogID      int64
	LastLevel          string
	LastScanID         string
	NextCheckAt        time.Time
	ListChangedSignals int64
	ScanRequests       int64
	Coalesced          int64
}

// DiscoveryScanInput starts a DiscoveryScanWorkflow. Zero tunables mean the workflow's
// defaults.
type DiscoveryScanInput struct {
	SourceID int64
	Source   string
	Reason   string
	// RecheckSeconds sets nextCheckAt and the staleness bound of the catalog (default 300).
	RecheckSeconds int
	// MaxRounds bounds the rounds before RECONCILIATION_REQUIRED (default 6, minimum 2).
	MaxRounds int
	// MaxPages caps the pages of one round, both lists together (R8; default 20,000).
	MaxPages int
}

// RoundInput asks the host holding a session for one round.
type RoundInput struct {
	ScanKey           string // unique per round: <ScanRun>/round-<Round>
	ScanRun           string // <scan workflow id>/<run id>
	ScanWorkflowID    string
	Round             int
	SourceID          int64
	SessionGeneration int64
	MaxPages          int
}

// RoundPairInput asks the host holding a session for rounds A and B back to back (issue 16
// item 5): B begins once A's end is committed, and only if A completed. Both name the same
// session generation.
type RoundPairInput struct {
	A, B RoundInput
}

// RoundResult is what a round returns: digests and counts only; the entries are in the
// ledger under ScanID and the cursors are gone with the activity.
type RoundResult struct {
	ScanID            int64
	Round             int
	SessionGeneration int64
	Complete          bool
	FailureKind       string
	Failure           string
	ResourcePages     int
	TemplatePages     int
	Resources         int
	Templates         int
	Duplicates        int
	SetDigest         string
	// CursorChainDigest digests the sequence of cursor digests the round followed.
	CursorChainDigest string
	// SnapshotNegotiated: the session's capability receipt has the snapshot-ID extension.
	SnapshotNegotiated bool
	// SnapshotIDs are the distinct IDs seen (first-seen order, at most 8); SnapshotPages is
	// the number of pages that carried one; SnapshotID is set when every page carried the
	// same one.
	SnapshotIDs         []string
	SnapshotPages       int
	SnapshotID          string
	ListChangedObserved int64
	StartedAt           time.Time
	EndedAt             time.Time
}

// Pages is the number of pages the round requested, both lists together.
func (r RoundResult) Pages() int { return r.ResourcePages + r.TemplatePages }

// AbandonInput marks a round that ended without recording its end.
type AbandonInput struct {
	ScanKey string
	Reason  string
}

// PublishInput asks the ledger to publish a catalog of Level resting on rounds BasisScanIDs
// (A, B). The ledger re-checks the rounds and refuses a level they do not prove.
type PublishInput struct {
	CatalogKey        string // the scan run
	ScanWorkflowID    string
	SourceID          int64
	SessionGeneration int64
	Level             string
	Reason            string
	RoundsUsed        int
	BasisScanIDs      []int64
	// EntriesScanID names the round whose entries a RECONCILIATION_REQUIRED catalog shows
	// (0: none); PROVEN and UNPROVEN catalogs show round B's.
	EntriesScanID  int64
	RecheckSeconds int
}

// PublishOutput is the ledger's answer to PublishInput.
type PublishOutput struct {
	Published             bool
	Refusal               string // why the rounds do not prove Level, when not published
	CatalogID             int64
	Level                 string
	MeasuredAt            time.Time
	NextCheckAt           time.Time
	StalenessBoundSeconds float64
}

// DiscoveryScanResult is what a DiscoveryScanWorkflow returns.
type DiscoveryScanResult struct {
	CatalogID             int64
	Level                 string
	Reason                string
	SessionGeneration     int64
	Rounds                int
	Resources             int
	Templates             int
	SetDigest             string
	MeasuredAt            time.Time
	NextCheckAt           time.Time
	StalenessBoundSeconds float64
}

// InvalidateInput invalidates a source's catalogs after a list_changed (R3).
type InvalidateInput struct {
	SourceID int64
	Reason   string
}

// ReconcileScanRequest names the subscription a tombstone-confirmation scan is for.
type ReconcileScanRequest struct {
	SourceID       int64
	Source         string
	SubscriptionID int64
	Generation     int64
	ReadOrdinal    int64 // the not-found read's ordinal
	Attempt        int   // 0, 1, ...: a new scan for the same read needs a new attempt number
}

// ConfirmTombstoneInput asks the ledger to confirm a TOMBSTONE_PENDING subscription's
// deletion with a catalog.
type ConfirmTombstoneInput struct {
	SubscriptionID int64
	Generation     int64
	CatalogID      int64
}

// ConfirmTombstoneOutput is the ledger's answer. Outcome TRANSITIONED or ALREADY_DONE: the
// subscription is UNSUBSCRIBING with the close fence frozen (CloseOrdinal, CloseEpoch) and a
// tombstone version plus an invalidation were written. REFUSED: Refusal says why.
type ConfirmTombstoneOutput struct {
	Outcome      mcpsync.Outcome
	Refusal      mcpsync.TombstoneRefusal
	State        mcpsync.State
	ReadOrdinal  int64
	CloseOrdinal int64
	CloseEpoch   int64
	VersionID    int64
}
