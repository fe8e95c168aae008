package contract

import (
	"time"

	"github.com/mcpsync/mcpsync"
)

// SubscriptionInput starts (or continues) a SubscriptionWorkflow.
type SubscriptionInput struct {
	Principal string
	Source    string
	SourceID  int64
	URI       string // normalized
	ServerURI string // as the server spells it; what reads send
	// BackstopSeconds and PollSeconds configure refresh (R11, R28).
	BackstopSeconds int
	PollSeconds     int
	// State is nil on the first run and carries everything through continue-as-new.
	State *SubscriptionState
}

// SubscriptionState is the whole state of a subscription workflow, carried through
// continue-as-new. The ledger is the truth; this is the workflow's copy for decisions.
type SubscriptionState struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	HostQueue         string
	CanSubscribe      bool // the session negotiated resources.subscribe
	// NotAcknowledged: on a 2026-07-28 session the server's subscriptions/listen
	// acknowledgement left this URI out, so nothing watches it and the subscription polls
	// (R11, issue 13 item 3) although CanSubscribe is set (its URI stays in the host's listen
	// set, so closing still releases it).
	NotAcknowledged bool
	// ListenGen and ListenEpoch are the newest listen-stream epoch acted on (issue 13 item 4):
	// a SessionChanged of the same session generation with a higher ListenEpoch re-establishes.
	ListenGen, ListenEpoch int64
	// PendingListenEpoch is an epoch signalled but not acted on yet (0: none).
	PendingListenEpoch int64
	Machine            mcpsync.State // the workflow state machine's state
	Dirty              bool
	Reason             string // why the subscription is not ACTIVE, if it is not
	ReadSeq            int64  // request IDs issued so far by this workflow
	CloseEpoch         int64
	// Pending signals recorded but not yet acted on.
	PendingUnsubscribe   string // reason, when an unsubscribe or revoke is pending
	PendingSessionChange int64
	PendingReconcile     bool
	LastNotificationGen  int64
	LastNotificationSeq  int64
	// DefinitionVersion is the source's definition version this subscription last saw when
	// it established itself (DefinitionSeen: it has seen one). When a later establishment
	// finds a newer one (`source update`), the source's periods then replace the start
	// input's: BackstopSeconds and PollSeconds (0: the start input's).
	DefinitionVersion int64 `json:",omitempty"`
	DefinitionSeen    bool  `json:",omitempty"`
	BackstopSeconds   int   `json:",omitempty"`
	PollSeconds       int   `json:",omitempty"`
	// LastReadSentAt is when the host sent the last read that answered, on the clock of the
	// host of session LastReadSessionGen: a notification of that session received before it
	// is covered by that read (R13, R27).
	LastReadSentAt      time.Time `json:",omitzero"`
	LastReadSessionGen  int64     `json:",omitempty"`
	LastAcceptedOrdinal int64
	LastAcceptedDigest  string
	Counters            Counters
	UnsubscribeAttempts int
	TombstoneAttempts   int // reconciliation scans run for the current not-found read
	EstablishFailures   int
	ContinuedAsNew      int
	LastSignalIDs       []string // recent unsubscribe/revoke/reconcile IDs, for dedupe
	// CloseFenceFailures counts the consecutive failed close fences of PendingUnsubscribe;
	// it sets the backoff of the next attempt (R18).
	CloseFenceFailures int
	// PendingMark is the reason of a MarkReconciliationRequired that failed and is retried
	// before the next subscribe attempt (R12).
	PendingMark string
	// NextReason is the reason of the next read (R14); empty means notification.
	NextReason mcpsync.ReadReason
	// TombstoneByReadsAt is Counters.NotFound+1 when a catalog refused to confirm the current
	// not-found read because a resource template produces the URI (R21), 0 otherwise: while
	// it still equals Counters.NotFound+1, the deletion is confirmed by repeated not-found
	// reads, not by scans. TombstoneProbes counts those reads so far.
	TombstoneByReadsAt int64
	TombstoneProbes    int
}

// Counters count what a subscription did, so read amplification can be measured (R27).
type Counters struct {
	Notifications int64 // notifications received (merged pulses counted one by one)
	// Signals counts ResourceUpdated deliveries received, as signals or as resource-updated
	// workflow updates alike (the name is kept: it is part of the carried state): a burst the
	// host merged into one delivery is one, so Notifications - Signals is what the host merged
	// (R27).
	Signals            int64 `json:",omitempty"`
	NotificationsStale int64 // old-session or duplicate notifications ignored
	// PulsesCovered counts notifications that arrived during a read but had reached the host
	// before that read was sent: the read covers them, so no follow-up read is due (R13, R27).
	PulsesCovered int64
	Reads         int64
	ReadsByReason map[mcpsync.ReadReason]int64
	Accepted      int64
	Revalidated   int64
	Refused       int64
	NotFound      int64
	ReadFailures  int64
	// ReadsLocal counts the reads that the fast path read and answered on the workflow's own
	// worker (ActLocalRead, issue 16 item 2); Reads - ReadsLocal went to the host queue.
	ReadsLocal int64 `json:",omitempty"`
}

// ResourceUpdated is the session host's signal for notifications/resources/updated: one, or
// a burst of the same URI merged by the host.
type ResourceUpdated struct {
	SessionGeneration int64
	Seq               int64 // the (newest) per-session sequence number
	ServerURI         string
	// Pulses is how many notifications this signal stands for (0 means 1).
	Pulses int
	// ReceivedAt is when the (newest) notification reached the host, on the host's clock:
	// a read sent later by the same host already covers it.
	ReceivedAt time.Time
}

