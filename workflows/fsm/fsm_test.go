package fsm_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// Every legal transition of the SPEC state machine, as (from, event) -> to with a clear
// dirty bit.
var legal = map[[2]string]fsm.State{
	{"DISCOVERED", "subscribe"}:                     fsm.Subscribing,
	{"RECONCILIATION_REQUIRED", "subscribe"}:        fsm.Subscribing,
	{"SUBSCRIBING", "subscribed"}:                   fsm.Active,
	{"SUBSCRIBING", "subscribe_failed"}:             fsm.ReconciliationRequired,
	{"ACTIVE", "update"}:                            fsm.UpdateSeen,
	{"UPDATE_SEEN", "update"}:                       fsm.UpdateSeen,
	{"READ_PENDING", "update"}:                      fsm.ReadPending,
	{"VERSION_ACCEPTED", "update"}:                  fsm.VersionAccepted,
	{"UPDATE_SEEN", "read_dispatched"}:              fsm.ReadPending,
	{"READ_PENDING", "accepted"}:                    fsm.VersionAccepted,
	{"READ_PENDING", "read_settled"}:                fsm.Active,
	{"VERSION_ACCEPTED", "settle"}:                  fsm.Active,
	{"READ_PENDING", "not_found"}:                   fsm.TombstonePending,
	{"TOMBSTONE_PENDING", "resource_present"}:       fsm.UpdateSeen,
	{"TOMBSTONE_PENDING", "tombstone_confirmed"}:    fsm.Unsubscribing,
	{"UNSUBSCRIBING", "unsubscribe_acked"}:          fsm.Closed,
	{"UNSUBSCRIBE_UNKNOWN", "unsubscribe_acked"}:    fsm.Closed,
	{"UNSUBSCRIBING", "unsubscribe_lost"}:           fsm.UnsubscribeUnknown,
	{"UNSUBSCRIBING", "session_ended"}:              fsm.Closed,
	{"UNSUBSCRIBE_UNKNOWN", "session_ended"}:        fsm.Closed,
	{"DISCOVERED", "unsubscribe"}:                   fsm.Unsubscribing,
	{"SUBSCRIBING", "unsubscribe"}:                  fsm.Unsubscribing,
	{"ACTIVE", "unsubscribe"}:                       fsm.Unsubscribing,
	{"UPDATE_SEEN", "unsubscribe"}:                  fsm.Unsubscribing,
	{"READ_PENDING", "unsubscribe"}:                 fsm.Unsubscribing,
	{"VERSION_ACCEPTED", "unsubscribe"}:             fsm.Unsubscribing,
	{"TOMBSTONE_PENDING", "unsubscribe"}:            fsm.Unsubscribing,
	{"RECONCILIATION_REQUIRED", "unsubscribe"}:      fsm.Unsubscribing,
	{"SUBSCRIBING", "session_ended"}:                fsm.ReconciliationRequired,
	{"ACTIVE", "session_ended"}:                     fsm.ReconciliationRequired,
	{"UPDATE_SEEN", "session_ended"}:                fsm.ReconciliationRequired,
	{"READ_PENDING", "session_ended"}:               fsm.ReconciliationRequired,
	{"VERSION_ACCEPTED", "session_ended"}:           fsm.ReconciliationRequired,
	{"TOMBSTONE_PENDING", "session_ended"}:          fsm.ReconciliationRequired,
	{"RECONCILIATION_REQUIRED", "session_ended"}:    fsm.ReconciliationRequired,
	{"DISCOVERED", "identity_unknown"}:              fsm.ReconciliationRequired,
	{"SUBSCRIBING", "identity_unknown"}:             fsm.ReconciliationRequired,
	{"ACTIVE", "identity_unknown"}:                  fsm.ReconciliationRequired,
	{"UPDATE_SEEN", "identity_unknown"}:             fsm.ReconciliationRequired,
	{"READ_PENDING", "identity_unknown"}:            fsm.ReconciliationRequired,
	{"VERSION_ACCEPTED", "identity_unknown"}:        fsm.ReconciliationRequired,
	{"TOMBSTONE_PENDING", "identity_unknown"}:       fsm.ReconciliationRequired,
	{"RECONCILIATION_REQUIRED", "identity_unknown"}: fsm.ReconciliationRequired,
}

