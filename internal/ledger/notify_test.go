package ledger_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// RecordNotification is idempotent: the session host retries it when the commit's reply is
// lost, and the retry of the same (source, session generation, seq, URI) returns the same
// targets, so the signal is still routed, and records nothing more. A notification with a
// sequence number below the one recorded is OUT_OF_ORDER (R12).
func TestRecordNotificationRetryRoutesAgain(t *testing.T) {
	f := newFixture(t)
	want := []ledger.NotificationTarget{{SubscriptionID: f.sub.ID, WorkflowID: "wf-1", Generation: f.sub.Generation, State: mcpsync.StateActive}}
	steps := []struct {
		name      string
		seq       int64
		want      []ledger.NotificationTarget
		wantAudit mcpsync.ReceiptKind
	}{
		{"first delivery", 5, want, ""},
		{"retry after a lost commit reply", 5, want, ""},
		{"second retry", 5, want, ""},
		{"an older sequence number", 4, nil, mcpsync.ReceiptNotificationOrder},
		{"the next notification", 6, want, ""},
		{"the earlier one, now older than the last", 5, nil, mcpsync.ReceiptNotificationOrder},
	}
	for _, step := range steps {
		before := f.rows()
		targets, audit, err := f.st.RecordNotification(f.ctx, ledger.Notification{
			SourceID: f.src.ID, SessionGeneration: f.sess.Generation, Seq: step.seq, URI: testURI, ServerURI: testURI,
		})
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if diff := cmp.Diff(step.want, targets); diff != "" || audit != step.wantAudit {
			t.Errorf("%s (seq %d): audit %q, want %q; targets (-want +got):\n%s", step.name, step.seq, audit, step.wantAudit, diff)
		}
		wantReceipts := before.Receipts
		if step.wantAudit != "" {
			wantReceipts++
		}
		if after := f.rows(); after.Receipts != wantReceipts {
			t.Errorf("%s: %d receipts written, want %d", step.name, after.Receipts-before.Receipts, wantReceipts-before.Receipts)
		}
	}
	if n, err := f.st.AuditCount(f.ctx, f.src.ID, mcpsync.ReceiptNotificationOrder); err != nil || n != 2 {
		t.Errorf("%d OUT_OF_ORDER audits (%v), want 2: only the genuinely older notifications", n, err)
	}
	if sub := f.refresh(); sub.LastNotificationGen != f.sess.Generation || sub.LastNotificationSeq != 6 {
		t.Errorf("last notification (%d, %d), want (%d, 6)", sub.LastNotificationGen, sub.LastNotificationSeq, f.sess.Generation)
	}
}
