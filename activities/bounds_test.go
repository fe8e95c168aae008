package activities_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A resource over the source's --max-bytes, read from a real chaosmcp server through the real
// session host, activities and ledger, leaves a TOO_LARGE receipt and nothing else: no blob,
// no version, no outbox row; the subscription keeps its previous version, and its state
// reason (status's REASON column) says it is too large until a read within the bound is
// accepted. The bound counts text bytes and decoded blob bytes (issue 14 item 6).
func TestTooLargeReadLeavesOnlyAReceipt(t *testing.T) {
	const (
		maxBytes = 64
		u        = "demo://big/1"
	)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	srv := chaosmcp.New(chaosmcp.Options{})
	t.Cleanup(func() { srv.Close() })
	srv.Set(u, "small\n", "text/plain")
	hs := hostSource(ctx, t, store, ledger.SourceSpec{Name: "big", Transport: ledger.TransportHTTP, URL: serveChaos(t, srv),
		Connection: ledger.Connection{MaxBytes: maxBytes}}, true, "host-big", zap.WarnLevel)
	src, h, gen := hs.src, hs.host, hs.gen
	sub := hs.activeSubscription(ctx, t, u, "wf-big")
	led := &activities.Ledger{Store: store}
	sa := &activities.Session{Host: h, Store: store}

	type step struct {
		Outcome  mcpsync.Outcome
		TooLarge bool
		Size     int64
		Digest   string
		Versions int // content versions of the subscription after the step
		Outbox   int
		Blob     bool   // the body's digest is in the blob table
		Reason   string // the subscription's state reason, up to its first comma
		Latest   string // digest of the latest version
	}
	count := func(q string) int {
		var n int
		if err := store.Pool().QueryRow(ctx, q, sub.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := 0
	readOnce := func(body string, blob bool) (step, contract.AcceptInput) {
		t.Helper()
		if blob {
			srv.SetBlob(u, []byte(body), "application/octet-stream")
		} else {
			srv.Set(u, body, "text/plain")
		}
		n++
		reqID := "r" + strings.Repeat("x", n)
		alloc, err := led.AllocateReadOrdinal(ctx, contract.AllocateInput{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: gen, URI: u, RequestID: reqID, Reason: mcpsync.ReasonNotification})
		if err != nil || alloc.Outcome != mcpsync.OutcomeAllocated {
			t.Fatalf("allocate: %+v %v", alloc, err)
		}
		read, err := sa.MCPRead(ctx, contract.ReadInput{SourceID: src.ID, SessionGeneration: gen, ServerURI: u, Ordinal: alloc.Ordinal, RequestID: reqID})
		if err != nil || !read.Found {
			t.Fatalf("read: %+v %v", read, err)
		}
		in := contract.AcceptInput{ReadID: mcpsync.ReadID{SubscriptionID: sub.ID, Generation: sub.Generation, SessionGeneration: gen,
			URI: u, Ordinal: alloc.Ordinal, RequestID: reqID}, Read: read}
		acc, err := led.AcceptResourceVersion(ctx, in)
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		s, err := store.SubscriptionByID(ctx, sub.ID)
		if err != nil {
			t.Fatal(err)
		}
		reason, _, _ := strings.Cut(s.StateReason, ",")
		latest, err := store.LatestVersion(ctx, sub.ID)
		if err != nil {
			t.Fatal(err)
		}
		_, berr := store.Blob(ctx, ledger.Digest([]byte(body)))
		return step{Outcome: acc.Outcome, TooLarge: read.TooLarge, Size: read.Size, Digest: read.Digest,
			Versions: count(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1`),
			Outbox:   count(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1`),
			Blob:     berr == nil, Reason: reason, Latest: latest.Digest}, in
	}
	small, big := "small\n", strings.Repeat("b", maxBytes+1)
	blobWithin := strings.Repeat("\x01", maxBytes) // base64 is 88 bytes: only the decoded bytes count
	blobOver := strings.Repeat("\x02", maxBytes+10)
	d := func(s string) string { return ledger.Digest([]byte(s)) }

	got, _ := readOnce(small, false)
	want := step{Outcome: mcpsync.OutcomeAccepted, Size: 6, Digest: d(small), Versions: 1, Outbox: 1, Blob: true, Latest: d(small)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("small read (-want +got):\n%s", diff)
	}
	got, tooLarge := readOnce(big, false)
	want = step{Outcome: mcpsync.OutcomeTooLarge, TooLarge: true, Size: maxBytes + 1, Versions: 1, Outbox: 1,
		Reason: "too large: read 2 returned 65 bytes", Latest: d(small)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("text over the bound (-want +got):\n%s", diff)
	}
	// Replaying the same answer returns the first outcome and writes nothing.
	if acc, err := led.AcceptResourceVersion(ctx, tooLarge); err != nil || acc.Outcome != mcpsync.OutcomeTooLarge {
		t.Errorf("replayed too-large answer: %+v %v", acc, err)
	}
	var receipts int
	var detail string
	if err := store.Pool().QueryRow(ctx, `SELECT count(*), max(detail::text) FROM receipts WHERE subscription_id = $1 AND kind = 'TOO_LARGE'`, sub.ID).Scan(&receipts, &detail); err != nil {
		t.Fatal(err)
	}
	if receipts != 1 || !strings.Contains(detail, `"size": 65`) || !strings.Contains(detail, `"max_bytes": 64`) {
		t.Errorf("TOO_LARGE receipts: %d, detail %s", receipts, detail)
	}
	// An older answer cannot be accepted after it: the watermark rose.
	if s, _ := store.SubscriptionByID(ctx, sub.ID); s.LastAcceptedOrdinal != 2 || s.LastAcceptedDigest != d(small) {
		t.Errorf("after TOO_LARGE: watermark %d digest %s, want 2 and the small version's", s.LastAcceptedOrdinal, s.LastAcceptedDigest)
	}

	got, _ = readOnce(blobOver, true)
	want = step{Outcome: mcpsync.OutcomeTooLarge, TooLarge: true, Size: maxBytes + 10, Versions: 1, Outbox: 1,
		Reason: "too large: read 3 returned 74 bytes", Latest: d(small)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("blob over the bound (-want +got):\n%s", diff)
	}
	got, _ = readOnce(blobWithin, true)
	want = step{Outcome: mcpsync.OutcomeAccepted, Size: maxBytes, Digest: d(blobWithin), Versions: 2, Outbox: 2, Blob: true, Latest: d(blobWithin)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("blob within the bound, its base64 over it (-want +got):\n%s", diff)
	}
}

// No server string longer than a few KiB reaches a Temporal payload (issue 14 item 6): a
// read's serverInfo from a real server is bounded with a digest of the whole, and an error
// whose text carries a huge server message keeps its type and retryability but not its size.
func TestServerStringsBoundedInPayloads(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	hugeName := strings.Repeat("n", 1<<20)
	srv := chaosmcp.New(chaosmcp.Options{Name: hugeName, Version: strings.Repeat("v", 100<<10)})
	t.Cleanup(func() { srv.Close() })
	const u = "demo://strings/1"
	srv.Set(u, "x", strings.Repeat("m", 64<<10))
	hs, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	src, _, err := store.AddSource(ctx, ledger.SourceSpec{Name: "strings", Transport: ledger.TransportHTTP, URL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	h := runHost(ctx, t, store, "host-strings", zap.ErrorLevel)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	c, err := h.WaitSession(wctx, src.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	sa := &activities.Session{Host: h, Store: store}
	read, err := sa.MCPRead(ctx, contract.ReadInput{SourceID: src.ID, SessionGeneration: c.Generation(), ServerURI: u, Ordinal: 1, RequestID: "r"})
	if err != nil || !read.Found {
		t.Fatalf("read: %+v %v", read, err)
	}
	for name, s := range map[string]string{"server name": read.ServerName, "server version": read.ServerVersion, "MIME type": read.MIMEType} {
		if len(s) > ledger.MaxPayloadString {
			t.Errorf("%s of %d bytes in the read's result, over %d", name, len(s), ledger.MaxPayloadString)
		}
	}
	if want := ledger.Bounded(hugeName, ledger.MaxPayloadString); read.ServerName != want {
		t.Errorf("server name %q…, want the bounded %q…", read.ServerName[:40], want[:40])
	}

	huge := errors.New("server said: " + strings.Repeat("e", 1<<20))
	tests := []struct {
		name         string
		err          error
		wantType     string
		nonRetryable bool
	}{
		{"permanent", temporal.NewNonRetryableApplicationError("resources/read: "+huge.Error(), contract.ErrTypePermanent, huge), contract.ErrTypePermanent, true},
		{"stale session", temporal.NewNonRetryableApplicationError(huge.Error(), contract.ErrTypeStaleSession, huge), contract.ErrTypeStaleSession, true},
		{"retryable", huge, "", false},
	}
	for _, tt := range tests {
		got := activities.BoundError(tt.err)
		if n := len(got.Error()); n > 2*ledger.MaxPayloadString {
			t.Errorf("%s: bounded error is %d bytes", tt.name, n)
		}
		var app *temporal.ApplicationError
		if tt.wantType != "" {
			if !errors.As(got, &app) || app.Type() != tt.wantType || app.NonRetryable() != tt.nonRetryable {
				t.Errorf("%s: bounded error %T lost its type or retryability: %.200v", tt.name, got, got)
			}
		} else if errors.As(got, &app) && app.NonRetryable() {
			t.Errorf("%s: a retryable error became non-retryable", tt.name)
		}
		if !strings.Contains(got.Error(), "sha256:") {
			t.Errorf("%s: bounded error carries no digest of the whole: %.200s", tt.name, got.Error())
		}
		// The failure Temporal would record: every level of the chain, as the default
		// converter walks it.
		total := 0
		for e := got; e != nil; e = errors.Unwrap(e) {
			total += len(e.Error())
		}
		if total > 4*ledger.MaxPayloadString {
			t.Errorf("%s: failure chain carries %d bytes", tt.name, total)
		}
	}
	if short := errors.New("short"); activities.BoundError(short) != short {
		t.Error("a short error was not returned unchanged")
	}
}
