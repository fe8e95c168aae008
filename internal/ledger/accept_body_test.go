package ledger_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Issue 16 item 2: an acceptance given the read's body stores it in its own transaction, so
// the version it accepts always names a stored body; a body whose digest is not the one named
// is refused before anything is written; a refused answer's body is stored as PutBlob before
// the acceptance would have stored it (Prune removes it once no version names it).
func TestAcceptStoresBodyInItsTransaction(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		digestOf   string // the digest the request names
		stale      bool   // answer ordinal 1 after ordinal 2 was accepted
		wantErr    error
		want       mcpsync.Outcome
		wantStored bool
	}{
		{name: "accepted", body: "fresh", digestOf: "fresh", want: mcpsync.OutcomeAccepted, wantStored: true},
		{name: "empty body", body: "", digestOf: "", want: mcpsync.OutcomeAccepted, wantStored: true},
		{name: "digest of another body", body: "fresh", digestOf: "other", wantErr: ledger.ErrInvalid},
		{name: "stale answer", body: "late", digestOf: "late", stale: true, want: mcpsync.OutcomeStale, wantStored: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			ord, req := f.dispatch("r1").Ordinal, "r1"
			if tt.stale {
				f.dispatch("r2")
				if r := f.accept(2, "r2", "newer"); r.Outcome != mcpsync.OutcomeAccepted {
					t.Fatalf("accept ordinal 2: %+v", r)
				}
			}
			receipts := f.count("receipts")
			r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{
				SubscriptionID: f.sub.ID, Generation: f.sub.Generation, SessionGeneration: f.sess.Generation,
				URI: testURI, Ordinal: ord, RequestID: req, Body: []byte(tt.body),
				Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: ledger.Digest([]byte(tt.digestOf)), Size: int64(len(tt.body))},
			})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			got, stored := r.Outcome, false
			if body, err := f.st.Blob(f.ctx, ledger.Digest([]byte(tt.body))); err == nil {
				stored = true
				if string(body) != tt.body {
					t.Errorf("stored body %q, want %q", body, tt.body)
				}
			} else if !errors.Is(err, ledger.ErrNotFound) {
				t.Fatal(err)
			}
			type result struct {
				Outcome  mcpsync.Outcome
				Stored   bool
				Receipts int
			}
			want := result{tt.want, tt.wantStored, receipts}
			if tt.wantErr == nil {
				want.Receipts++
			}
			if diff := cmp.Diff(want, result{got, stored, f.count("receipts")}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
