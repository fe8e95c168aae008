package gate

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SelfTest runs the checker self-test on the ledger behind pool and returns its table row
// and how many broken fences there were.
func SelfTest(ctx context.Context, pool *pgxpool.Pool) (Row, int, error) {
	res, err := selfTest(ctx, pool)
	return res.row(), len(res.Fences), err
}

// DisableChecker silences one checker of the self-test until the returned function runs.
func DisableChecker(name string) (restore func()) {
	disabledCheckers[name] = true
	return func() { delete(disabledCheckers, name) }
}

// Checker names for tests.
const (
	CheckerInvariantsOldSession = chkInvOldSession
	CheckerShuffleRegression    = chkShufRegression
	CheckerPorcupine            = chkPorcupine
	CheckerRevocation           = chkRevocation
)

// ReasonsText is reasonsText: the reads by reason and outcome between two counts.
var ReasonsText = reasonsText
