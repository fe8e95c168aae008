// Package fsm is the subscription state machine of SPEC.md, pure and deterministic (no I/O,
// no clock): SubscriptionWorkflow drives it, and tests drive it directly. A Machine refuses
// every transition the table does not list, so an illegal move is an error, never a silent
// change of state.
//
//	DISCOVERED -> SUBSCRIBING -> ACTIVE
//	ACTIVE -> UPDATE_SEEN -> READ_PENDING -> VERSION_ACCEPTED -> ACTIVE
//	ACTIVE -> UNSUBSCRIBING -> CLOSED | UNSUBSCRIBE_UNKNOWN
//	any read/write whose identity is unknown -> RECONCILIATION_REQUIRED
//	READ_PENDING -(not found)-> TOMBSTONE_PENDING -> ACTIVE (present) | UNSUBSCRIBING (deleted)
package fsm

import (
	"errors"
	"fmt"
)

// State is a subscription state.
type State string

// States of SPEC.md plus TOMBSTONE_PENDING (R21).
const (
	Discovered             State = "DISCOVERED"
	Subscribing            State = "SUBSCRIBING"
	Active                 State = "ACTIVE"
	UpdateSeen             State = "UPDATE_SEEN"
	ReadPending            State = "READ_PENDING"
	VersionAccepted        State = "VERSION_ACCEPTED"
	Unsubscribing          State = "UNSUBSCRIBING"
	Closed                 State = "CLOSED"
	UnsubscribeUnknown     State = "UNSUBSCRIBE_UNKNOWN"
	ReconciliationRequired State = "RECONCILIATION_REQUIRED"
	TombstonePending       State = "TOMBSTONE_PENDING"
)

// States lists every state.
var States = []State{Discovered, Subscribing, Active, UpdateSeen, ReadPending, VersionAccepted,
	Unsubscribing, Closed, UnsubscribeUnknown, ReconciliationRequired, TombstonePending}

// Closing reports whether the close fence has been passed: nothing may be read or accepted
// any more (R18, R19).
func (s State) Closing() bool { return s == Unsubscribing || s == UnsubscribeUnknown || s == Closed }

// Live reports whether reads may be issued in this state (the ledger's ACTIVE).
func (s State) Live() bool {
	return s == Active || s == UpdateSeen || s == ReadPending || s == VersionAccepted
}

// Event is something that happened to a subscription.
type Event string

// Events.
const (
	// Subscribe: start (again) subscribing on the current session.
	Subscribe Event = "subscribe"
	// Subscribed: the server acknowledged the subscribe (or polling needs none, R11).
	Subscribed Event = "subscribed"
	// SubscribeFailed: the subscribe failed; identity on the server is unknown.
	SubscribeFailed Event = "subscribe_failed"
	// Update: a notification, backstop or poll pulse asks for a read (R13: coalesced).
	Update Event = "update"
	// ReadDispatched: a readOrdinal was allocated and the read sent (R14).
	ReadDispatched Event = "read_dispatched"
	// Accepted: the acceptance point accepted the read (R16).
	Accepted Event = "accepted"
	// ReadSettled: the read ended without a new version (stale, revalidated, failed).
	ReadSettled Event = "read_settled"
	// Settle: a new version was published; back to ACTIVE.
	Settle Event = "settle"
	// NotFound: an ACTIVE read answered not-found through the ordinal fence (R21).
	NotFound Event = "not_found"
	// ResourcePresent: list reconciliation found the resource again.
	ResourcePresent Event = "resource_present"
	// TombstoneConfirmed: list reconciliation confirmed the deletion.
	TombstoneConfirmed Event = "tombstone_confirmed"
	// Unsubscribe: the close fence was passed (R18).
	Unsubscribe Event = "unsubscribe"
	// UnsubscribeAcked: the server acknowledged the unsubscribe, or none was needed.
	UnsubscribeAcked Event = "unsubscribe_acked"
	// UnsubscribeLost: the acknowledgement was lost or timed out (R20).
	UnsubscribeLost Event = "unsubscribe_lost"
	// SessionEnded: the session the subscription lived on is gone (R12, R20).
	SessionEnded Event = "session_ended"
	// IdentityUnknown: a read or write whose identity is unknown.
	IdentityUnknown Event = "identity_unknown"
)

// Events lists every event.
var Events = []Event{Subscribe, Subscribed, SubscribeFailed, Update, ReadDispatched,
	Accepted, ReadSettled, Settle, NotFound, ResourcePresent, TombstoneConfirmed,
	Unsubscribe, UnsubscribeAcked, UnsubscribeLost, SessionEnded, IdentityUnknown}

// ErrIllegal is returned for a transition the table does not list.
var ErrIllegal = errors.New("fsm: illegal transition")

type key struct {
	from State
	ev   Event
}

