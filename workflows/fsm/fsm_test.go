package fsm_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

type fromEvent struct {
	from mcpsync.State
	ev   fsm.Event
}

// Every legal transition of the SPEC state machine, as (from, event) -> to with a clear
// dirty bit.
var legal = map[fromEvent]mcpsync.State{
	{mcpsync.StateDiscovered, fsm.Subscribe}:                   mcpsync.StateSubscribing,
	{mcpsync.StateReconciliationRequired, fsm.Subscribe}:       mcpsync.StateSubscribing,
	{mcpsync.StateSubscribing, fsm.Subscribed}:                 mcpsync.StateActive,
	{mcpsync.StateSubscribing, fsm.SubscribeFailed}:            mcpsync.StateReconciliationRequired,
	{mcpsync.StateActive, fsm.Update}:                          mcpsync.StateUpdateSeen,
	{mcpsync.StateUpdateSeen, fsm.Update}:                      mcpsync.StateUpdateSeen,
	{mcpsync.StateReadPending, fsm.Update}:                     mcpsync.StateReadPending,
	{mcpsync.StateVersionAccepted, fsm.Update}:                 mcpsync.StateVersionAccepted,
	{mcpsync.StateUpdateSeen, fsm.ReadDispatched}:              mcpsync.StateReadPending,
	{mcpsync.StateReadPending, fsm.Accepted}:                   mcpsync.StateVersionAccepted,
	{mcpsync.StateReadPending, fsm.ReadSettled}:                mcpsync.StateActive,
	{mcpsync.StateVersionAccepted, fsm.Settle}:                 mcpsync.StateActive,
	{mcpsync.StateReadPending, fsm.NotFound}:                   mcpsync.StateTombstonePending,
	{mcpsync.StateTombstonePending, fsm.ResourcePresent}:       mcpsync.StateUpdateSeen,
	{mcpsync.StateTombstonePending, fsm.TombstoneConfirmed}:    mcpsync.StateUnsubscribing,
	{mcpsync.StateUnsubscribing, fsm.UnsubscribeAcked}:         mcpsync.StateClosed,
	{mcpsync.StateUnsubscribeUnknown, fsm.UnsubscribeAcked}:    mcpsync.StateClosed,
	{mcpsync.StateUnsubscribing, fsm.UnsubscribeLost}:          mcpsync.StateUnsubscribeUnknown,
	{mcpsync.StateUnsubscribing, fsm.SessionEnded}:             mcpsync.StateClosed,
	{mcpsync.StateUnsubscribeUnknown, fsm.SessionEnded}:        mcpsync.StateClosed,
	{mcpsync.StateDiscovered, fsm.Unsubscribe}:                 mcpsync.StateUnsubscribing,
	{mcpsync.StateSubscribing, fsm.Unsubscribe}:                mcpsync.StateUnsubscribing,
	{mcpsync.StateActive, fsm.Unsubscribe}:                     mcpsync.StateUnsubscribing,
	{mcpsync.StateUpdateSeen, fsm.Unsubscribe}:                 mcpsync.StateUnsubscribing,
	{mcpsync.StateReadPending, fsm.Unsubscribe}:                mcpsync.StateUnsubscribing,
	{mcpsync.StateVersionAccepted, fsm.Unsubscribe}:            mcpsync.StateUnsubscribing,
	{mcpsync.StateTombstonePending, fsm.Unsubscribe}:           mcpsync.StateUnsubscribing,
	{mcpsync.StateReconciliationRequired, fsm.Unsubscribe}:     mcpsync.StateUnsubscribing,
	{mcpsync.StateSubscribing, fsm.SessionEnded}:               mcpsync.StateReconciliationRequired,
	{mcpsync.StateActive, fsm.SessionEnded}:                    mcpsync.StateReconciliationRequired,
	{mcpsync.StateUpdateSeen, fsm.SessionEnded}:                mcpsync.StateReconciliationRequired,
	{mcpsync.StateReadPending, fsm.SessionEnded}:               mcpsync.StateReconciliationRequired,
	{mcpsync.StateVersionAccepted, fsm.SessionEnded}:           mcpsync.StateReconciliationRequired,
	{mcpsync.StateTombstonePending, fsm.SessionEnded}:          mcpsync.StateReconciliationRequired,
	{mcpsync.StateReconciliationRequired, fsm.SessionEnded}:    mcpsync.StateReconciliationRequired,
	{mcpsync.StateDiscovered, fsm.IdentityUnknown}:             mcpsync.StateReconciliationRequired,
	{mcpsync.StateSubscribing, fsm.IdentityUnknown}:            mcpsync.StateReconciliationRequired,
	{mcpsync.StateActive, fsm.IdentityUnknown}:                 mcpsync.StateReconciliationRequired,
	{mcpsync.StateUpdateSeen, fsm.IdentityUnknown}:             mcpsync.StateReconciliationRequired,
	{mcpsync.StateReadPending, fsm.IdentityUnknown}:            mcpsync.StateReconciliationRequired,
	{mcpsync.StateVersionAccepted, fsm.IdentityUnknown}:        mcpsync.StateReconciliationRequired,
	{mcpsync.StateTombstonePending, fsm.IdentityUnknown}:       mcpsync.StateReconciliationRequired,
	{mcpsync.StateReconciliationRequired, fsm.IdentityUnknown}: mcpsync.StateReconciliationRequired,
}

