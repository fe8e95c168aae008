package workerapp_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// The worker's retention schedule is off unless MCPSYNC_PRUNE_EVERY says otherwise, and a
// malformed value stops the worker with one line naming the variable.
func TestPruneScheduleFromEnv(t *testing.T) {
	tests := []struct {
		env     map[string]string
		want    workerapp.PruneSchedule
		wantErr string
	}{
		{env: nil, want: workerapp.PruneSchedule{OlderThan: ledger.DefaultPruneOlderThan}},
		{env: map[string]string{"MCPSYNC_PRUNE_EVERY": "0"}, want: workerapp.PruneSchedule{OlderThan: ledger.DefaultPruneOlderThan}},
		{env: map[string]string{"MCPSYNC_PRUNE_EVERY": "1h"}, want: workerapp.PruneSchedule{Every: time.Hour, OlderThan: ledger.DefaultPruneOlderThan}},
		{env: map[string]string{"MCPSYNC_PRUNE_EVERY": "6h", "MCPSYNC_PRUNE_OLDER_THAN": "168h"}, want: workerapp.PruneSchedule{Every: 6 * time.Hour, OlderThan: 168 * time.Hour}},
		{env: map[string]string{"MCPSYNC_PRUNE_EVERY": "hourly"}, wantErr: `MCPSYNC_PRUNE_EVERY="hourly": want a duration of at least 1m0s (e.g. 1h), or 0 for off`},
		{env: map[string]string{"MCPSYNC_PRUNE_EVERY": "5s"}, wantErr: `MCPSYNC_PRUNE_EVERY="5s": want a duration of at least 1m0s (e.g. 1h), or 0 for off`},
		{env: map[string]string{"MCPSYNC_PRUNE_EVERY": "-1h"}, wantErr: `MCPSYNC_PRUNE_EVERY="-1h": want a duration of at least 1m0s (e.g. 1h), or 0 for off`},
		{env: map[string]string{"MCPSYNC_PRUNE_OLDER_THAN": "-1h"}, wantErr: `MCPSYNC_PRUNE_OLDER_THAN="-1h": want a duration of 0 or more (e.g. 720h)`},
		{env: map[string]string{"MCPSYNC_PRUNE_OLDER_THAN": "a month"}, wantErr: `MCPSYNC_PRUNE_OLDER_THAN="a month": want a duration of 0 or more (e.g. 720h)`},
	}
	for _, tt := range tests {
		got, err := workerapp.PruneScheduleFromEnv(func(k string) string { return tt.env[k] })
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("%v: error %v, want %q", tt.env, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.env, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tt.env, diff)
		}
	}
}

// The schedule prunes on every tick (here a notification audit, which serves no fence) and
// stops with its context.
func TestRunPruneSchedule(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "demo", Transport: ledger.TransportStdio, Command: []string{"srv"}})
	if err != nil {
		t.Fatal(err)
	}
	audit := func(seq int64) {
		t.Helper()
		if _, kind, err := st.RecordNotification(ctx, ledger.Notification{SourceID: src.ID, Seq: seq, URI: "demo://x", ServerURI: "demo://x"}); err != nil || kind != mcpsync.ReceiptNotificationUnknown {
			t.Fatalf("notification: %q %v", kind, err)
		}
	}
	count := func() int {
		n, err := st.AuditCount(ctx, src.ID, mcpsync.ReceiptNotificationUnknown)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int)
	go func() {
		done <- workerapp.RunPruneSchedule(rctx, st, workerapp.PruneSchedule{Every: 20 * time.Millisecond}, nil)
	}()
	for seq := int64(1); seq <= 2; seq++ {
		audit(seq)
		deadline := time.Now().Add(10 * time.Second)
		for count() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("audit %d still there after 10s of a 20ms prune schedule", seq)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancel()
	select {
	case runs := <-done:
		if runs < 1 { // one run may have deleted both audits
			t.Errorf("%d runs completed, want at least 1", runs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the schedule did not stop with its context")
	}
	if n := workerapp.RunPruneSchedule(ctx, st, workerapp.PruneSchedule{}, nil); n != 0 {
		t.Errorf("an off schedule ran %d times", n)
	}
}
