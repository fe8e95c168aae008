package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Revoking a principal's grant on one source reads that grant alone, however many sources the
// principal holds grants on: under the generic plan a prepared statement settles on, the
// grant row is found by its whole key (principal and source), not by the principal with the
// source left to a filter over every grant the principal holds. (A revocation used to slow as
// grants piled up: the gate's shuffles, one principal over a million sources, fell from 6,100
// to 4,200 interleavings a minute within 40,000.)
func TestRevokeOneSourceReadsOneGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t)
	st := ledger.New(pool)
	var target ledger.Source
	for i := range 3 {
		src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: fmt.Sprintf("plan-%d", i), Transport: ledger.TransportStdio, Command: []string{"srv"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.GrantAccess(ctx, "planner", src.ID, "test"); err != nil {
			t.Fatal(err)
		}
		target = src
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	sql, args := ledger.RevokeGrantsStatement("planner", 1, target.ID)
	types := make([]string, len(args))
	values := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			types[i], values[i] = "text", "'"+v+"'"
		case int64:
			types[i], values[i] = "bigint", fmt.Sprint(v)
		default:
			t.Fatalf("argument %d: %T", i+1, a)
		}
	}
	simple := pgx.QueryExecModeSimpleProtocol
	// A table this small would be read whole whatever the statement says; the question is
	// what an index can be asked.
	for _, stmt := range []string{
		"SET plan_cache_mode = force_generic_plan",
		"SET enable_seqscan = off",
		"PREPARE revoke_plan(" + strings.Join(types, ", ") + ") AS " + sql,
	} {
		if _, err := conn.Exec(ctx, stmt, simple); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), "DEALLOCATE revoke_plan; RESET plan_cache_mode; RESET enable_seqscan", simple)
	}()
	var plan string
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE revoke_plan("+strings.Join(values, ", ")+")", simple).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var doc []struct{ Plan map[string]any }
	if err := json.Unmarshal([]byte(plan), &doc); err != nil || len(doc) != 1 {
		t.Fatalf("plan %q: %v", plan, err)
	}
	conds := grantIndexConds(doc[0].Plan)
	if len(conds) == 0 {
		t.Fatalf("the generic plan reads grants without an index:\n%s", plan)
	}
	for _, c := range conds {
		if !strings.Contains(c, "principal") || !strings.Contains(c, "source_id") {
			t.Errorf("index condition on grants %q: want the principal and the source; plan:\n%s", c, plan)
		}
	}
}

// grantIndexConds returns the index conditions of the plan's scans of an index on grants.
func grantIndexConds(node map[string]any) []string {
	var out []string
	if name, _ := node["Index Name"].(string); strings.HasPrefix(name, "grants") {
		cond, _ := node["Index Cond"].(string)
		out = append(out, cond)
	}
	children, _ := node["Plans"].([]any)
	for _, c := range children {
		if m, ok := c.(map[string]any); ok {
			out = append(out, grantIndexConds(m)...)
		}
	}
	return out
}
