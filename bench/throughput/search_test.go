package throughput_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/bench/throughput"
)

// TestSearches: the saturation point is the highest rate tried with p99 ≤ 1 s (by either
// search); the latency
// goal's rate is the highest rate tried with p99 ≤ 250 ms, found among the saturation search's
// rates when one met it and else by stepping down from the lowest of them, then one step
// between it and the next rate tried above it (their geometric mean), within the budget. A rate
// whose updates were not all accepted meets neither.
func TestSearches(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name       string
		p99        map[float64]time.Duration // by rate rounded to a tenth; missing: not converged
		goalBudget int
		satTried   []float64
		satBest    float64
		goalTried  []float64
		goalBest   float64
		goalText   string
	}{
		{
			name:       "saturation at 100/s, the goal one step below, then met between",
			p99:        map[float64]time.Duration{150: 2600 * ms, 100: 526 * ms, 66.7: 90 * ms, 81.6: 200 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 100}, satBest: 100,
			goalTried: []float64{150, 100, 66.7, 81.6}, goalBest: 81.6,
		},
		{
			name:       "the saturation search's rates already meet the goal; the step between misses it and meets p99 <= 1 s",
			p99:        map[float64]time.Duration{150: 2600 * ms, 100: 200 * ms, 122.5: 506 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 100}, satBest: 122.5,
			goalTried: []float64{150, 100, 122.5}, goalBest: 100,
		},
		{
			name:       "stepping up for saturation, the goal met at the first rate",
			p99:        map[float64]time.Duration{150: 240 * ms, 225: 800 * ms, 337.5: 3 * time.Second, 183.7: 230 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 225, 337.5}, satBest: 225,
			goalTried: []float64{150, 225, 337.5, 183.7}, goalBest: 183.7,
		},
		{
			name:       "stepping up for saturation, the goal below the first rate",
			p99:        map[float64]time.Duration{150: 600 * ms, 225: 3 * time.Second, 100: 150 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 225}, satBest: 150,
			goalTried: []float64{150, 225, 100, 122.5}, goalBest: 100,
		},
		{
			name:       "nothing met either bound: the goal search takes its two steps",
			p99:        map[float64]time.Duration{150: 9 * time.Second, 100: 4 * time.Second, 66.7: 2 * time.Second, 44.4: 800 * ms, 29.6: 400 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 100, 66.7, 44.4}, satBest: 44.4,
			goalTried: []float64{150, 100, 66.7, 44.4, 29.6, 19.8}, goalBest: 0,
		},
		{
			name:       "a rate with updates never accepted meets no bound, whatever its p99",
			p99:        map[float64]time.Duration{150: 2 * time.Second, 66.7: 100 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 100, 66.7}, satBest: 66.7,
			goalTried: []float64{150, 100, 66.7, 81.6}, goalBest: 66.7,
		},
		{
			name:       "no time for a goal step",
			p99:        map[float64]time.Duration{150: 2600 * ms, 100: 526 * ms},
			goalBudget: 0,
			satTried:   []float64{150, 100}, satBest: 100,
			goalTried: []float64{150, 100}, goalBest: 0,
			goalText: "(stopped after 0 of at most 2 steps: the budget)",
		},
		{
			name:       "no time for the step between",
			p99:        map[float64]time.Duration{150: 2600 * ms, 100: 200 * ms},
			goalBudget: 0,
			satTried:   []float64{150, 100}, satBest: 100,
			goalTried: []float64{150, 100}, goalBest: 100,
			goalText: "(no time to try between 100 and 150/s: the budget)",
		},
		{
			name:       "the step down used the budget: none between",
			p99:        map[float64]time.Duration{150: 2600 * ms, 100: 526 * ms, 66.7: 400 * ms, 44.4: 90 * ms},
			goalBudget: 2,
			satTried:   []float64{150, 100}, satBest: 100,
			goalTried: []float64{150, 100, 66.7, 44.4}, goalBest: 44.4,
			goalText: "(no time to try between 44 and 67/s: the budget)",
		},
	}
	round := func(v float64) float64 { return math.Round(v*10) / 10 }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := func(rate float64) throughput.Step {
				p99, ok := tt.p99[round(rate)]
				if !ok {
					return throughput.Step{P99: time.Millisecond}
				}
				return throughput.Step{P99: p99, Converged: true}
			}
			satTried, satBest, goalTried, goalBest, goalText := throughput.Searches(150, 3, tt.goalBudget, at)
			got := []any{satTried, round(satBest), goalTried, round(goalBest)}
			want := []any{tt.satTried, tt.satBest, tt.goalTried, tt.goalBest}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("saturation tried, best; goal tried, best (-want +got):\n%s", diff)
			}
			if tt.goalText != "" && !strings.HasSuffix(goalText, tt.goalText) {
				t.Errorf("goal search: %q, want it to end with %q", goalText, tt.goalText)
			}
		})
	}
}
