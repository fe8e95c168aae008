package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/gcpolicy"
)

// The mcpsync-worker binary runs its garbage collector at gcpolicy.Percent unless GOGC is set,
// and then at GOGC's value (issue 16): the runtime's own figure in the worker's /metrics
// (go_gc_gogc_percent) and the worker's log line say which.
func TestWorkerGCTarget(t *testing.T) {
	s := newStack(t, withoutWorker())
	for _, tc := range []struct {
		name string
		gogc string // "": unset
		want int
		log  string
	}{
		{"default", "", gcpolicy.Percent, fmt.Sprintf("%d (mcpsync default)", gcpolicy.Percent)},
		{"GOGC", "50", 50, "50 (GOGC)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "worker.log")
			gogcEnv := "GOGC" // unset
			if tc.gogc != "" {
				gogcEnv = "GOGC=" + tc.gogc
			}
			w := s.startWorkerBinary(logPath, []string{"--log-level", "info"}, gogcEnv,
				"MCPSYNC_METRICS_ADDR=127.0.0.1:0", "MCPSYNC_GATEWAY_ADDR=off")
			defer w.kill()

			metricsURL := regexp.MustCompile(`metrics served\t\{"url": "(http://127\.0\.0\.1:[0-9]+/metrics)"`)
			gogc := regexp.MustCompile(`garbage collector\t\{"gogc": "([^"]+)"`)
			var url, logged string
			eventually(t, 30*time.Second, "the worker's metrics address and collector target in its log", func() (bool, string) {
				b, err := os.ReadFile(logPath)
				if err != nil {
					return false, err.Error()
				}
				if m := metricsURL.FindSubmatch(b); m != nil {
					url = string(m[1])
				}
				if m := gogc.FindSubmatch(b); m != nil {
					logged = string(m[1])
				}
				return url != "" && logged != "", string(b)
			})
			if logged != tc.log {
				t.Errorf("logged collector target %q, want %q", logged, tc.log)
			}
			got, ok := sample(scrapeMetrics(t, url), "go_gc_gogc_percent", nil)
			if !ok || got != float64(tc.want) {
				t.Errorf("go_gc_gogc_percent = %v (present %v), want %d", got, ok, tc.want)
			}
		})
	}
}
