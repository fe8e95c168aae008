package ledger_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Issue 16 item 2: an acceptance given the read's body stores it in its own transaction, so
// the version it accepts always names a stored body, and a body that cannot be stored leaves
// nothing of the acceptance either; a body whose digest is not the one named is refused
// before anything is written; a refused answer's body is stored as PutBlob before the
// acceptance would have stored it (Prune removes it once no version names it).
func TestAcceptStoresBodyInItsTransaction(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		digestOf   string // the digest the request names
		stale      bool   // answer ordinal 1 after ordinal 2 was accepted
		failBlob   bool   // a trigger refuses the body's row
		wantErr    error
		want       mcpsync.Outcome
		wantStored bool
	}{
		{name: "accepted", body: "fresh", digestOf: "fresh", want: mcpsync.OutcomeAccepted, wantStored: true},
		{name: "empty body", body: "", digestOf: "", want: mcpsync.OutcomeAccepted, wantStored: true},
		{name: "digest of another body", body: "fresh", digestOf: "other", wantErr: ledger.ErrInvalid},
		{name: "stale answer", body: "late", digestOf: "late", stale: true, want: mcpsync.OutcomeStale, wantStored: true},
		{name: "body refused", body: "poison", digestOf: "poison", failBlob: true, wantErr: errBlobRefused},
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
			if tt.failBlob {
				if _, err := f.st.Pool().Exec(f.ctx, `CREATE FUNCTION refuse_blob() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN RAISE EXCEPTION 'test: blob refused'; END $$;
					CREATE TRIGGER refuse_blob BEFORE INSERT ON content_blobs FOR EACH ROW EXECUTE FUNCTION refuse_blob()`); err != nil {
					t.Fatal(err)
				}
			}
			receipts, watermark := f.count("receipts"), f.refresh().LastAcceptedOrdinal
			r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{
				SubscriptionID: f.sub.ID, Generation: f.sub.Generation, SessionGeneration: f.sess.Generation,
				URI: testURI, Ordinal: ord, RequestID: req, Body: []byte(tt.body),
				Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: ledger.Digest([]byte(tt.digestOf)), Size: int64(len(tt.body))},
			})
			if tt.wantErr == errBlobRefused {
				if err == nil || !strings.Contains(err.Error(), "test: blob refused") {
					t.Fatalf("error %v, want the trigger's refusal", err)
				}
			} else if !errors.Is(err, tt.wantErr) {
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
				Outcome   mcpsync.Outcome
				Stored    bool
				Receipts  int
				Watermark int64
			}
			want := result{tt.want, tt.wantStored, receipts, watermark}
			if tt.wantErr == nil {
				want.Receipts++
			}
			if tt.want == mcpsync.OutcomeAccepted {
				want.Watermark = ord
			}
			if diff := cmp.Diff(want, result{got, stored, f.count("receipts"), f.refresh().LastAcceptedOrdinal}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// errBlobRefused stands for the error of a body the test's trigger refused.
var errBlobRefused = errors.New("blob refused by the test's trigger")
