package scale

import (
	"testing"
	"time"
)

// The re-read storm gets the budget that is left after the start phase, less the stop's
// reserve: a small budget keeps a fifth of itself for the stop, so that the storm of a quick
// run is measured (with the whole 40 s, make bench-quick's storm was cut at 0 s).
func TestStormDeadlineLeavesTheStormTime(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name           string
		budget         time.Duration // 0: none
		killedAfter    time.Duration
		timeout        time.Duration
		wantReserve    time.Duration
		wantStormUntil time.Duration // after t0
	}{
		{"no budget: -timeout", 0, 30 * time.Second, 10 * time.Minute, 40 * time.Second, 30*time.Second + 10*time.Minute},
		{"make bench: the whole reserve", 515 * time.Second, 200 * time.Second, 10 * time.Minute, 40 * time.Second, 475 * time.Second},
		{"make bench-quick: a fifth of the budget", 70 * time.Second, 30 * time.Second, 10 * time.Minute, 14 * time.Second, 56 * time.Second},
		{"-timeout first", 515 * time.Second, 100 * time.Second, time.Minute, 40 * time.Second, 160 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config{started: t0, timeout: tt.timeout}
			if tt.budget > 0 {
				c.deadline = t0.Add(tt.budget)
			}
			if got := c.stopReserve(); got != tt.wantReserve {
				t.Errorf("stopReserve() = %s, want %s", got, tt.wantReserve)
			}
			if got := c.stormDeadline(t0.Add(tt.killedAfter)).Sub(t0); got != tt.wantStormUntil {
				t.Errorf("stormDeadline() = start + %s, want start + %s", got, tt.wantStormUntil)
			}
		})
	}
}
