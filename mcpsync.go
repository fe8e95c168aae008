// Package mcpsync is the vocabulary every part of mcpsync shares: subscription states, ledger
// outcomes, read reasons, receipt kinds, tombstone refusals, the identity of one read, and the
// MCP protocol versions. It depends on the standard library only, so the pure state machine,
// the workflows, the activities, the ledger and the CLI can all import it. Each name is defined
// here once; no other package spells these strings. The requirements cited (R1-R30) are in
// docs/SPEC.md.
package mcpsync

import "fmt"

// Protocol versions of MCP that mcpsync speaks.
const (
	// ProtocolVersion20251125 is the MCP revision with protocol sessions and
	// resources/subscribe; every session the host opens is pinned to it.
	ProtocolVersion20251125 = "2025-11-25"
	// ProtocolVersion20250618 is the revision before it, still offered by older servers.
	ProtocolVersion20250618 = "2025-06-18"
	// ProtocolVersion20250326 is the first revision with streamable HTTP.
	ProtocolVersion20250326 = "2025-03-26"
	// ProtocolVersion20241105 is the first published revision.
	ProtocolVersion20241105 = "2024-11-05"
	// ProtocolVersion20260728 is the stateless revision (server/discover, subscriptions/listen).
	ProtocolVersion20260728 = "2026-07-28"
)

// State is a subscription state (docs/SPEC.md, "Subscription ledger"). The ledger stores the
// durable ones; UPDATE_SEEN, READ_PENDING and VERSION_ACCEPTED exist only in the workflow and
// are ACTIVE in the ledger.
type State string

// Subscription states: the SPEC's machine plus TOMBSTONE_PENDING (R21).
const (
	StateDiscovered             State = "DISCOVERED"
	StateSubscribing            State = "SUBSCRIBING"
	StateActive                 State = "ACTIVE"
	StateUpdateSeen             State = "UPDATE_SEEN"
	StateReadPending            State = "READ_PENDING"
	StateVersionAccepted        State = "VERSION_ACCEPTED"
	StateUnsubscribing          State = "UNSUBSCRIBING"
	StateClosed                 State = "CLOSED"
	StateUnsubscribeUnknown     State = "UNSUBSCRIBE_UNKNOWN"
	StateReconciliationRequired State = "RECONCILIATION_REQUIRED"
	StateTombstonePending       State = "TOMBSTONE_PENDING"
)

// States lists every subscription state.
var States = []State{StateDiscovered, StateSubscribing, StateActive, StateUpdateSeen,
	StateReadPending, StateVersionAccepted, StateUnsubscribing, StateClosed,
	StateUnsubscribeUnknown, StateReconciliationRequired, StateTombstonePending}

// Closing reports whether the close fence has been passed: nothing may be read or accepted any
// more (R18, R19).
func (s State) Closing() bool {
	return s == StateUnsubscribing || s == StateUnsubscribeUnknown || s == StateClosed
}

// Live reports whether reads may be issued in this state (the ledger's ACTIVE).
func (s State) Live() bool {
	return s == StateActive || s == StateUpdateSeen || s == StateReadPending || s == StateVersionAccepted
}

// Durable reports whether the ledger stores this state (the workflow-only states are ACTIVE
// there).
func (s State) Durable() bool {
	switch s {
	case StateUpdateSeen, StateReadPending, StateVersionAccepted:
		return false
	}
	return s.Valid()
}

// Ledger returns the state as the ledger stores it: the workflow-only states map to ACTIVE.
func (s State) Ledger() State {
	if s.Live() {
		return StateActive
	}
	return s
}

// Valid reports whether s is one of the states above.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Outcome is the typed result of a guarded ledger transition. Refusals are outcomes, not
// errors: an error means the ledger could not decide (see the ledger package's error rule).
type Outcome string

