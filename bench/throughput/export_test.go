package throughput

import (
	"io"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/floor"
)

// PrintFloorUpdate prints the floor with workflow updates beside the floor with signals as the
// bench does, from each floor's result and the machine, this process's and PostgreSQL's CPU
// over its offered phase.
func PrintFloorUpdate(out io.Writer, n int, fl floor.Result, busy, self, pg time.Duration, flU floor.Result, busyU, selfU, pgU time.Duration) {
	cost := func(r floor.Result, busy, self, pg time.Duration) cpuCost {
		return cpuCost{used: cpuReading{busy: busy, self: self, pg: pg}, updates: r.Accepted}
	}
	printFloorUpdate(out, n, fl, cost(fl, busy, self, pg), flU, cost(flU, busyU, selfU, pgU))
}
