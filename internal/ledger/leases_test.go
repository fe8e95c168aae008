package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// leaseStore is a fresh ledger with n stdio sources named s00, s01, ...
func leaseStore(t *testing.T, n int) (*ledger.Store, []ledger.Source) {
	t.Helper()
	st := ledger.New(pgtest.NewPool(t))
	var srcs []ledger.Source
	for i := range n {
		src, _, err := st.AddSource(context.Background(), ledger.SourceSpec{
			Name: fmt.Sprintf("s%02d", i), Transport: ledger.TransportStdio, Command: []string{"server"}})
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, src)
	}
	return st, srcs
}

// holders counts the sources each host queue holds in the ledger.
func holders(t *testing.T, st *ledger.Store) map[string]int {
	t.Helper()
	rows, err := st.Pool().Query(context.Background(), `SELECT coalesce(host_queue, ''), count(*)
		FROM sources GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var q string
		var n int
		if err := rows.Scan(&q, &n); err != nil {
			t.Fatal(err)
		}
		out[q] = n
	}
	return out
}

// round runs one lease round for each host in order; each host releases what it is told to
// shed, as a host does once the sessions are closed.
func round(t *testing.T, st *ledger.Store, lease time.Duration, hosts ...string) map[string]ledger.LeaseRound {
	t.Helper()
	ctx := context.Background()
	out := map[string]ledger.LeaseRound{}
	for _, h := range hosts {
		r, err := st.ClaimLeases(ctx, h, lease)
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range r.Shed {
			if err := st.ReleaseSource(ctx, src.ID, h); err != nil {
				t.Fatal(err)
			}
		}
		out[h] = r
	}
	return out
}

// Issue 12 defect 6: ClaimSources handed every free source to whichever host polled first.
// Three hosts and 30 sources end with 10 each after a few rounds, moving only a few sources per
// round; a fourth host that joins gets its share; a host that dies (heartbeat and leases
// expired) has its sources taken by the others.
func TestLeasesSpreadFairly(t *testing.T) {
	st, _ := leaseStore(t, 30)
	ctx := context.Background()
	hosts := []string{"host-a", "host-b", "host-c"}
	first := round(t, st, time.Minute, hosts...)
	if got := len(first["host-a"].Held); got != 30 {
		t.Fatalf("a host alone holds %d sources, want all 30", got)
	}
	// host-b and host-c registered in the first round: host-a now sheds a few per round.
	r := round(t, st, time.Minute, "host-a")
	if got, want := len(r["host-a"].Shed), ledger.ShedPerRound(10); got != want {
		t.Errorf("host-a shed %d sources in one round, want %d (gradual)", got, want)
	}
	if r["host-a"].LiveHosts != 3 || r["host-a"].Share != 10 {
		t.Errorf("live hosts %d, share %d; want 3 and 10", r["host-a"].LiveHosts, r["host-a"].Share)
	}
	rounds := 1
	want := map[string]int{"host-a": 10, "host-b": 10, "host-c": 10}
	for ; rounds < 20 && cmp.Diff(want, holders(t, st)) != ""; rounds++ {
		round(t, st, time.Minute, hosts...)
	}
	if diff := cmp.Diff(want, holders(t, st)); diff != "" {
		t.Fatalf("after %d rounds (-want +got):\n%s", rounds, diff)
	}
	t.Logf("30 sources spread 10/10/10 after %d rounds", rounds+1)

	// A fourth host joins: ceil(30/4) = 8, so it gets 6 to 8 and nobody holds more than 8.
	for range 10 {
		round(t, st, time.Minute, "host-a", "host-b", "host-c", "host-d")
	}
	got := holders(t, st)
	for _, h := range []string{"host-a", "host-b", "host-c", "host-d"} {
		if got[h] < 6 || got[h] > 8 {
			t.Errorf("with 4 hosts, %s holds %d sources, want 6..8 (%v)", h, got[h], got)
		}
	}

	// host-d dies: its heartbeat and leases expire. The others take its sources.
	if _, err := st.Pool().Exec(ctx, `UPDATE hosts SET alive_until = now() - interval '1 second' WHERE queue = 'host-d';
		UPDATE sources SET lease_until = now() - interval '1 second' WHERE host_queue = 'host-d'`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		round(t, st, time.Minute, hosts...)
	}
	if diff := cmp.Diff(want, holders(t, st)); diff != "" {
		t.Errorf("after host-d died (-want +got):\n%s", diff)
	}
}

// A host that stops retires its heartbeat; the others' shares grow at their next round.
func TestRetiredHostLeavesItsShare(t *testing.T) {
	st, srcs := leaseStore(t, 4)
	ctx := context.Background()
	for range 4 {
		round(t, st, time.Minute, "host-a", "host-b")
	}
	if diff := cmp.Diff(map[string]int{"host-a": 2, "host-b": 2}, holders(t, st)); diff != "" {
		t.Fatalf("two hosts (-want +got):\n%s", diff)
	}
	for _, src := range srcs {
		if err := st.ReleaseSource(ctx, src.ID, "host-b"); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RetireHost(ctx, "host-b"); err != nil {
		t.Fatal(err)
	}
	r := round(t, st, time.Minute, "host-a")["host-a"]
	if len(r.Held) != 4 || r.LiveHosts != 1 {
		t.Errorf("after host-b retired host-a holds %d (live hosts %d), want 4 (1)", len(r.Held), r.LiveHosts)
	}
}

// No two hosts ever hold one source: hosts claim concurrently with a short lease, one of them
// stalls long enough for its heartbeat and leases to expire, and for every source the lease intervals the
// rounds returned ([Now, LeaseUntil) on the database's clock) of different hosts never overlap.
func TestLeaseNeverTwoHolders(t *testing.T) {
	st, _ := leaseStore(t, 12)
	const lease = 400 * time.Millisecond
	type hold struct {
		host       string
		from, till time.Time
	}
	// Spread first (3 each), releasing what is shed; then only expiry moves leases.
	hosts := []string{"host-0", "host-1", "host-2", "host-3"}
	for range 12 {
		round(t, st, time.Minute, hosts...)
	}
	if diff := cmp.Diff(map[string]int{"host-0": 3, "host-1": 3, "host-2": 3, "host-3": 3}, holders(t, st)); diff != "" {
		t.Fatalf("spread (-want +got):\n%s", diff)
	}
	var mu sync.Mutex
	perSource := map[int64][]hold{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, host := range hosts {
		wg.Go(func() {
			start := time.Now()
			for ctx.Err() == nil {
				if i == 0 && time.Since(start) > time.Second && time.Since(start) < 2*time.Second {
					time.Sleep(50 * time.Millisecond) // stalled: its leases expire
					continue
				}
				r, err := st.ClaimLeases(ctx, host, lease)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				mu.Lock()
				for _, src := range slices.Concat(r.Held, r.Shed) {
					perSource[src.ID] = append(perSource[src.ID], hold{host, r.Now, r.LeaseUntil})
				}
				mu.Unlock()
				// Shed sources are kept (never released) here: only expiry moves a lease.
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	moves := 0
	for id, hs := range perSource {
		slices.SortFunc(hs, func(a, b hold) int { return a.from.Compare(b.from) })
		holder, until := hs[0].host, hs[0].till
		for _, h := range hs[1:] {
			if h.host != holder {
				if h.from.Before(until) {
					t.Errorf("source %d: %s took the lease at %s while %s held it until %s",
						id, h.host, h.from.Format(time.StampMicro), holder, until.Format(time.StampMicro))
				}
				holder, until = h.host, h.till
				moves++
				continue
			}
			until = h.till
		}
	}
	if moves == 0 {
		t.Error("no lease ever changed hands: the stalled host's leases never expired")
	}
	t.Logf("%d lease moves across 12 sources", moves)
}

// OpenSession opens a generation only under an unexpired lease held by the caller, on a
// source that is not removed (issue 12 defect 6: the ledger is the fence).
func TestOpenSessionNeedsLease(t *testing.T) {
	st, srcs := leaseStore(t, 1)
	ctx := context.Background()
	src := srcs[0]
	caps := ledger.CapabilityReceipt{}
	open := func(queue string) error {
		_, _, err := st.OpenSession(ctx, src.ID, queue, caps)
		return err
	}
	if err := open("host-a"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("open without any lease: %v, want ErrLeaseLost", err)
	}
	round(t, st, time.Minute, "host-a")
	if err := open("host-b"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("open under another host's lease: %v, want ErrLeaseLost", err)
	}
	if err := open("host-a"); err != nil {
		t.Fatalf("open under the lease: %v", err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET lease_until = now() - interval '1 ms' WHERE id = $1`, src.ID); err != nil {
		t.Fatal(err)
	}
	if err := open("host-a"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("open under an expired lease: %v, want ErrLeaseLost", err)
	}
	round(t, st, time.Minute, "host-a")
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET removed_at = now() WHERE id = $1`, src.ID); err != nil {
		t.Fatal(err)
	}
	if err := open("host-a"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("open on a removed source: %v, want ErrLeaseLost", err)
	}
}

// A removed source is shed by its holder and never claimed again; a definition change shows
// in the next round, for the holder to restart the session.
func TestRemovedAndChangedSources(t *testing.T) {
	st, srcs := leaseStore(t, 2)
	ctx := context.Background()
	r := round(t, st, time.Minute, "host-a")["host-a"]
	if len(r.Held) != 2 || r.Held[0].DefinitionVersion != 0 || r.Held[0].RemovedAt != nil {
		t.Fatalf("first round: %+v", r)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET definition_version = definition_version + 1 WHERE id = $1`, srcs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET removed_at = now() WHERE id = $1`, srcs[1].ID); err != nil {
		t.Fatal(err)
	}
	r, err := st.ClaimLeases(ctx, "host-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Held) != 1 || r.Held[0].ID != srcs[0].ID || r.Held[0].DefinitionVersion != 1 {
		t.Errorf("held after the change: %+v, want only %s at definition version 1", r.Held, srcs[0].Name)
	}
	if len(r.Shed) != 1 || r.Shed[0].ID != srcs[1].ID || r.Shed[0].RemovedAt == nil {
		t.Errorf("shed after the removal: %+v, want %s", r.Shed, srcs[1].Name)
	}
	if r.Share != 1 {
		t.Errorf("share %d counts the removed source, want 1", r.Share)
	}
	if err := st.ReleaseSource(ctx, srcs[1].ID, "host-a"); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"host-a", "host-b"} {
		r := round(t, st, time.Minute, h)[h]
		for _, src := range slices.Concat(r.Held, r.Shed) {
			if src.ID == srcs[1].ID {
				t.Errorf("%s claimed the removed source", h)
			}
		}
	}
}

// A free source is claimed while a subscription is being created on it: EnsureSubscription
// holds the source row FOR KEY SHARE (so that a removal waits for it), and a lease round that
// took the row FOR UPDATE SKIP LOCKED skipped it — a host with a long claim interval then left
// the source without a session until its next round. The round takes rows FOR NO KEY UPDATE,
// which a key-share lock does not block.
func TestClaimWhileSubscriptionIsCreated(t *testing.T) {
	st, srcs := leaseStore(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sources WHERE id = $1 AND removed_at IS NULL FOR KEY SHARE`, srcs[0].ID); err != nil {
		t.Fatal(err)
	}
	r, err := st.ClaimLeases(ctx, "host-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Held) != 1 || r.Held[0].ID != srcs[0].ID {
		t.Errorf("round with the source key-share locked holds %v, want [%s]", r.Held, srcs[0].Name)
	}
}