// Outcomes of guarded transitions.
const (
	// OutcomeAllocated: a read ordinal was issued (R14).
	OutcomeAllocated Outcome = "ALLOCATED"
	// OutcomeAccepted: the watermark rose, a resourceVersion.v1 and an outbox row were written
	// (R16).
	OutcomeAccepted Outcome = "ACCEPTED"
	// OutcomeRevalidated: the watermark rose and the read confirmed the digest already
	// accepted; no new version and no invalidation are written (R17 single-flight
	// revalidation).
	OutcomeRevalidated Outcome = "REVALIDATED"
	// OutcomeStale: a read whose ordinal is not above the watermark (R17), or that reached a
	// subscription no longer ACTIVE for a reason other than close.
	OutcomeStale Outcome = "STALE"
	// OutcomeStaleAfterClose: content or not-found after the close fence: audit only (R19).
	OutcomeStaleAfterClose Outcome = "STALE_AFTER_CLOSE"
	// OutcomeOldSession: the request carries a session generation older than the
	// subscription's (R12).
	OutcomeOldSession Outcome = "OLD_SESSION"
	// OutcomeOldGeneration: the request carries an older subscription generation (R12).
	OutcomeOldGeneration Outcome = "OLD_GENERATION"
	// OutcomeNotDispatched: no dispatch with this subscription, ordinal, request ID,
	// generation, session generation and URI was ever issued.
	OutcomeNotDispatched Outcome = "NOT_DISPATCHED"
	// OutcomeDuplicate: a second, different response to a dispatch that already has its
	// outcome.
	OutcomeDuplicate Outcome = "DUPLICATE"
	// OutcomeRevoked: the subscription's principal holds no standing grant on the source any
	// more (R23, R24): no read ordinal is issued and no response is accepted once the
	// revocation has committed, whatever state the subscription is in.
	OutcomeRevoked Outcome = "REVOKED"
	// OutcomeNotActive: the subscription is not ACTIVE, so no read ordinal is issued (R18).
	OutcomeNotActive Outcome = "NOT_ACTIVE"
	// OutcomeTombstonePending: a not-found read on an ACTIVE subscription passed the ordinal
	// fence (R21).
	OutcomeTombstonePending Outcome = "TOMBSTONE_PENDING"
	// OutcomeTransitioned: the state change was applied.
	OutcomeTransitioned Outcome = "TRANSITIONED"
	// OutcomeAlreadyDone: the state change had already been applied by an identical earlier
	// call.
	OutcomeAlreadyDone Outcome = "ALREADY_DONE"
	// OutcomeRefused: the state change is not allowed from the current state.
	OutcomeRefused Outcome = "REFUSED"
	// OutcomeTooLarge: a read passed the ordinal fence but its contents were larger than the
	// source's size bound (--max-bytes): the watermark rose, and no blob, version or
	// invalidation was written; the subscription keeps its previous version (issue 14 item 6).
	OutcomeTooLarge Outcome = "TOO_LARGE"
)

// OK reports whether the outcome changed (or had already changed) ledger state as asked. It is
// the only definition of success for a guarded transition.
func (o Outcome) OK() bool {
	switch o {
	case OutcomeAllocated, OutcomeAccepted, OutcomeRevalidated, OutcomeTombstonePending,
		OutcomeTransitioned, OutcomeAlreadyDone:
		return true
	}
	return false
}

// ReadReason is why a read was dispatched (R14); it is stored with each read dispatch.
type ReadReason string

// Read reasons.
const (
	ReasonNotification  ReadReason = "notification"
	ReasonBackstop      ReadReason = "backstop"
	ReasonPoll          ReadReason = "poll"
	ReasonSessionChange ReadReason = "session_change"
	ReasonInitial       ReadReason = "initial"
	ReasonRevalidate    ReadReason = "revalidate"
	ReasonReconcile     ReadReason = "reconcile"
)

// ReadReasons lists every read reason.
var ReadReasons = []ReadReason{ReasonNotification, ReasonBackstop, ReasonPoll,
	ReasonSessionChange, ReasonInitial, ReasonRevalidate, ReasonReconcile}

// Valid reports whether r is one of the known reasons.
func (r ReadReason) Valid() bool {
	for _, v := range ReadReasons {
		if r == v {
			return true
		}
	}
	return false
}

// TombstoneRefusal says why the ledger did not confirm a deletion (R21).
type TombstoneRefusal string

// Tombstone refusals, in the order the ledger labels them.
const (
	// TombstoneOldGeneration: the request carries another subscription generation.
	TombstoneOldGeneration TombstoneRefusal = "OLD_GENERATION"
	// TombstoneNotPending: the subscription is not TOMBSTONE_PENDING (any more).
	TombstoneNotPending TombstoneRefusal = "NOT_TOMBSTONE_PENDING"
	// TombstoneNoCatalog: no such catalog.
	TombstoneNoCatalog TombstoneRefusal = "NO_CATALOG"
	// TombstoneOtherSource: the catalog is of another source.
	TombstoneOtherSource TombstoneRefusal = "OTHER_SOURCE"
	// TombstoneOtherSession: the catalog was listed on another session generation than the
	// one the subscription (and its not-found read) lives on.
	TombstoneOtherSession TombstoneRefusal = "OTHER_SESSION"
	// TombstoneNotReconciled: the catalog is RECONCILIATION_REQUIRED.
	TombstoneNotReconciled TombstoneRefusal = "CATALOG_NOT_RECONCILED"
	// TombstoneInvalidated: a list_changed invalidated the catalog.
	TombstoneInvalidated TombstoneRefusal = "CATALOG_INVALIDATED"
	// TombstoneScanTooEarly: the catalog's rounds started before the not-found read was
	// dispatched, so they cannot speak for the deletion.
	TombstoneScanTooEarly TombstoneRefusal = "SCAN_BEFORE_READ"
	// TombstoneResourcePresent: the catalog lists the URI: the resource exists again.
	TombstoneResourcePresent TombstoneRefusal = "RESOURCE_PRESENT"
	// TombstoneTemplateURI: the catalog does not list the URI as a resource, but one of its
	// resource templates can produce it. Such a URI never appears in a list, so the catalog
	// proves nothing about it; the deletion can only be confirmed by repeated not-found
	// reads (R21).
	TombstoneTemplateURI TombstoneRefusal = "TEMPLATE_URI"
	// TombstoneTooFewReads: a confirmation by repeated not-found reads was asked before the
	// required number of not-found reads was recorded for the pending read (R21).
	TombstoneTooFewReads TombstoneRefusal = "TOO_FEW_NOT_FOUND_READS"
)

