package mcphost_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// updater is a recorder that also takes workflow updates, as a Temporal client does. Each
// call is recorded as a signal named "update <name> <update ID>"; outcome decides each call's
// result (nil: accepted).
type updater struct {
	*recorder
	mu       sync.Mutex
	calls    int
	inFlight int
	maxIn    int
	// outcome returns, for the n-th call (from 1), the error of UpdateWorkflow and of the
	// handle's Get; release, when set, is waited for before the call returns.
	outcome func(n int) (callErr, getErr error)
	release chan struct{}
}

func newUpdater(outcome func(n int) (error, error)) *updater {
	return &updater{recorder: newRecorder(), outcome: outcome}
}

func (u *updater) UpdateWorkflow(ctx context.Context, o client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	u.mu.Lock()
	u.calls++
	n := u.calls
	u.inFlight++
	u.maxIn = max(u.maxIn, u.inFlight)
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.inFlight--
		u.mu.Unlock()
	}()
	if u.release != nil {
		select {
		case <-u.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	callErr, getErr := error(nil), error(nil)
	if u.outcome != nil {
		callErr, getErr = u.outcome(n)
	}
	r := u.recorder
	r.mu.Lock()
	r.sigs = append(r.sigs, signal{WorkflowID: o.WorkflowID, Name: "update " + o.UpdateName + " " + o.UpdateID, Arg: o.Args[0]})
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	if callErr != nil {
		return nil, callErr
	}
	return handle{o: o, err: getErr}, nil
}

type handle struct {
	o   client.UpdateWorkflowOptions
	err error
}

func (h handle) WorkflowID() string             { return h.o.WorkflowID }
func (h handle) RunID() string                  { return "" }
func (h handle) UpdateID() string               { return h.o.UpdateID }
func (h handle) Get(context.Context, any) error { return h.err }

// kinds lists each recorded call as "update <id>" or "signal <seq>", in order.
func kinds(sigs []signal) []string {
	var out []string
	for _, s := range sigs {
		u, ok := s.Arg.(contract.ResourceUpdated)
		if !ok {
			continue
		}
		if s.Name == contract.SignalResourceUpdated {
			out = append(out, "signal "+strconv.FormatInt(u.Seq, 10))
		} else {
			out = append(out, s.Name)
		}
	}
	return out
}

// Notifications are delivered as workflow updates (issue 16): one update per notification,
// named after its session generation and sequence number, retried under that ID after a
// transient failure; a rejection, a run at the server's limit of updates or a server that
// refuses updates gets the signal instead; a workflow that is gone gets nothing more. Delivery by signal sends signals only.
func TestNotificationDeliveredByUpdate(t *testing.T) {
	unavailable := serviceerror.NewUnavailable("frontend restarting")
	tests := []struct {
		name     string
		delivery mcphost.Delivery
		outcome  func(n int) (error, error)
		// want lists the calls, with %[1]d the generation and %[2]d the sequence number.
		want []string
	}{
		{name: "accepted", want: []string{"update resource-updated notification-%[1]d-%[2]d"}},
		{
			name:    "retried under its update ID",
			outcome: func(n int) (error, error) { return map[bool]error{true: unavailable}[n < 3], nil },
			want: []string{"update resource-updated notification-%[1]d-%[2]d", "update resource-updated notification-%[1]d-%[2]d",
				"update resource-updated notification-%[1]d-%[2]d"},
		},
		{
			name: "rejected by a worker without the handler: signalled instead",
			outcome: func(int) (error, error) {
				return nil, temporal.NewApplicationError("unknown update resource-updated", "")
			},
			want: []string{"update resource-updated notification-%[1]d-%[2]d", "signal %[2]d"},
		},
		{
			name: "updates disabled on the server: signalled instead",
			outcome: func(int) (error, error) {
				return serviceerror.NewPermissionDenied("UpdateWorkflowExecution operation is disabled", ""), nil
			},
			want: []string{"update resource-updated notification-%[1]d-%[2]d", "signal %[2]d"},
		},
		{
			name: "run at the server's limit of updates: signalled instead",
			outcome: func(int) (error, error) {
				return serviceerror.NewFailedPrecondition("The limit on the total number of distinct updates in this workflow has been reached (2000)"), nil
			},
			want: []string{"update resource-updated notification-%[1]d-%[2]d", "signal %[2]d"},
		},
		{
			name:    "workflow gone: nothing more",
			outcome: func(int) (error, error) { return serviceerror.NewNotFound("workflow execution already completed"), nil },
			want:    []string{"update resource-updated notification-%[1]d-%[2]d"},
		},
		{name: "by signal", delivery: mcphost.DeliverSignal, want: []string{"signal %[2]d"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			const u = "demo://notes/delivered"
			up := newUpdater(tt.outcome)
			s := f.subscribeWith(u, mcphost.Options{Delivery: tt.delivery}, up)
			srv, c, sub := s.srv, s.c, s.sub
			srv.Set(u, "1", "text/plain")
			var seq int64
			waitFor(t, 10*time.Second, "the notification recorded", func() (bool, string) {
				seq = f.sub(sub.ID).LastNotificationSeq
				return seq > 0, "none yet"
			})
			var want []string
			for _, w := range tt.want {
				want = append(want, fmt.Sprintf(w, c.Generation(), seq))
			}
			up.wait(t, "the calls", func(s []signal) bool { return len(kinds(s)) >= len(want) })
			s.stop() // every delivery has ended: nothing more comes
			got := kinds(up.all())
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			for _, s := range up.all() {
				if a, ok := s.Arg.(contract.ResourceUpdated); ok && (s.WorkflowID != sub.WorkflowID || a.ServerURI != u || a.ReceivedAt.IsZero()) {
					t.Errorf("call %s to %s carries %+v", s.Name, s.WorkflowID, a)
				}
			}
		})
	}
}

// An update still pending (not answered by a read) covers the next notification of its URI,
// as a signal does (R13); one that finally failed does not: the next notification is
// delivered again.
func TestFailedUpdateIsNotLeftPending(t *testing.T) {
	for _, tt := range []struct {
		name    string
		outcome func(n int) (error, error)
		want    int
	}{
		{"accepted: the second notification is left to the first's read", nil, 1},
		{"workflow gone: the second notification is delivered", func(int) (error, error) {
			return serviceerror.NewNotFound("workflow execution already completed"), nil
		}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			const u = "demo://notes/pending-update"
			up := newUpdater(tt.outcome)
			s := f.subscribeWith(u, mcphost.Options{}, up)
			srv, sub := s.srv, s.sub
			srv.Set(u, "1", "text/plain")
			up.wait(t, "the first update", func(s []signal) bool { return len(kinds(s)) == 1 })
			target := ledger.NotificationTarget{SubscriptionID: sub.ID, Generation: sub.Generation, WorkflowID: sub.WorkflowID}
			waitFor(t, 10*time.Second, "the first update's outcome handled", func() (bool, string) {
				pending := s.c.SignalPending(u, target)
				return pending == (tt.want == 1), fmt.Sprintf("pending %v", pending)
			})
			srv.Set(u, "2", "text/plain")
			waitFor(t, 10*time.Second, "the second notification recorded", func() (bool, string) {
				n := f.sub(sub.ID).LastNotificationSeq
				return n >= 2, fmt.Sprintf("last notification %d", n)
			})
			s.stop() // every delivery has ended
			if got := len(kinds(up.all())); got != tt.want {
				t.Errorf("%d updates, want %d: %v", got, tt.want, kinds(up.all()))
			}
		})
	}
}

