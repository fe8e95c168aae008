package ledger_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Bounded keeps short strings as they are and cuts long ones, at a UTF-8 boundary, to at most
// the limit, with the digest and length of the whole; equal inputs give equal outputs and
// different ones different outputs (issue 14 item 6).
func TestBounded(t *testing.T) {
	long := strings.Repeat("a", 10000)
	tests := []struct {
		name    string
		in      string
		limit   int
		same    bool   // returned unchanged
		suffix  string // the end of a bounded result
		maxSize int
	}{
		{"empty", "", 200, true, "", 200},
		{"at the limit", strings.Repeat("x", 200), 200, true, "", 200},
		{"one over", strings.Repeat("x", 201), 200, false, ", 201 bytes]", 200},
		{"long", long, 4096, false, ", 10000 bytes]", 4096},
		{"multi-byte runes are not split", strings.Repeat("é", 5000), 1001, false, ", 10000 bytes]", 1001},
		{"a limit below 128 is 128", long, 10, false, ", 10000 bytes]", 128},
	}
	for _, tt := range tests {
		got := ledger.Bounded(tt.in, tt.limit)
		if (got == tt.in) != tt.same || len(got) > tt.maxSize || !utf8.ValidString(got) || !strings.HasSuffix(got, tt.suffix) {
			t.Errorf("%s: Bounded(%d bytes, %d) = %d bytes %q…%q", tt.name, len(tt.in), tt.limit, len(got), got[:min(len(got), 20)], got[max(0, len(got)-100):])
		}
		if !tt.same && !strings.Contains(got, ledger.Digest([]byte(tt.in))) {
			t.Errorf("%s: no digest of the whole in %q", tt.name, got[max(0, len(got)-100):])
		}
	}
	other := strings.Repeat("a", 9999) + "b"
	once, again := ledger.Bounded(long, 200), ledger.Bounded(long, 200)
	if once == ledger.Bounded(other, 200) || once != again {
		t.Error("bounded forms do not compare like their originals")
	}
	if got := ledger.BoundedText("a\x00" + long); len(got) > ledger.MaxPayloadString || strings.ContainsRune(got, 0) {
		t.Errorf("BoundedText: %d bytes, NUL kept: %v", len(got), strings.ContainsRune(got, 0))
	}
}

// RecordTooLarge passes the read fence like content and not-found: it settles its dispatch
// and raises the watermark with one TOO_LARGE receipt, keeps the version, and sets the reason
// a later accepted read clears; a stale or post-close answer gets the usual labelled refusal;
// a size within the bound is malformed (issue 14 item 6).
func TestRecordTooLargeThroughTheFence(t *testing.T) {
	f := newFixture(t)
	d1 := f.dispatch("r1")
	if r := f.accept(d1.Ordinal, "r1", "v1"); r.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("accept v1: %+v", r)
	}
	tooLarge := func(ord int64, req string) (mcpsync.Outcome, error) {
		return f.st.RecordTooLarge(f.ctx, ledger.TooLargeRequest{SubscriptionID: f.sub.ID, Generation: f.sub.Generation,
			SessionGeneration: f.sess.Generation, URI: testURI, Ordinal: ord, RequestID: req, Size: 100, MaxBytes: 10})
	}
	d2, d2b, d3 := f.dispatch("r2"), f.dispatch("r2b"), f.dispatch("r3")
	type state struct {
		Outcome  mcpsync.Outcome
		Versions int
		Outbox   int
		Reason   string
		Mark     int64
	}
	snap := func(o mcpsync.Outcome) state {
		s := f.refresh()
		return state{Outcome: o, Versions: f.count("resource_versions"), Outbox: f.count("invalidation_outbox"),
			Reason: s.StateReason, Mark: s.LastAcceptedOrdinal}
	}
	o, err := tooLarge(d3.Ordinal, "r3")
	if err != nil {
		t.Fatal(err)
	}
	want := state{Outcome: mcpsync.OutcomeTooLarge, Versions: 1, Outbox: 1, Mark: d3.Ordinal,
		Reason: "too large: read 4 returned 100 bytes, over the source's bound of 10 (--max-bytes); the previous version is kept"}
	if diff := cmp.Diff(want, snap(o)); diff != "" {
		t.Errorf("too large (-want +got):\n%s", diff)
	}
	if o, err := tooLarge(d2.Ordinal, "r2"); err != nil || o != mcpsync.OutcomeStale {
		t.Errorf("older read answered too large after it: %s %v, want STALE", o, err)
	}
	if r := f.accept(d2b.Ordinal, "r2b", "v2"); r.Outcome != mcpsync.OutcomeStale {
		t.Errorf("older read's content after TOO_LARGE: %s, want STALE", r.Outcome)
	}
	d4 := f.dispatch("r4")
	if r := f.accept(d4.Ordinal, "r4", "v4"); r.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("accept v4: %+v", r)
	}
	if s := f.refresh(); s.StateReason != "" {
		t.Errorf("reason after an accepted read: %q, want it cleared", s.StateReason)
	}
	d5 := f.dispatch("r5")
	f.closeFence()
	if o, err := tooLarge(d5.Ordinal, "r5"); err != nil || o != mcpsync.OutcomeStaleAfterClose {
		t.Errorf("too large after the close fence: %s %v, want STALE_AFTER_CLOSE", o, err)
	}
	if _, err := f.st.RecordTooLarge(f.ctx, ledger.TooLargeRequest{SubscriptionID: f.sub.ID, RequestID: "x", Size: 10, MaxBytes: 10}); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("size within the bound: %v, want ErrInvalid", err)
	}
}

// An overflow of an old session's queue signals nothing (R12) but is still audited.
func TestNotificationOverflowOfOldSession(t *testing.T) {
	f := newFixture(t)
	old := f.sess.Generation
	f.openSession()
	targets, err := f.st.RecordNotificationOverflow(f.ctx, ledger.Overflow{SourceID: f.src.ID, SessionGeneration: old, FirstSeq: 5, LastSeq: 9, Dropped: 5, QueueCap: 4})
	if err != nil || len(targets) != 0 {
		t.Fatalf("overflow of an old session: %+v %v", targets, err)
	}
	var current bool
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT (detail->>'current')::bool FROM receipts WHERE kind = 'NOTIFICATION_OVERFLOW' AND source_id = $1`, f.src.ID).Scan(&current); err != nil || current {
		t.Errorf("audit: current=%v %v", current, err)
	}
	// The current session's overflow reaches the live subscription.
	targets, err = f.st.RecordNotificationOverflow(f.ctx, ledger.Overflow{SourceID: f.src.ID, SessionGeneration: f.sess.Generation, FirstSeq: 1, LastSeq: 3, Dropped: 3, QueueCap: 4})
	if err != nil || len(targets) != 1 || targets[0].SubscriptionID != f.sub.ID || targets[0].ServerURI != testURI {
		t.Errorf("overflow of the current session: %+v %v", targets, err)
	}
}
