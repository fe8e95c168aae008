package devtemporal

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// Temporal's PostgreSQL visibility schema indexes executions_visibility 73 times: one index
// per predefined search-attribute slot (Keyword01-10, Int01-03, Text01-03, …) and per
// system attribute, each led by namespace_id and the slot's column. A B-tree and a GIN index
// store a row whose column is NULL too, so every visibility write — a workflow's start, each
// workflow task that upserts search attributes, its close — touched all 73, although nearly
// every slot is NULL in nearly every row. Measured on `make run`'s default (issue 16 item 4;
// pg_stat_statements over a 3,000-subscription bulk subscribe, 2 cores): the two
// executions_visibility writes per subscription took 36.9 s of PostgreSQL's 60.2 s and 137 MiB
// of its 199 MiB of WAL, 5-7 ms each, more than the ledger and Temporal's main store together.
//
// leanVisibilityIndexes makes each of those indexes partial, WHERE <slot> IS NOT NULL: a row
// whose slot is NULL is left out of the slot's index, and a query on the slot still uses it
// (a comparison on the column implies the column is not NULL, which the planner proves from
// the predicate). Nothing is dropped or renamed; an index already partial is left as it is,
// so a restart changes nothing. Indexes whose key is not a plain nullable column (the default
// ordering index, the NOT NULL columns) are not touched.

// nullableSlotIndexes lists the non-partial, non-unique indexes of executions_visibility whose
// first key is namespace_id and whose second key is a nullable column: name, definition and
// that column.
const nullableSlotIndexes = `
	SELECT c.relname, pg_get_indexdef(i.indexrelid), a.attname
	FROM pg_index i
	JOIN pg_class c ON c.oid = i.indexrelid
	JOIN pg_attribute ns ON ns.attrelid = i.indrelid AND ns.attnum = i.indkey[0]
	JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[1]
	WHERE i.indrelid = 'executions_visibility'::regclass
	  AND i.indpred IS NULL AND NOT i.indisunique AND NOT i.indisprimary
	  AND ns.attname = 'namespace_id' AND NOT a.attnotnull
	ORDER BY c.relname`

// leanVisibilityIndexes rebuilds every index nullableSlotIndexes lists as a partial index on
// the visibility database at dbURL, in one transaction, and returns how many it rebuilt. It
// runs before the server starts, while nothing else writes the table.
func leanVisibilityIndexes(ctx context.Context, dbURL string) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", redact.DSN(dbURL), redact.Err(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n := 0
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Nothing should hold the table before the server starts; if something does, fail
		// with its lock named rather than wait for it.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, nullableSlotIndexes)
		if err != nil {
			return err
		}
		type index struct{ Name, Def, Column string }
		list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[index])
		if err != nil {
			return err
		}
		for _, ix := range list {
			if _, err := tx.Exec(ctx, "DROP INDEX "+pgx.Identifier{ix.Name}.Sanitize()); err != nil {
				return fmt.Errorf("index %s: %w", ix.Name, err)
			}
			if _, err := tx.Exec(ctx, ix.Def+" WHERE "+pgx.Identifier{ix.Column}.Sanitize()+" IS NOT NULL"); err != nil {
				return fmt.Errorf("index %s: %w", ix.Name, err)
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("visibility indexes: %w", err)
	}
	return n, nil
}