// Unsubscribe asks the workflow to close the subscription (also used for revocation).
type Unsubscribe struct {
	ID     string
	Reason string
}

// SessionChanged tells a subscription that its source has a new session generation: its
// notifications may have been lost (R12).
//
// On a 2026-07-28 session a subscriptions/listen stream that ended without its complete
// result is a new epoch within the generation (issue 13 item 4): ListenEpoch > 0 then numbers
// it (increasing within the generation) and Generation is the current one; nothing was
// replayed, so the subscription re-establishes and re-reads as after a new generation.
type SessionChanged struct {
	Generation  int64
	ListenEpoch int64 `json:",omitempty"`
}

// Reconcile asks a subscription to leave RECONCILIATION_REQUIRED now.
type Reconcile struct {
	ID string
}

// EnsureInput creates or finds the ledger row of a subscription.
type EnsureInput struct {
	Principal  string
	SourceID   int64
	URI        string
	ServerURI  string
	WorkflowID string
}

// SubscriptionRef is the ledger's view of a subscription, as activities report it.
type SubscriptionRef struct {
	ID                  int64
	Generation          int64
	SessionGeneration   int64
	State               mcpsync.State
	Reason              string
	LastIssuedOrdinal   int64
	LastAcceptedOrdinal int64
	LastAcceptedDigest  string
	CloseEpoch          int64
}

// SessionInfo is a source's current session as the ledger records it.
type SessionInfo struct {
	Live         bool
	Generation   int64
	HostQueue    string
	CanSubscribe bool
	ListChanged  bool
	SnapshotIDs  bool
	// BackstopSeconds and PollSeconds are the source's refresh periods as the ledger holds
	// them now, under DefinitionVersion (`source update` raises it); all 0 in results
	// recorded before they were added.
	BackstopSeconds   int   `json:",omitempty"`
	PollSeconds       int   `json:",omitempty"`
	DefinitionVersion int64 `json:",omitempty"`
}

// TransitionInput names a guarded state transition of a subscription.
type TransitionInput struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	CloseEpoch        int64
	Reason            string
	// NotAcknowledged (Activate only) records that the URI is not watched on this session
	// (SubscribeOutput.NotAcknowledged): status then shows polling (issue 13 item 3).
	NotAcknowledged bool `json:",omitempty"`
}

// TransitionOutput is the ledger's outcome of a transition.
type TransitionOutput struct {
	Outcome      mcpsync.Outcome
	State        mcpsync.State
	Reason       string
	CloseOrdinal int64
	CloseEpoch   int64
}

// AllocateInput asks for a readOrdinal (R14).
type AllocateInput struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string
	RequestID         string
	Reason            mcpsync.ReadReason
}

// AllocateOutput is the outcome of an allocation.
type AllocateOutput struct {
	Outcome mcpsync.Outcome
	Ordinal int64
	State   mcpsync.State
}

// ReadInput asks the session host for one resources/read on a given session.
type ReadInput struct {
	SourceID          int64
	SessionGeneration int64
	ServerURI         string
	Ordinal           int64
	RequestID         string
}

// ReadOutput describes the response; the body is already in the blob table under Digest.
type ReadOutput struct {
	Found         bool
	Digest        string
	MIMEType      string
	Size          int64
	ServerName    string
	ServerVersion string
	LastModified  string
	// SentAt is when the host sent the resources/read, on the host's clock: notifications
	// the same host received before it announce changes this read already sees.
	SentAt time.Time
	// TooLarge: the contents (Size bytes: text bytes plus decoded blob bytes) were over the
	// source's bound MaxBytes, so nothing was stored and Digest is empty; the acceptance point
	// records a TOO_LARGE receipt instead of a version (issue 14 item 6). Omitted when false,
	// so earlier payloads keep their bytes.
	TooLarge bool  `json:",omitempty"`
	MaxBytes int64 `json:",omitempty"`
}

// AcceptInput offers a read's response to acceptResourceVersion (R16). The embedded ReadID
// is the identity the dispatch was allocated with; its fields are promoted, so the JSON of
// the payload is the same as with the fields spelled out.
type AcceptInput struct {
	mcpsync.ReadID
	Read ReadOutput
}

// AcceptOutput is the acceptance point's outcome.
type AcceptOutput struct {
	Outcome   mcpsync.Outcome
	VersionID int64
}

// SessionCall is a session-bound call about one resource: subscribe or unsubscribe.
type SessionCall struct {
	SourceID          int64
	SessionGeneration int64
	ServerURI         string
	SubscriptionID    int64
}

// SubscribeOutput is what MCPSubscribe established (R9). On a 2025-11-25 session an
// acknowledged resources/subscribe is the whole answer (zero value). On a 2026-07-28 session
// the URI rides on a subscriptions/listen stream, and NotAcknowledged reports that the
// stream's acknowledgement left it out: the server does not watch it, so the subscription
// refreshes by polling with its published staleness bound (R11, issue 13 item 3).
type SubscribeOutput struct {
	NotAcknowledged bool `json:",omitempty"`
}

// UnsubscribeOutput reports whether the server acknowledged. Sent is false when the host did
// not need to call the server (another subscription still holds the server-side
// subscription, or it never existed on this session).
type UnsubscribeOutput struct {
	Acked bool
	Sent  bool
}

// StateView is what the state query returns.
type StateView struct {
	State               mcpsync.State
	Reason              string
	SubscriptionID      int64
	Generation          int64
	SessionGeneration   int64
	LastAcceptedOrdinal int64
	LastAcceptedDigest  string
	ContinuedAsNew      int
	Counters            Counters
}
