package activities_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// A resource whose read answer is over the transport's message bound (mcphost.MessageLimit of
// --max-bytes) is cut off before the go-sdk decodes it (issue 14 item 6, "checked while
// reading"), and the read still ends as a TOO_LARGE receipt: Found, TooLarge, the size being
// the bound it exceeded (its real size is never read), MaxBytes the source's bound; no blob,
// no version. The session survives: a read within the bound is accepted on the same
// generation afterwards. Real chaosmcp server over streamable HTTP, real host and ledger.
func TestTransportCutReadLeavesTooLargeReceipt(t *testing.T) {
	const (
		maxBytes = 64
		u        = "demo://huge/1"
		bigSize  = 8 << 20
	)
	limit := mcphost.MessageLimit(maxBytes)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	srv := chaosmcp.New(chaosmcp.Options{})
	t.Cleanup(func() { srv.Close() })
	big := strings.Repeat("h", bigSize)
	srv.Set(u, big, "text/plain")
	hs := hostSource(ctx, t, store, ledger.SourceSpec{Name: "huge", Transport: ledger.TransportHTTP, URL: serveChaos(t, srv),
		Connection: ledger.Connection{MaxBytes: maxBytes}}, true, "host-huge", zap.WarnLevel)
	src, h, gen := hs.src, hs.host, hs.gen
	sub := hs.activeSubscription(ctx, t, u, "wf-huge")
	led := &activities.Ledger{Store: store}
	sa := &activities.Session{Host: h, Store: store}

	type result struct {
		Found, TooLarge bool
		Size, MaxBytes  int64
		Digest          string
		Outcome         mcpsync.Outcome
	}
	readAndAccept := func(n int) result {
		t.Helper()
		reqID := "r" + strings.Repeat("x", n)
		alloc, err := led.AllocateReadOrdinal(ctx, contract.AllocateInput{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: gen, URI: u, RequestID: reqID, Reason: mcpsync.ReasonNotification})
		if err != nil || alloc.Outcome != mcpsync.OutcomeAllocated {
			t.Fatalf("allocate: %+v %v", alloc, err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		defer rcancel()
		read, err := sa.MCPRead(rctx, contract.ReadInput{SourceID: src.ID, SessionGeneration: gen, ServerURI: u, Ordinal: alloc.Ordinal, RequestID: reqID})
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		acc, err := led.AcceptResourceVersion(ctx, contract.AcceptInput{ReadID: mcpsync.ReadID{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: gen, URI: u, Ordinal: alloc.Ordinal, RequestID: reqID}, Read: read})
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		return result{Found: read.Found, TooLarge: read.TooLarge, Size: read.Size, MaxBytes: read.MaxBytes, Digest: read.Digest, Outcome: acc.Outcome}
	}

	got := readAndAccept(1)
	want := result{Found: true, TooLarge: true, Size: limit, MaxBytes: maxBytes, Outcome: mcpsync.OutcomeTooLarge}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("read of %d bytes over the message bound %d (-want +got):\n%s", bigSize, limit, diff)
	}
	var receipts, versions, blobs int
	if err := store.Pool().QueryRow(ctx, `SELECT
			(SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'TOO_LARGE'),
			(SELECT count(*) FROM resource_versions WHERE subscription_id = $1),
			(SELECT count(*) FROM content_blobs WHERE digest = $2)`, sub.ID, ledger.Digest([]byte(big))).Scan(&receipts, &versions, &blobs); err != nil {
		t.Fatal(err)
	}
	if receipts != 1 || versions != 0 || blobs != 0 {
		t.Errorf("after the cut read: %d TOO_LARGE receipts, %d versions, %d blobs; want 1, 0, 0", receipts, versions, blobs)
	}
	if s, err := store.SubscriptionByID(ctx, sub.ID); err != nil || !strings.HasPrefix(s.StateReason, "too large: ") {
		t.Errorf("state reason %q (%v), want it to say too large", s.StateReason, err)
	}

	// The session survived: the same generation serves the next read.
	srv.Set(u, "small again\n", "text/plain")
	if cur, ok := h.Current(src.ID); !ok || cur.Generation() != gen {
		t.Fatalf("session generation changed after the cut read")
	}
	got = readAndAccept(2)
	want = result{Found: true, Size: 12, Digest: ledger.Digest([]byte("small again\n")), Outcome: mcpsync.OutcomeAccepted}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("read after the cut on the same session (-want +got):\n%s", diff)
	}
}