// at returns a machine in s with a clear dirty bit; s is not READ_PENDING.
func at(t *testing.T, s mcpsync.State) *fsm.Machine {
	t.Helper()
	m, err := fsm.Resume(s, false)
	if err != nil {
		t.Fatal(err)
	}
	if m.State() != s {
		t.Fatalf("Resume(%s) is in %s", s, m.State())
	}
	return m
}

// reading returns a machine in READ_PENDING (Resume does not resume a read in flight).
func reading(t *testing.T, dirty bool) *fsm.Machine {
	t.Helper()
	m, err := fsm.Resume(mcpsync.StateUpdateSeen, dirty)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(fsm.ReadDispatched); err != nil {
		t.Fatal(err)
	}
	return m
}

// machineAt returns a machine in s, reaching READ_PENDING through a dispatch.
func machineAt(t *testing.T, s mcpsync.State) *fsm.Machine {
	t.Helper()
	if s == mcpsync.StateReadPending {
		return reading(t, false)
	}
	return at(t, s)
}

// Every (state, event) pair: the legal ones land where the table says, every other one is
// refused with ErrIllegal and leaves the machine unchanged.
func TestEveryTransition(t *testing.T) {
	for _, s := range mcpsync.States {
		for _, e := range fsm.Events {
			m := machineAt(t, s)
			can := m.Can(e)
			err := m.Apply(e)
			want, ok := legal[fromEvent{s, e}]
			switch {
			case ok && err != nil:
				t.Errorf("%s --%s--> refused: %v, want %s", s, e, err, want)
			case ok && m.State() != want:
				t.Errorf("%s --%s--> %s, want %s", s, e, m.State(), want)
			case !ok && !errors.Is(err, fsm.ErrIllegal):
				t.Errorf("%s --%s--> %v (state %s), want ErrIllegal", s, e, err, m.State())
			case !ok && m.State() != s:
				t.Errorf("%s --%s--> refused but moved to %s", s, e, m.State())
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
	for _, s := range []mcpsync.State{mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown, mcpsync.StateClosed} {
		for _, e := range fsm.Events {
			m := at(t, s)
			if m.Apply(e) == nil && !m.State().Closing() {
				t.Errorf("%s --%s--> %s leaves the closing states", s, e, m.State())
			}
		}
		for _, to := range mcpsync.States {
			m := at(t, s)
			if m.Adopt(to) == nil && !m.State().Closing() {
				t.Errorf("%s adopting %s leaves the closing states", s, to)
			}
		}
	}
}

// Adopting the ledger's state: every closing state is adopted from every state but CLOSED as
// long as the close fence does not move back; nothing else is ever adopted (R18, R19, R20).
func TestAdopt(t *testing.T) {
	closing := []mcpsync.State{mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown, mcpsync.StateClosed}
	open := []mcpsync.State{mcpsync.StateDiscovered, mcpsync.StateSubscribing, mcpsync.StateActive,
		mcpsync.StateUpdateSeen, mcpsync.StateReadPending, mcpsync.StateVersionAccepted,
		mcpsync.StateReconciliationRequired, mcpsync.StateTombstonePending}
	type adoption struct{ from, to mcpsync.State }
	want := map[adoption]bool{
		{mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribing}:           true,
		{mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown}:      true,
		{mcpsync.StateUnsubscribing, mcpsync.StateClosed}:                  true,
		{mcpsync.StateUnsubscribeUnknown, mcpsync.StateUnsubscribeUnknown}: true,
		{mcpsync.StateUnsubscribeUnknown, mcpsync.StateClosed}:             true,
	}
	for _, from := range open {
		for _, to := range closing {
			want[adoption{from, to}] = true
		}
	}
	if len(want) != 5+len(open)*len(closing) {
		t.Fatalf("adoption table has %d entries", len(want))
	}
	for _, from := range mcpsync.States {
		for _, to := range mcpsync.States {
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				m := machineAt(t, from)
				can := m.CanAdopt(to)
				err := m.Adopt(to)
				switch legal := want[adoption{from, to}]; {
				case legal && err != nil:
					t.Errorf("refused: %v", err)
				case legal && m.State() != to:
					t.Errorf("adopted into %s", m.State())
				case !legal && !errors.Is(err, fsm.ErrIllegal):
					t.Errorf("Adopt = %v (state %s), want ErrIllegal", err, m.State())
				case !legal && m.State() != from:
					t.Errorf("refused but moved to %s", m.State())
				}
				if can != (err == nil) {
					t.Errorf("CanAdopt = %v, but Adopt returned %v", can, err)
				}
			})
		}
	}
}

// An adoption clears the dirty bit: no follow-up read after the close fence (R18, R19).
func TestAdoptClearsDirty(t *testing.T) {
	m := reading(t, false)
	if err := m.Apply(fsm.Update); err != nil {
		t.Fatal(err)
	}
	if !m.Dirty() {
		t.Fatal("a pulse during a read did not set the dirty bit")
	}
	if err := m.Adopt(mcpsync.StateUnsubscribing); err != nil {
		t.Fatal(err)
	}
	if m.Dirty() {
		t.Error("the dirty bit survived the adoption of UNSUBSCRIBING")
	}
}

// Resume takes back what a run carried through continue-as-new, and refuses anything that is
// not a state.
func TestResume(t *testing.T) {
	tests := []struct {
		name      string
		state     mcpsync.State
		dirty     bool
		wantState mcpsync.State
		wantErr   error
	}{
		{"active", mcpsync.StateActive, false, mcpsync.StateActive, nil},
		{"update seen, dirty", mcpsync.StateUpdateSeen, true, mcpsync.StateUpdateSeen, nil},
		{"read in flight is issued again", mcpsync.StateReadPending, true, mcpsync.StateUpdateSeen, nil},
		{"closing", mcpsync.StateUnsubscribeUnknown, false, mcpsync.StateUnsubscribeUnknown, nil},
		{"empty", "", false, "", fsm.ErrInvalidState},
		{"unknown", mcpsync.State("NOT_A_STATE"), false, "", fsm.ErrInvalidState},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := fsm.Resume(tt.state, tt.dirty)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Resume error = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if m.State() != tt.wantState || m.Dirty() != tt.dirty {
				t.Errorf("Resume = (%s, %v), want (%s, %v)", m.State(), m.Dirty(), tt.wantState, tt.dirty)
			}
		})
	}
}

