package throughput_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/bench/throughput"
	"github.com/mcpsync/mcpsync/internal/harness/floor"
)

// TestPrintFloorUpdate: the floor with workflow updates is printed figure by figure beside the
// floor with signals, CPU per accepted update of each floor's own phase, as bench lines.
func TestPrintFloorUpdate(t *testing.T) {
	signals := floor.Result{Offered: 150, Accepted: 2000, AcceptedPerSec: 100, P50All: 2 * time.Second, P99All: 4 * time.Second}
	updates := floor.Result{Offered: 149.5, Accepted: 3000, AcceptedPerSec: 150, P50All: 40 * time.Millisecond, P99All: 400 * time.Millisecond, SignalErrors: 2}
	var out strings.Builder
	throughput.PrintFloorUpdate(&out, 1000, signals, 24*time.Second, 16*time.Second, 6*time.Second,
		updates, 30*time.Second, 24*time.Second, 6*time.Second)
	want := []string{
		"bench: floor-update-accepted-1000 150 /s (baseline floor-accepted-1000 100 /s, ratio 1.50)",
		"bench: floor-update-p50-1000 40 ms (baseline floor-p50-1000 2000 ms, ratio 0.02)",
		"bench: floor-update-p99-1000 400 ms (baseline floor-p99-1000 4000 ms, ratio 0.10)",
		"bench: floor-update-cpu-per-update-1000 10 ms (baseline floor-cpu-per-update-1000 12 ms, ratio 0.83)",
		"bench: floor-update-cpu-this-process-per-update-1000 8 ms (baseline floor-cpu-this-process-per-update-1000 8 ms, ratio 1.00)",
		"bench: floor-update-cpu-postgres-per-update-1000 2 ms (baseline floor-cpu-postgres-per-update-1000 3 ms, ratio 0.67)",
		"bench: floor-update-offered-1000 150 /s",
		"bench: floor-update-errors-1000 2 updates",
	}
	if diff := cmp.Diff(want, strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}
