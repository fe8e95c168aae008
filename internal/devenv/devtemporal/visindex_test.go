package devtemporal_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

// Issue 16 item 4: on PostgreSQL persistence, every visibility index led by namespace_id and a
// nullable search-attribute column is partial (WHERE <column> IS NOT NULL), so a visibility
// write no longer touches the indexes of the slots it leaves empty; a query on a slot still
// finds its rows through the slot's index; and a restart rebuilds nothing.
func TestVisibilityIndexesSkipEmptySlots(t *testing.T) {
	pg := freshPostgres(t)
	opts := devtemporal.Options{DataDir: t.TempDir(), DisableUI: true, Persistence: devtemporal.PersistencePostgres, Postgres: pg}
	s := start(t, opts)
	c := dial(t, s)
	ctx := ctxFor(t)

	visURL := databaseURL(t, pgtest.AdminURL(), pg.VisibilityDatabase)
	vis, err := pgx.Connect(ctx, visURL)
	if err != nil {
		t.Fatal(err)
	}
	defer vis.Close(ctx)

	rows, err := vis.Query(ctx, devtemporal.NullableSlotIndexes)
	if err != nil {
		t.Fatal(err)
	}
	var full []string
	for rows.Next() {
		var name, def, column string
		if err := rows.Scan(&name, &def, &column); err != nil {
			t.Fatal(err)
		}
		full = append(full, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string(nil), full); diff != "" {
		t.Errorf("indexes on a nullable slot that still hold every row (-want +got):\n%s", diff)
	}
	var partial int
	var kw string
	if err := vis.QueryRow(ctx, `SELECT count(*), coalesce(max(indexdef) FILTER (WHERE indexname = 'by_keyword_01'), '')
		FROM pg_indexes WHERE tablename = 'executions_visibility' AND indexdef LIKE '% WHERE %'`).Scan(&partial, &kw); err != nil {
		t.Fatal(err)
	}
	if partial < 40 || !strings.HasSuffix(kw, "WHERE (keyword01 IS NOT NULL)") {
		t.Errorf("%d partial indexes, by_keyword_01 %q; want at least 40, by_keyword_01 partial on keyword01", partial, kw)
	}

	// A query on a slot finds its row, and the slot's partial index can answer it.
	w := startGreeter(t, c)
	defer w.Stop()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: "greet-slots", TaskQueue: taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(temporal.NewSearchAttributeKeyKeyword("McpsyncSource").ValueSet("demo-slots")),
	}, Greet, "slots")
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	eventuallyListed(t, c, `McpsyncSource = "demo-slots"`, "greet-slots")
	tx, err := vis.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	prows, err := tx.Query(ctx, `EXPLAIN SELECT workflow_id FROM executions_visibility WHERE namespace_id = 'x' AND keyword01 = 'demo-slots'`)
	if err != nil {
		t.Fatal(err)
	}
	for prows.Next() {
		var line string
		if err := prows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if !strings.Contains(plan.String(), "by_keyword_01") {
		t.Errorf("a query on keyword01 does not use its partial index:\n%s", plan.String())
	}

	if n, err := devtemporal.LeanVisibilityIndexes(ctx, visURL); err != nil || n != 0 {
		t.Errorf("second run: %d indexes rebuilt, %v; want 0", n, err)
	}
}

// eventuallyListed waits until the visibility query lists exactly wfID (visibility is written
// after the workflow's own state).
func eventuallyListed(t *testing.T, c client.Client, query, wfID string) {
	t.Helper()
	ctx := ctxFor(t)
	var ids []string
	for range 100 {
		list, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		if err != nil {
			t.Fatalf("list %s: %v", query, err)
		}
		ids = ids[:0]
		for _, e := range list.GetExecutions() {
			ids = append(ids, e.GetExecution().GetWorkflowId())
		}
		if len(ids) == 1 && ids[0] == wfID {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("workflows listed by %s: %v, want [%s]", query, ids, wfID)
}
