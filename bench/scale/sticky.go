package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Temporal SDK's sticky-cache metrics as the worker's /metrics serves them (tally's
// Prometheus reporter; counters may carry a _total suffix).
const (
	metricCacheSize      = "temporal_sticky_cache_size"
	metricCacheHit       = "temporal_sticky_cache_hit"
	metricCacheMiss      = "temporal_sticky_cache_miss"
	metricCacheEvictions = "temporal_sticky_cache_total_forced_eviction"
	// metricRunsFinished sums the SDK's counters of runs that ended on this worker (completed,
	// failed, canceled, continued as new; parseMetrics adds them up under this name). The SDK
	// counts a finished run's removal from the cache as a forced eviction too: the removal's
	// callback runs in a goroutine of its own and reads the run's state only after the task
	// handler has cleared it (go.temporal.io/sdk v1.50.0, WorkerCache's RemovedFunc and
	// workflowExecutionContextImpl.Unlock), so forcedEvictions subtracts them.
	metricRunsFinished = "temporal_workflow_finished"
	// metricTasks counts workflow tasks: the SDK records the replay-latency timer once per
	// workflow task it processes.
	metricTasks = "temporal_workflow_task_replay_latency_count"
)

// stickyCache follows the worker's sticky workflow cache through its metrics: how many
// executions it held at most, and the hits, misses (each a replay of the whole history),
// forced evictions and workflow tasks so far. The SDK updates the size gauge on every workflow task, so sampling it every few
// seconds sees its peak within the tasks of those seconds.
type stickyCache struct {
	url      string
	capacity int

	scraped  bool    // at least one scrape succeeded
	lastErr  error   // the last scrape's error
	peak     float64 // the largest size seen
	cur      map[string]float64
	atActive map[string]float64 // the counters when print was called (before the storm)
}

// sample scrapes the metrics once; a failed scrape is remembered, not fatal (the figures then
// say the metrics were not available).
func (s *stickyCache) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := scrape(ctx, s.url)
	if err != nil {
		s.lastErr = err
		return
	}
	s.scraped, s.cur = true, m
	s.peak = max(s.peak, m[metricCacheSize])
}

// scrape reads a Prometheus text page and returns the metrics named above: the counters summed
// over their label sets, the size gauge as its largest value (the SDK tags it by workflow type,
// but each value is the whole cache's size).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("worker metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("worker metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics is scrape's parsing of the text page in r.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		name = strings.TrimSuffix(name, "_total")
		switch name {
		case metricCacheSize, metricCacheHit, metricCacheMiss, metricCacheEvictions, metricTasks:
		case "temporal_workflow_completed", "temporal_workflow_failed", "temporal_workflow_canceled", "temporal_workflow_continue_as_new":
			name = metricRunsFinished
		default:
			continue
		}
		if j := strings.LastIndexByte(rest, '}'); j >= 0 {
			rest = rest[j+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		if name == metricCacheSize {
			out[name] = max(out[name], v)
		} else {
			out[name] += v
		}
	}
	return out, sc.Err()
}

// print writes the cache figures once active of n subscriptions are ACTIVE: the most
// executions the cache held next to its capacity, forced evictions, misses next to hits and
// history replays; and the cache size n subscriptions need.
func (s *stickyCache) print(n, active int) {
	if !s.scraped {
		fmt.Printf("scale: sticky cache figures not available: the worker's metrics could not be read: %v\n", s.lastErr)
		return
	}
	s.atActive = s.cur
	suffix := fmt.Sprint(n)
	if active != n {
		suffix = fmt.Sprintf("at-%d", active)
	}
	evictions := forcedEvictions(s.cur)
	fmt.Printf("bench: sticky-cache-forced-evictions-%s %.0f executions (baseline sticky-cache-removals-counted-%s %.0f executions, ratio %s)\n",
		suffix, evictions, suffix, s.cur[metricCacheEvictions], ratioText(evictions, s.cur[metricCacheEvictions]))
	fmt.Printf("bench: sticky-cache-misses-%s %.0f tasks (baseline sticky-cache-hits-%s %.0f tasks, ratio %s)\n",
		suffix, s.cur[metricCacheMiss], suffix, s.cur[metricCacheHit], ratioText(s.cur[metricCacheMiss], s.cur[metricCacheHit]))
	fmt.Printf("bench: workflow-tasks-%s %.0f tasks\n", suffix, s.cur[metricTasks])
	// The SDK's cache holds capacity-1 executions; a forced eviction is also an execution
	// dropped after a failed workflow task (whatever the room), so only a full cache says the
	// capacity was too small.
	if full := s.peak >= float64(s.capacity-1); full {
		fmt.Printf("bench: sticky-cache-needed-min-%s %d executions\n", suffix, s.capacity)
		fmt.Printf("scale: sticky cache needed at %d live subscriptions: more than its capacity %d: the cache was full (%.0f forced evictions; each evicted workflow replays its whole history at its next task)\n", active, s.capacity, evictions)
	} else {
		fmt.Printf("bench: sticky-cache-needed-%s %.0f executions (baseline sticky-cache-capacity %d executions, ratio %.2f)\n", suffix, s.peak, s.capacity, s.peak/float64(s.capacity))
		fmt.Printf("scale: sticky cache needed at %d live subscriptions: %.0f executions, the most it held, below its capacity %d (none evicted for room; %.0f dropped after a failed workflow task, finished runs not counted)\n", active, s.peak, s.capacity, evictions)
	}
}

// printAfterStorm writes the cache's misses, evictions and workflow tasks during the re-read
// storm.
func (s *stickyCache) printAfterStorm(n int) {
	if !s.scraped || s.atActive == nil {
		return
	}
	d := func(k string) float64 { return s.cur[k] - s.atActive[k] }
	fmt.Printf("bench: sticky-cache-misses-during-reread-%d %.0f tasks (baseline sticky-cache-hits-during-reread-%d %.0f tasks, ratio %s)\n",
		n, d(metricCacheMiss), n, d(metricCacheHit), ratioText(d(metricCacheMiss), d(metricCacheHit)))
	fmt.Printf("bench: sticky-cache-forced-evictions-during-reread-%d %.0f executions\n", n,
		max(0, d(metricCacheEvictions)-d(metricRunsFinished)))
	fmt.Printf("bench: workflow-tasks-during-reread-%d %.0f tasks\n", n, d(metricTasks))
	fmt.Printf("bench: sticky-cache-peak-after-reread-%d %.0f executions (baseline sticky-cache-capacity %d executions, ratio %.2f)\n",
		n, s.peak, s.capacity, s.peak/float64(s.capacity))
}

// forcedEvictions is the SDK's forced-eviction count in m without the finished runs it also
// counts (metricRunsFinished): the executions dropped from the cache while still running.
func forcedEvictions(m map[string]float64) float64 {
	return max(0, m[metricCacheEvictions]-m[metricRunsFinished])
}

func ratioText(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}
