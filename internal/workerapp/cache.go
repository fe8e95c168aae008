package workerapp

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.temporal.io/sdk/worker"
)

// EnvWorkflowCacheSize names the environment variable that sets how many workflow executions
// a worker process keeps cached (sticky) between their workflow tasks.
const EnvWorkflowCacheSize = "MCPSYNC_WORKFLOW_CACHE_SIZE"

// DefaultWorkflowCacheSize is the sticky cache size unless EnvWorkflowCacheSize says
// otherwise. Every live subscription is one long-running workflow that wakes up for each
// notification and backstop timer; once the cache holds fewer executions than there are live
// workflows, each wake-up of an evicted one replays its whole history and evicts another
// (issue 16 item 4). The SDK's default of 10,000 is thus one short of 10,000 subscriptions
// plus their source workflow; 20,000 leaves room for that and a continue-as-new overlap.
// An idle cached subscription costs a few tens of KiB of the worker's memory (bench/scale
// prints the worker's RSS at N subscriptions).
const DefaultWorkflowCacheSize = 20000

// WorkflowCacheSize returns the sticky cache size getenv configures: EnvWorkflowCacheSize
// if set (a positive integer), else DefaultWorkflowCacheSize.
func WorkflowCacheSize(getenv func(string) string) (int, error) {
	v := strings.TrimSpace(getenv(EnvWorkflowCacheSize))
	if v == "" {
		return DefaultWorkflowCacheSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want a positive number of workflow executions", EnvWorkflowCacheSize, v)
	}
	return n, nil
}

// The cache size is one setting of the whole process, fixed before the first worker starts,
// so it is set when the package is initialised; a malformed value leaves the default in place
// and is reported by Start (cacheSizeErr).
var cacheSizeErr = func() error {
	n, err := WorkflowCacheSize(os.Getenv)
	if err != nil {
		n = DefaultWorkflowCacheSize
	}
	worker.SetStickyWorkflowCacheSize(n)
	return err
}()