// R13: any number of pulses during a read cause exactly one follow-up read.
func TestDirtyBitCoalescesPulses(t *testing.T) {
	tests := []struct {
		name   string
		pulses int
		ending fsm.Event
		want   []mcpsync.State
	}{
		{"no pulse, stale read", 0, fsm.ReadSettled, []mcpsync.State{mcpsync.StateActive}},
		{"one pulse, accepted", 1, fsm.Accepted, []mcpsync.State{mcpsync.StateVersionAccepted, mcpsync.StateUpdateSeen, mcpsync.StateReadPending, mcpsync.StateActive}},
		{"hundred pulses, accepted", 100, fsm.Accepted, []mcpsync.State{mcpsync.StateVersionAccepted, mcpsync.StateUpdateSeen, mcpsync.StateReadPending, mcpsync.StateActive}},
		{"hundred pulses, stale", 100, fsm.ReadSettled, []mcpsync.State{mcpsync.StateUpdateSeen, mcpsync.StateReadPending, mcpsync.StateActive}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := at(t, mcpsync.StateActive)
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
			var got []mcpsync.State
			reads := 1
			apply := func(ev fsm.Event) {
				if err := m.Apply(ev); err != nil {
					t.Fatal(err)
				}
				got = append(got, m.State())
			}
			apply(tt.ending)
			if tt.ending == fsm.Accepted {
				apply(fsm.Settle)
			}
			if m.State() == mcpsync.StateUpdateSeen {
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
