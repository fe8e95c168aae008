// Package fsm is the subscription state machine of SPEC.md, pure and deterministic (no I/O,
// no clock): SubscriptionWorkflow drives it, and tests drive it directly. A Machine refuses
// every transition the table does not list, so an illegal move is an error, never a silent
// change of state. Its state can only change through Apply (an event of the table) or Adopt
// (the ledger's close fence, which the workflow learns from a ledger answer); outside this
// package it is read-only.
//
//	DISCOVERED | RECONCILIATION_REQUIRED -> SUBSCRIBING -> ACTIVE
//	ACTIVE -> UPDATE_SEEN -> READ_PENDING -> VERSION_ACCEPTED -> ACTIVE (UPDATE_SEEN when dirty)
//	READ_PENDING -> ACTIVE (stale, revalidated, failed; UPDATE_SEEN when dirty)
//	any state but the closing ones -> UNSUBSCRIBING -> CLOSED | UNSUBSCRIBE_UNKNOWN -> CLOSED
//	a failed subscribe, a lost session or a read/write of unknown identity -> RECONCILIATION_REQUIRED
//	READ_PENDING -(not found)-> TOMBSTONE_PENDING -> UPDATE_SEEN (present) | UNSUBSCRIBING (deleted)
//	adopted from the ledger: any state but CLOSED -> a closing state not behind the current one
package fsm

import (
	"errors"
	"fmt"

	"github.com/mcpsync/mcpsync"
)

// Short local names for the states of the table; they are mcpsync's states, not copies.
const (
	discovered             = mcpsync.StateDiscovered
	subscribing            = mcpsync.StateSubscribing
	active                 = mcpsync.StateActive
	updateSeen             = mcpsync.StateUpdateSeen
	readPending            = mcpsync.StateReadPending
	versionAccepted        = mcpsync.StateVersionAccepted
	unsubscribing          = mcpsync.StateUnsubscribing
	closed                 = mcpsync.StateClosed
	unsubscribeUnknown     = mcpsync.StateUnsubscribeUnknown
	reconciliationRequired = mcpsync.StateReconciliationRequired
	tombstonePending       = mcpsync.StateTombstonePending
)

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

// Events lists every event of the table. Adoption (Machine.Adopt) is not one of them: its
// target is the ledger's state, not a function of the current state.
var Events = []Event{Subscribe, Subscribed, SubscribeFailed, Update, ReadDispatched,
	Accepted, ReadSettled, Settle, NotFound, ResourcePresent, TombstoneConfirmed,
	Unsubscribe, UnsubscribeAcked, UnsubscribeLost, SessionEnded, IdentityUnknown}

// ErrIllegal is returned for a transition the table does not list, and for an adoption the
// close fence's order does not allow.
var ErrIllegal = errors.New("fsm: illegal transition")

// ErrInvalidState is returned by Resume for a string that is not a subscription state.
var ErrInvalidState = errors.New("fsm: invalid state")

type key struct {
	from mcpsync.State
	ev   Event
}

// table lists every legal transition. Targets of Update, ReadSettled and Settle depend on the
// dirty bit and are resolved in Apply.
var table = map[key]mcpsync.State{
	{discovered, Subscribe}:                   subscribing,
	{reconciliationRequired, Subscribe}:       subscribing,
	{subscribing, Subscribed}:                 active,
	{subscribing, SubscribeFailed}:            reconciliationRequired,
	{active, Update}:                          updateSeen,
	{updateSeen, Update}:                      updateSeen,
	{readPending, Update}:                     readPending,     // sets the dirty bit
	{versionAccepted, Update}:                 versionAccepted, // sets the dirty bit
	{updateSeen, ReadDispatched}:              readPending,
	{readPending, Accepted}:                   versionAccepted,
	{readPending, ReadSettled}:                active, // UPDATE_SEEN when dirty
	{versionAccepted, Settle}:                 active, // UPDATE_SEEN when dirty
	{readPending, NotFound}:                   tombstonePending,
	{tombstonePending, ResourcePresent}:       updateSeen,
	{tombstonePending, TombstoneConfirmed}:    unsubscribing,
	{unsubscribing, UnsubscribeAcked}:         closed,
	{unsubscribeUnknown, UnsubscribeAcked}:    closed,
	{unsubscribing, UnsubscribeLost}:          unsubscribeUnknown,
	{unsubscribing, SessionEnded}:             closed,
	{unsubscribeUnknown, SessionEnded}:        closed,
	{discovered, Unsubscribe}:                 unsubscribing,
	{subscribing, Unsubscribe}:                unsubscribing,
	{active, Unsubscribe}:                     unsubscribing,
	{updateSeen, Unsubscribe}:                 unsubscribing,
	{readPending, Unsubscribe}:                unsubscribing,
	{versionAccepted, Unsubscribe}:            unsubscribing,
	{tombstonePending, Unsubscribe}:           unsubscribing,
	{reconciliationRequired, Unsubscribe}:     unsubscribing,
	{subscribing, SessionEnded}:               reconciliationRequired,
	{active, SessionEnded}:                    reconciliationRequired,
	{updateSeen, SessionEnded}:                reconciliationRequired,
	{readPending, SessionEnded}:               reconciliationRequired,
	{versionAccepted, SessionEnded}:           reconciliationRequired,
	{tombstonePending, SessionEnded}:          reconciliationRequired,
	{reconciliationRequired, SessionEnded}:    reconciliationRequired,
	{discovered, IdentityUnknown}:             reconciliationRequired,
	{subscribing, IdentityUnknown}:            reconciliationRequired,
	{active, IdentityUnknown}:                 reconciliationRequired,
	{updateSeen, IdentityUnknown}:             reconciliationRequired,
	{readPending, IdentityUnknown}:            reconciliationRequired,
	{versionAccepted, IdentityUnknown}:        reconciliationRequired,
	{tombstonePending, IdentityUnknown}:       reconciliationRequired,
	{reconciliationRequired, IdentityUnknown}: reconciliationRequired,
}

