package gate

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

func newPool(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	return pgxpool.NewWithConfig(ctx, cfg)
}
