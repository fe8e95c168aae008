package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// The ledger calls that open a subscription at its start, before it subscribes: the ensure
// (one statement when it opens the row) and the live session with the source's periods (one
// statement), as SubscriptionWorkflow's first workflow task makes them. Reports the client's
// CPU per start beside the time (issue 16 item 4: a start's ledger round trips, 5 before
// 2026-12-05, 2 now).
func BenchmarkEnsureAndSession(b *testing.B) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(b))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "kb", Transport: ledger.TransportStdio, Command: []string{"kb"}})
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := st.GrantAccess(ctx, "alice", src.ID, "bench"); err != nil {
		b.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, "q", time.Hour); err != nil {
		b.Fatal(err)
	}
	if _, _, err := st.OpenSession(ctx, src.ID, "q", ledger.CapabilityReceipt{Resources: true, Subscribe: true}); err != nil {
		b.Fatal(err)
	}
	c0 := cpustat.Self()
	for i := 0; b.Loop(); i++ {
		u := fmt.Sprintf("demo://bench/%d", i)
		if _, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "alice", SourceID: src.ID, URI: u, ServerURI: u, WorkflowID: "wf/" + u}); err != nil {
			b.Fatal(err)
		}
		if _, err := st.CurrentSessionAndPeriods(ctx, src.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpustat.Self()-c0)/float64(b.N)/1e3, "client-cpu-µs/op")
}
