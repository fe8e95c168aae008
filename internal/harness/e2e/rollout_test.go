package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R30: shadow mode runs subscriptions, reads and every fence while nothing reaches consumers;
// live at 5 % publishes exactly the subscriptions in the first five buckets; a roll-back keeps
// every watermark and close receipt, so an old read is still refused afterwards.
func TestRolloutShadowPercentAndRollback(t *testing.T) {
	s := newStack(t)
	s.mustCLI("rollout", "shadow", "--reason", "first stage")
	const n = 40
	res := map[string]string{}
	for i := 0; i < n; i++ {
		res[fmt.Sprintf("demo://ro/%02d", i)] = "v1"
	}
	srv := s.startChaosHTTP("ro", res)
	for u := range res {
		s.mustCLI("subscribe", "ro", u, "--wait", "0")
	}
	for u := range res {
		s.waitDigest("ro", u, ledger.Digest([]byte("v1")))
	}
	// Shadow: the fences ran (versions accepted) but nothing is published.
	if _, errOut, code := s.cli("get", "ro", "demo://ro/00"); code != 5 || !strings.Contains(errOut, "not published") {
		t.Errorf("get in shadow mode: exit %d %q, want 5 'not published'", code, errOut)
	}
	delivered := func(name string) map[string]bool {
		got := map[string]bool{}
		if _, err := consumers.Run(s.ctx, s.st, consumers.Options{Consumer: name}, func(_ context.Context, batch []ledger.OutboxEvent) error {
			for _, e := range batch {
				if e.Kind == "version" {
					got[e.URI] = true
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := delivered("shadow-reader"); len(got) != 0 {
		t.Errorf("consumer received %d versions in shadow mode", len(got))
	}

	// Live at 5 %: exactly the published subscriptions are readable and delivered.
	s.mustCLI("rollout", "live", "--percent", "5")
	published := map[string]bool{}
	for u := range res {
		sub := s.sub("ro", u)
		ok, err := s.st.Published(s.ctx, sub.WorkflowID)
		if err != nil {
			t.Fatal(err)
		}
		published[u] = ok
		_, _, code := s.cli("get", "ro", u)
		if (code == 0) != ok {
			t.Errorf("get %s: exit %d, published %v", u, code, ok)
		}
	}
	count := 0
	for _, ok := range published {
		if ok {
			count++
		}
	}
	if count == 0 || count == n {
		t.Fatalf("%d of %d subscriptions published at 5 %%: the test needs both kinds", count, n)
	}
	for u := range res {
		srv.Set(u, "v2", "text/plain")
	}
	for u := range res {
		s.waitDigest("ro", u, ledger.Digest([]byte("v2")))
	}
	// One pass delivers the rows readable now: a committed row behind an older transaction
	// still open on the shared cluster is held back until it ends, so passes accumulate until
	// every published version arrived; an unpublished one must never arrive.
	got := map[string]bool{}
	eventually(t, time.Minute, "versions delivered exactly for the published subscriptions", func() (bool, string) {
		for u := range delivered("shadow-reader") {
			got[u] = true
		}
		var wrong []string
		for u := range res {
			if got[u] != published[u] {
				wrong = append(wrong, fmt.Sprintf("%s: delivered %v, published %v", u, got[u], published[u]))
			}
		}
		slices.Sort(wrong)
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})

	// Roll-back: watermarks and close receipts are kept, and an old read is still fenced.
	sub := s.sub("ro", "demo://ro/01")
	old, err := s.st.AllocateReadOrdinal(s.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: sub.SessionGeneration, URI: sub.URI, RequestID: "old-read", Reason: mcpsync.ReasonRevalidate})
	if err != nil || old.Outcome != mcpsync.OutcomeAllocated {
		t.Fatalf("allocate: %+v %v", old, err)
	}
	srv.Set("demo://ro/01", "v3", "text/plain")
	after := s.waitDigest("ro", "demo://ro/01", ledger.Digest([]byte("v3")))
	s.mustCLI("unsubscribe", "ro", "demo://ro/02")
	before, err := s.st.Rollout(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := s.mustCLI("rollout", "rollback", "--reason", "test")
	if !strings.Contains(out, fmt.Sprintf("%d watermarks and %d close receipts kept", before.Watermarks, before.CloseReceipts)) {
		t.Errorf("rollback output %q, want %d watermarks and %d close receipts kept", out, before.Watermarks, before.CloseReceipts)
	}
	acc, err := s.st.AcceptResourceVersion(s.ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: sub.SessionGeneration, URI: sub.URI, Ordinal: old.Ordinal, RequestID: "old-read",
		Version: ledger.VersionInfo{Digest: ledger.Digest([]byte("v2"))}})
	if err != nil || acc.Outcome != mcpsync.OutcomeStale {
		t.Errorf("old read after the roll-back: %+v %v, want STALE", acc, err)
	}
	if cur := s.sub("ro", "demo://ro/01"); cur.LastAcceptedOrdinal != after.LastAcceptedOrdinal {
		t.Errorf("watermark moved across the roll-back: %d → %d", after.LastAcceptedOrdinal, cur.LastAcceptedOrdinal)
	}
	if cur := s.sub("ro", "demo://ro/02"); cur.State != mcpsync.StateClosed || cur.CloseOrdinal == nil {
		t.Errorf("closed subscription after the roll-back: %s close ordinal %v", cur.State, cur.CloseOrdinal)
	}
	if _, errOut, code := s.cli("get", "ro", "demo://ro/01"); code != 5 {
		t.Errorf("get after the roll-back: exit %d %q, want 5", code, errOut)
	}
	s.checkInvariants()
}
