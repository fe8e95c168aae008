package workerapp_test

import (
	"testing"

	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

// TestMain gives the tests that need a ledger a PostgreSQL server (MCPSYNC_TEST_DATABASE_URL,
// or a private cluster started for this binary).
func TestMain(m *testing.M) { pgtest.Main(m) }
