// Command mcpsync-gate is mcpsync's release gate: it brings up a whole deployment in this
// process (Temporal, a Postgres ledger, workers, fault-injecting MCP servers), runs the seed's
// release measurements — 100,000 shuffled interleavings, discovery chaos, a duplicate
// notification storm, convergence with dropped notifications, revocation latency — and the
// R24 invariants, then prints the release table: metric, seed threshold, measured, pass/fail.
// The storm and convergence sections run once per MCP era (2025-11-25 and 2026-07-28), one
// row each, and both must pass.
// It exits 0 if every row passes, 1 if any fails, 2 on bad flags. `mcpsync gate` runs it.
// The console shows progress and the table only; the components' logs go to a file whose path
// the first line names. The command line is gate.Main's.
package main

import (
	"os"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
)

func main() {
	os.Exit(gate.Main(os.Args[1:], os.Stdout, os.Stderr))
}