// A session keeps at most its bound of notification updates in flight; routing waits for a
// free slot, and every notification is delivered once the slots free up.
func TestUpdatesInFlightBounded(t *testing.T) {
	defer mcphost.SetUpdatesInFlight(2)()
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	uris := []string{"demo://notes/a", "demo://notes/b", "demo://notes/c", "demo://notes/d", "demo://notes/e"}
	for _, u := range uris {
		srv.Set(u, "0", "text/plain")
	}
	src := f.addSource(ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	up := newUpdater(nil)
	up.release = make(chan struct{})
	h := f.startHost("host-a", mcphost.Options{}, up)
	c := f.waitSession(h, src.ID, 0)
	for _, u := range uris {
		sub := f.activeSub(src.ID, u, c.Generation())
		if err := c.Subscribe(f.ctx, u, sub.ID); err != nil {
			t.Fatal(err)
		}
		srv.Set(u, "1", "text/plain")
	}
	waitFor(t, 10*time.Second, "two updates in flight and routing waiting for a slot", func() (bool, string) {
		up.mu.Lock()
		defer up.mu.Unlock()
		w := c.WaitingForSlot()
		return up.inFlight == 2 && w > 0, fmt.Sprintf("%d in flight, %d waiting for a slot", up.inFlight, w)
	})
	close(up.release)
	up.wait(t, "every notification delivered", func(s []signal) bool { return len(kinds(s)) == len(uris) })
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.maxIn != 2 {
		t.Errorf("at most %d updates in flight, want 2", up.maxIn)
	}
}

// A stopping host does not wait for a notification update that nothing accepts (the worker
// of its process stopped first) up to the update's one-minute deadline: after
// ShutdownDeliveryGrace it abandons it, and Run returns.
func TestStoppingHostAbandonsUnacceptedUpdates(t *testing.T) {
	f := newFixture(t)
	const u = "demo://notes/unaccepted"
	up := newUpdater(nil)
	up.release = make(chan struct{}) // never released: the update is never accepted
	s := f.subscribeWith(u, mcphost.Options{}, up)
	s.srv.Set(u, "1", "text/plain")
	waitFor(t, 10*time.Second, "the update in flight", func() (bool, string) {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.inFlight == 1, fmt.Sprintf("%d in flight", up.inFlight)
	})
	stopped := make(chan struct{})
	go func() { s.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(mcphost.ShutdownDeliveryGrace + 20*time.Second):
		t.Fatalf("the host still stopping %s after its grace: it waits for the update's deadline", mcphost.ShutdownDeliveryGrace+20*time.Second)
	}
	target := ledger.NotificationTarget{SubscriptionID: s.sub.ID, Generation: s.sub.Generation, WorkflowID: s.sub.WorkflowID}
	if s.c.SignalPending(u, target) {
		t.Error("the abandoned update is still noted as pending")
	}
}
