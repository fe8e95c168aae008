package devtemporal

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ServerLockKey is the advisory lock a server holds on its main database.
const ServerLockKey = serverLockKey

// LockDatabase takes the server lock on dbURL as Start does.
func LockDatabase(ctx context.Context, dbURL string) (*pgx.Conn, error) {
	return lockDatabase(ctx, dbURL)
}

// UnlockDatabase releases the server lock as Stop does.
func UnlockDatabase(conn *pgx.Conn) { unlockDatabase(conn) }
