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
// source left to a filter over every grant the principal holds; likewise the revocation's
// derived-index entries and subscriptions are looked up source by source. (A revocation used to slow as
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
	type statement struct {
		name, table string
		sql         string
		args        []any
	}
	sql, args := ledger.RevokeGrantsStatement("planner", 1, target.ID)
	stmts := []statement{{"revokeGrants", "grants", sql, args}}
	for name, st := range ledger.RevokeFollowUpStatements("planner", 1, []int64{target.ID}) {
		table := map[string]string{"invalidateIndexes": "index_lineage", "recordRevokedSubscriptions": "subscriptions"}[name]
		stmts = append(stmts, statement{name, table, st.SQL, st.Args})
	}
	for _, st := range stmts {
		t.Run(st.name, func(t *testing.T) {
			plan := genericPlan(t, ctx, conn.Conn(), st.sql, st.args)
			// Every look-up of the principal's rows names the source, and there is one.
			found := false
			for _, c := range indexConds(plan, st.table) {
				if !strings.Contains(c, "principal") && !strings.Contains(c, "source_id") {
					continue // a join back by primary key
				}
				if !strings.Contains(c, "source_id") {
					t.Errorf("index condition on %s %q: the source is left to a filter; plan:\n%s", st.table, c, planText(plan))
				}
				found = true
			}
			if !found {
				t.Errorf("no look-up of %s by source; plan:\n%s", st.table, planText(plan))
			}
		})
	}
}

// genericPlan prepares sql with the types of args, forces the generic plan a cached prepared
// statement may settle on, and returns the plan EXPLAIN EXECUTE gives for args. A table this
// small would be read whole whatever the statement says (sequential scans are off): the
// question is what an index can be asked.
func genericPlan(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string, args []any) map[string]any {
	t.Helper()
	types := make([]string, len(args))
	values := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			types[i], values[i] = "text", "'"+v+"'"
		case int64:
			types[i], values[i] = "bigint", fmt.Sprint(v)
		case []int64:
			parts := make([]string, len(v))
			for j, x := range v {
				parts[j] = fmt.Sprint(x)
			}
			types[i], values[i] = "bigint[]", "'{"+strings.Join(parts, ",")+"}'"
		case *int64:
			types[i], values[i] = "bigint", "NULL"
			if v != nil {
				values[i] = fmt.Sprint(*v)
			}
		case nil:
			types[i], values[i] = "bigint", "NULL"
		default:
			t.Fatalf("argument %d: %T", i+1, a)
		}
	}
	simple := pgx.QueryExecModeSimpleProtocol
	for _, stmt := range []string{
		"SET plan_cache_mode = force_generic_plan",
		"SET enable_seqscan = off",
		"PREPARE plan_probe(" + strings.Join(types, ", ") + ") AS " + sql,
	} {
		if _, err := conn.Exec(ctx, stmt, simple); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), "DEALLOCATE plan_probe; RESET plan_cache_mode; RESET enable_seqscan", simple)
	}()
	var plan string
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE plan_probe("+strings.Join(values, ", ")+")", simple).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var doc []struct{ Plan map[string]any }
	if err := json.Unmarshal([]byte(plan), &doc); err != nil || len(doc) != 1 {
		t.Fatalf("plan %q: %v", plan, err)
	}
	return doc[0].Plan
}

func planText(plan map[string]any) string {
	b, _ := json.MarshalIndent(plan, "", "  ")
	return string(b)
}

// indexConds returns the index conditions of the plan's scans of an index on table (the
// schema names every index after its table).
func indexConds(node map[string]any, table string) []string {
	var out []string
	if name, _ := node["Index Name"].(string); strings.HasPrefix(name, table+"_") {
		cond, _ := node["Index Cond"].(string)
		out = append(out, cond)
	}
	children, _ := node["Plans"].([]any)
	for _, c := range children {
		if m, ok := c.(map[string]any); ok {
			out = append(out, indexConds(m, table)...)
		}
	}
	return out
}
