package ledger_test

import (
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A notification of the old session recorded while a new session of the source is committing
// routes nothing: the statement waits for the new generation's commit and then audits the
// notification OLD_SESSION (R12), instead of matching the generation of its pre-commit snapshot.
func TestRecordNotificationDuringNewSessionIsOld(t *testing.T) {
	f := newFixture(t)
	tx, err := f.st.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	// What OpenSession does first: move the source to the next generation (not committed yet).
	if _, err := tx.Exec(f.ctx, `UPDATE sources SET current_generation = current_generation + 1 WHERE id = $1`, f.src.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		targets []ledger.NotificationTarget
		audit   mcpsync.ReceiptKind
		err     error
	}
	done := make(chan result, 1)
	go func() {
		targets, audit, err := f.st.RecordNotification(f.ctx, ledger.Notification{
			SourceID: f.src.ID, SessionGeneration: f.sess.Generation, Seq: 1, URI: testURI, ServerURI: testURI})
		done <- result{targets, audit, err}
	}()
	var r result
	select {
	case r = <-done:
		// Returned without waiting for the new generation: it decided on the old snapshot.
	case <-time.After(500 * time.Millisecond):
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		r = <-done
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.targets) != 0 || r.audit != mcpsync.ReceiptNotificationOld {
		t.Errorf("old-session notification during a new session's commit: targets %+v, audit %q; want none, %q",
			r.targets, r.audit, mcpsync.ReceiptNotificationOld)
	}
}