// table lists every legal transition. Targets of Update, ReadSettled and Settle depend on the
// dirty bit and are resolved in Apply.
var table = map[key]State{
	{Discovered, Subscribe}:                   Subscribing,
	{ReconciliationRequired, Subscribe}:       Subscribing,
	{Subscribing, Subscribed}:                 Active,
	{Subscribing, SubscribeFailed}:            ReconciliationRequired,
	{Active, Update}:                          UpdateSeen,
	{UpdateSeen, Update}:                      UpdateSeen,
	{ReadPending, Update}:                     ReadPending,     // sets the dirty bit
	{VersionAccepted, Update}:                 VersionAccepted, // sets the dirty bit
	{UpdateSeen, ReadDispatched}:              ReadPending,
	{ReadPending, Accepted}:                   VersionAccepted,
	{ReadPending, ReadSettled}:                Active, // UPDATE_SEEN when dirty
	{VersionAccepted, Settle}:                 Active, // UPDATE_SEEN when dirty
	{ReadPending, NotFound}:                   TombstonePending,
	{TombstonePending, ResourcePresent}:       UpdateSeen,
	{TombstonePending, TombstoneConfirmed}:    Unsubscribing,
	{Unsubscribing, UnsubscribeAcked}:         Closed,
	{UnsubscribeUnknown, UnsubscribeAcked}:    Closed,
	{Unsubscribing, UnsubscribeLost}:          UnsubscribeUnknown,
	{Unsubscribing, SessionEnded}:             Closed,
	{UnsubscribeUnknown, SessionEnded}:        Closed,
	{Discovered, Unsubscribe}:                 Unsubscribing,
	{Subscribing, Unsubscribe}:                Unsubscribing,
	{Active, Unsubscribe}:                     Unsubscribing,
	{UpdateSeen, Unsubscribe}:                 Unsubscribing,
	{ReadPending, Unsubscribe}:                Unsubscribing,
	{VersionAccepted, Unsubscribe}:            Unsubscribing,
	{TombstonePending, Unsubscribe}:           Unsubscribing,
	{ReconciliationRequired, Unsubscribe}:     Unsubscribing,
	{Subscribing, SessionEnded}:               ReconciliationRequired,
	{Active, SessionEnded}:                    ReconciliationRequired,
	{UpdateSeen, SessionEnded}:                ReconciliationRequired,
	{ReadPending, SessionEnded}:               ReconciliationRequired,
	{VersionAccepted, SessionEnded}:           ReconciliationRequired,
	{TombstonePending, SessionEnded}:          ReconciliationRequired,
	{ReconciliationRequired, SessionEnded}:    ReconciliationRequired,
	{Discovered, IdentityUnknown}:             ReconciliationRequired,
	{Subscribing, IdentityUnknown}:            ReconciliationRequired,
	{Active, IdentityUnknown}:                 ReconciliationRequired,
	{UpdateSeen, IdentityUnknown}:             ReconciliationRequired,
	{ReadPending, IdentityUnknown}:            ReconciliationRequired,
	{VersionAccepted, IdentityUnknown}:        ReconciliationRequired,
	{TombstonePending, IdentityUnknown}:       ReconciliationRequired,
	{ReconciliationRequired, IdentityUnknown}: ReconciliationRequired,
}

// Transition is one legal (from, event, to) triple; To is the target with a clear dirty bit.
type Transition struct {
	From  State
	Event Event
	To    State
}

// Transitions returns every legal transition, for tests and documentation.
func Transitions() []Transition {
	out := make([]Transition, 0, len(table))
	for _, s := range States {
		for _, e := range Events {
			if to, ok := table[key{s, e}]; ok {
				out = append(out, Transition{s, e, to})
			}
		}
	}
	return out
}

// Machine is a subscription's state plus the dirty bit of single-flight reads (R13): pulses
// that arrive while a read is in flight set Dirty, and the read's end then leads to exactly
// one follow-up read (UPDATE_SEEN) instead of one per pulse.
type Machine struct {
	State State
	Dirty bool
}

// New returns a machine in DISCOVERED.
func New() *Machine { return &Machine{State: Discovered} }

// Can reports whether ev is legal in the current state.
func (m *Machine) Can(ev Event) bool {
	_, ok := table[key{m.State, ev}]
	return ok
}

// Apply performs ev, or returns an error wrapping ErrIllegal and leaves the machine unchanged.
func (m *Machine) Apply(ev Event) error {
	to, ok := table[key{m.State, ev}]
	if !ok {
		return fmt.Errorf("%w: %s in %s", ErrIllegal, ev, m.State)
	}
	switch {
	case ev == Update && (m.State == ReadPending || m.State == VersionAccepted):
		m.Dirty = true
	case ev == ReadDispatched:
		m.Dirty = false
	case (ev == ReadSettled || ev == Settle) && m.Dirty:
		to, m.Dirty = UpdateSeen, false
	case to.Closing() || to == ReconciliationRequired || to == TombstonePending:
		m.Dirty = false
	}
	m.State = to
	return nil
}
