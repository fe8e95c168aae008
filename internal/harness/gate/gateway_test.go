package gate_test

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

// TestGatewaySection runs the gate's gateway section (R29 through the MCP gateway) on a small
// deployment: every revoked principal's reads through a real gateway are refused once its
// revocation committed, and the section reports its latency row (the figure itself is the
// gate's to judge, not this test's).
func TestGatewaySection(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := localstack.Start(ctx, localstack.Options{AdminURL: pgtest.AdminURL(), Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Stop()
	rows, err := gate.RunSection(ctx, "gateway", st, gate.Options{Revocations: 12})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(rows), rows)
	}
	for _, r := range rows {
		t.Logf("%s %s = %s (%s): %s", r.Requirement, r.Metric, r.Measured, r.Threshold, r.Detail)
	}
	if r := rows[1]; r.Value != 0 || !r.Pass {
		t.Errorf("%s = %s, want 0", r.Metric, r.Measured)
	}
	if r := rows[0]; r.Value <= 0 {
		t.Errorf("%s measured %s, want a positive latency", r.Metric, r.Measured)
	}
}