// ReceiptKind is the kind of an audit receipt in the ledger. Every outcome of a read
// (ACCEPTED, STALE, ...) is also a receipt kind: ReceiptKind(outcome).
type ReceiptKind string

// Receipt kinds other than read outcomes.
const (
	ReceiptSessionOpened      ReceiptKind = "SESSION_OPENED"
	ReceiptSessionEnded       ReceiptKind = "SESSION_ENDED"
	ReceiptSessionChanged     ReceiptKind = "SESSION_CHANGED"
	ReceiptSubscriptionOpened ReceiptKind = "SUBSCRIPTION_OPENED"
	ReceiptTransitioned       ReceiptKind = "TRANSITIONED"
	// ReceiptSubscribing: DISCOVERED or RECONCILIATION_REQUIRED moved to SUBSCRIBING.
	ReceiptSubscribing ReceiptKind = "SUBSCRIBING"
	// ReceiptActivated: SUBSCRIBING moved to ACTIVE.
	ReceiptActivated ReceiptKind = "ACTIVATED"
	// ReceiptReconciliationRequired: the subscription moved to RECONCILIATION_REQUIRED.
	ReceiptReconciliationRequired ReceiptKind = "RECONCILIATION_REQUIRED"
	// ReceiptTombstoneCleared: TOMBSTONE_PENDING moved back to ACTIVE (the resource exists
	// again, R21).
	ReceiptTombstoneCleared ReceiptKind = "TOMBSTONE_CLEARED"
	// ReceiptTombstoneConfirmed: a deletion was confirmed by list reconciliation (R21).
	ReceiptTombstoneConfirmed ReceiptKind = "TOMBSTONE_CONFIRMED"
	// ReceiptTombstoneProbeNotFound: a read of a TOMBSTONE_PENDING subscription's URI
	// answered not-found again; enough of them confirm the deletion of a URI only a resource
	// template produces (R21).
	ReceiptTombstoneProbeNotFound ReceiptKind = "TOMBSTONE_PROBE_NOT_FOUND"
	// ReceiptUnsubscribeUnknown: UNSUBSCRIBING moved to UNSUBSCRIBE_UNKNOWN (R20).
	ReceiptUnsubscribeUnknown  ReceiptKind = "UNSUBSCRIBE_UNKNOWN"
	ReceiptCloseFence          ReceiptKind = "CLOSE_FENCE"
	ReceiptClosed              ReceiptKind = "CLOSED"
	ReceiptClosedWithSession   ReceiptKind = "CLOSED_WITH_SESSION"
	ReceiptTombstoneRefused    ReceiptKind = "TOMBSTONE_REFUSED"
	ReceiptNotificationOld     ReceiptKind = "NOTIFICATION_OLD_SESSION"
	ReceiptNotificationUnknown ReceiptKind = "NOTIFICATION_UNMATCHED"
	ReceiptNotificationClosed  ReceiptKind = "NOTIFICATION_AFTER_CLOSE"
	ReceiptNotificationOrder   ReceiptKind = "NOTIFICATION_OUT_OF_ORDER"
	// ReceiptNotificationMalformedURI: a notification whose URI cannot be normalized; it
	// matches nothing and causes no action, but is not dropped silently.
	ReceiptNotificationMalformedURI ReceiptKind = "NOTIFICATION_MALFORMED_URI"
	// ReceiptNotificationOverflow: the session host's notification queue of a session was
	// full; the notifications it could not queue are not lost: every live subscription of the
	// source is signalled to re-read (issue 14 item 6).
	ReceiptNotificationOverflow ReceiptKind = "NOTIFICATION_OVERFLOW"
)

// ReadID is the identity of one read (R14, R16): the acceptance point accepts a response only
// when every field matches the dispatch it allocated.
type ReadID struct {
	SubscriptionID    int64
	Generation        int64 // subscription generation
	SessionGeneration int64
	URI               string // normalized
	Ordinal           int64  // readOrdinal
	RequestID         string
}

// String renders the identity for logs and receipts.
func (r ReadID) String() string {
	return fmt.Sprintf("sub %d gen %d session %d ordinal %d request %s uri %q",
		r.SubscriptionID, r.Generation, r.SessionGeneration, r.Ordinal, r.RequestID, r.URI)
}

// CatalogEntry is one resource or template a discovery round listed (R4): what a round
// returns (discovery.Entry) and what the ledger stores under the round (ledger.ScanEntry),
// one type so that a round's 100,000 entries reach the ledger without a copy.
type CatalogEntry struct {
	Kind      string // "resource" or "template"
	URI       string // normalized URI (the server's string if it cannot be normalized), or the URI template
	ServerURI string // as listed
	Name      string
	MIMEType  string
}