// Every (state, event) pair: the legal ones land where the table says, every other one is
// refused with ErrIllegal and leaves the machine unchanged.
func TestEveryTransition(t *testing.T) {
	for _, s := range fsm.States {
		for _, e := range fsm.Events {
			m := &fsm.Machine{State: s}
			can := m.Can(e)
			err := m.Apply(e)
			want, ok := legal[[2]string{string(s), string(e)}]
			switch {
			case ok && err != nil:
				t.Errorf("%s --%s--> refused: %v, want %s", s, e, err, want)
			case ok && m.State != want:
				t.Errorf("%s --%s--> %s, want %s", s, e, m.State, want)
			case !ok && !errors.Is(err, fsm.ErrIllegal):
				t.Errorf("%s --%s--> %v (state %s), want ErrIllegal", s, e, err, m.State)
			case !ok && m.State != s:
				t.Errorf("%s --%s--> refused but moved to %s", s, e, m.State)
			}
			if can != (err == nil) {
				t.Errorf("Can(%s) in %s = %v, but Apply returned %v", e, s, can, err)
			}
		}
	}
	if got := len(fsm.Transitions()); got != len(legal) {
		t.Errorf("Transitions() lists %d, the SPEC table has %d", got, len(legal))
	}
}

// Closed states are terminal for everything but acknowledgements and session ends (R19, R20).
func TestClosingNeverReturnsToActive(t *testing.T) {
	for _, s := range []fsm.State{fsm.Unsubscribing, fsm.UnsubscribeUnknown, fsm.Closed} {
		for _, e := range fsm.Events {
			m := &fsm.Machine{State: s}
			if m.Apply(e) == nil && !m.State.Closing() {
				t.Errorf("%s --%s--> %s leaves the closing states", s, e, m.State)
			}
		}
	}
}

// R13: any number of pulses during a read cause exactly one follow-up read.
func TestDirtyBitCoalescesPulses(t *testing.T) {
	tests := []struct {
		name   string
		pulses int
		ending fsm.Event
		want   []fsm.State
	}{
		{"no pulse, stale read", 0, fsm.ReadSettled, []fsm.State{fsm.Active}},
		{"one pulse, accepted", 1, fsm.Accepted, []fsm.State{fsm.VersionAccepted, fsm.UpdateSeen, fsm.ReadPending, fsm.Active}},
		{"hundred pulses, accepted", 100, fsm.Accepted, []fsm.State{fsm.VersionAccepted, fsm.UpdateSeen, fsm.ReadPending, fsm.Active}},
		{"hundred pulses, stale", 100, fsm.ReadSettled, []fsm.State{fsm.UpdateSeen, fsm.ReadPending, fsm.Active}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &fsm.Machine{State: fsm.Active}
			steps := []fsm.Event{fsm.Update, fsm.ReadDispatched}
			for _, ev := range steps {
				if err := m.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < tt.pulses; i++ {
				if err := m.Apply(fsm.Update); err != nil {
					t.Fatal(err)
				}
			}
			var got []fsm.State
			reads := 1
			apply := func(ev fsm.Event) {
				if err := m.Apply(ev); err != nil {
					t.Fatal(err)
				}
				got = append(got, m.State)
			}
			apply(tt.ending)
			if tt.ending == fsm.Accepted {
				apply(fsm.Settle)
			}
			if m.State == fsm.UpdateSeen {
				reads++
				apply(fsm.ReadDispatched)
				apply(fsm.ReadSettled)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
			wantReads := 1
			if tt.pulses > 0 {
				wantReads = 2
			}
			if reads != wantReads {
				t.Errorf("reads = %d, want %d", reads, wantReads)
			}
		})
	}
}