// closeRank orders the closing states the way the ledger's close fence moves (R18, R20): it
// never goes back, so a machine adopts only a closing state at or after its own.
var closeRank = map[mcpsync.State]int{unsubscribing: 1, unsubscribeUnknown: 2, closed: 3}

// Transition is one legal (from, event, to) triple; To is the target with a clear dirty bit.
type Transition struct {
	From  mcpsync.State
	Event Event
	To    mcpsync.State
}

// Transitions returns every legal transition of the table, for tests and documentation.
func Transitions() []Transition {
	out := make([]Transition, 0, len(table))
	for _, s := range mcpsync.States {
		for _, e := range Events {
			if to, ok := table[key{s, e}]; ok {
				out = append(out, Transition{s, e, to})
			}
		}
	}
	return out
}

// Machine is a subscription's state plus the dirty bit of single-flight reads (R13): pulses
// that arrive while a read is in flight set the dirty bit, and the read's end then leads to
// exactly one follow-up read (UPDATE_SEEN) instead of one per pulse. Its fields change only
// through Apply and Adopt.
type Machine struct {
	state mcpsync.State
	dirty bool
}

// New returns a machine in DISCOVERED with a clear dirty bit.
func New() *Machine { return &Machine{state: discovered} }

// Resume returns the machine a run carried through continue-as-new as (state, dirty), or
// ErrInvalidState. A run never continues as new with a read in flight, so a READ_PENDING
// snapshot resumes in UPDATE_SEEN: the read is issued again.
func Resume(state mcpsync.State, dirty bool) (*Machine, error) {
	if !state.Valid() {
		return nil, fmt.Errorf("%w: %q", ErrInvalidState, state)
	}
	if state == readPending {
		state = updateSeen
	}
	return &Machine{state: state, dirty: dirty}, nil
}

// State returns the current state.
func (m *Machine) State() mcpsync.State { return m.state }

// Dirty reports whether a pulse arrived during the read in flight and calls for exactly one
// follow-up read (R13).
func (m *Machine) Dirty() bool { return m.dirty }

// Can reports whether ev is legal in the current state.
func (m *Machine) Can(ev Event) bool {
	_, ok := table[key{m.state, ev}]
	return ok
}

// Apply performs ev, or returns an error wrapping ErrIllegal and leaves the machine unchanged.
func (m *Machine) Apply(ev Event) error {
	to, ok := table[key{m.state, ev}]
	if !ok {
		return fmt.Errorf("%w: %s in %s", ErrIllegal, ev, m.state)
	}
	switch {
	case ev == Update && (m.state == readPending || m.state == versionAccepted):
		m.dirty = true
	case ev == ReadDispatched:
		m.dirty = false
	case (ev == ReadSettled || ev == Settle) && m.dirty:
		to, m.dirty = updateSeen, false
	case to.Closing() || to == reconciliationRequired || to == tombstonePending:
		m.dirty = false
	}
	m.state = to
	return nil
}

// CanAdopt reports whether Adopt(s) is legal in the current state.
func (m *Machine) CanAdopt(s mcpsync.State) bool {
	to, from := closeRank[s], closeRank[m.state]
	return to > 0 && to >= from && m.state != closed
}

// Adopt takes over the ledger's state s when the ledger has passed the close fence (R18) or
// moved further along the close (R20) on its own: the workflow learns of it from a ledger
// answer, not from an event of the table. Only a closing state at or after the current one is
// adopted; CLOSED adopts nothing, and a closing machine never adopts a live state (R19).
// Anything else returns an error wrapping ErrIllegal and leaves the machine unchanged.
// Adopting clears the dirty bit: nothing is read after the close fence.
func (m *Machine) Adopt(s mcpsync.State) error {
	if !m.CanAdopt(s) {
		return fmt.Errorf("%w: adopt ledger state %s in %s", ErrIllegal, s, m.state)
	}
	m.state, m.dirty = s, false
	return nil
}
