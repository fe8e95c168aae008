package scale

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The worker's metrics page as the SDK's Prometheus reporter serves it: the cache counters
// summed over their label sets, the finished runs of every kind added up, and the forced
// evictions without the finished runs the SDK counts among them.
func TestForcedEvictionsLeaveOutFinishedRuns(t *testing.T) {
	page := `# HELP temporal_sticky_cache_total_forced_eviction x
temporal_sticky_cache_total_forced_eviction{namespace="default",workflow_type="none"} 57
temporal_workflow_completed{workflow_type="StartBatchWorkflow"} 52
temporal_workflow_completed{workflow_type="DiscoveryScanWorkflow"} 2
temporal_workflow_continue_as_new_total{workflow_type="SourceWorkflow"} 1
temporal_workflow_failed{workflow_type="SubscriptionWorkflow"} 1
temporal_sticky_cache_hit{workflow_type="SubscriptionWorkflow"} 395
temporal_sticky_cache_hit{workflow_type="StartBatchWorkflow"} 52
temporal_sticky_cache_size{workflow_type="SubscriptionWorkflow"} 3002
temporal_sticky_cache_size{workflow_type="StartBatchWorkflow"} 2990
temporal_workflow_task_replay_latency_count{workflow_type="SubscriptionWorkflow"} 3418
`
	m, err := parseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		metricCacheEvictions: 57, metricRunsFinished: 56, metricCacheHit: 447, metricCacheSize: 3002, metricTasks: 3418,
	}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("parsed (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		m    map[string]float64
		want float64
	}{
		{m, 1},
		{map[string]float64{metricCacheEvictions: 3}, 3},
		{map[string]float64{metricCacheEvictions: 2, metricRunsFinished: 5}, 0},
	} {
		if got := forcedEvictions(tt.m); got != tt.want {
			t.Errorf("forcedEvictions(%v) = %v, want %v", tt.m, got, tt.want)
		}
	}
}
