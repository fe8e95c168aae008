package throughput

import (
	"io"
	"strings"
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

// Step is what a step of the bench's searches measured at a rate.
type Step struct {
	P99       time.Duration
	Converged bool // every update accepted
}

// Searches runs the saturation search from rate (at most steps steps) and then the latency
// goal's search (at most goalBudget of its steps fit), measuring each rate with at, and
// returns the rates each tried (rounded to a tenth) and each one's best — the saturation
// point's over every rate measured, as the bench prints it —, and the goal search's
// description.
func Searches(rate float64, steps, goalBudget int, at func(rate float64) Step) (satTried []float64, satBest float64, goalTried []float64, goalBest float64, goalText string) {
	measure := func(r float64) (e2eResult, error) {
		m := at(r)
		return e2eResult{rate: r, offered: r, perSec: r, p99: m.P99, converged: m.Converged}, nil
	}
	first, _ := measure(rate)
	sat, _ := stepSearch(rate, first, saturationP99, steps, func(int) bool { return true }, measure)
	goal, _ := goalSearch(sat, func(i int) bool { return i < goalBudget }, measure)
	all := sat.with(goal.tried)
	rates := func(s saturation) (out []float64) {
		for _, r := range s.tried {
			out = append(out, float64(int(r.rate*10+0.5))/10)
		}
		return out
	}
	return rates(sat), all.best, rates(goal), goal.best, strings.TrimSpace(goal.describe() + goal.skipped)
}
