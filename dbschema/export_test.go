package dbschema

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ApplyBelow is Apply over the embedded migrations older than version: a ledger as a release
// before that migration left it.
func ApplyBelow(ctx context.Context, pool *pgxpool.Pool, version int) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	var older []Migration
	for _, m := range migs {
		if m.Version < version {
			older = append(older, m)
		}
	}
	return apply(ctx, pool, older)
}
