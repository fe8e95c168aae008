package cli

import (
	"io"
	"time"
)

// SetStdin makes `--uris-file -` read r until the returned restore is called.
func SetStdin(r io.Reader) (restore func()) {
	old := stdin
	stdin = r
	return func() { stdin = old }
}

// SetStartBatch makes bulk subscribes start their batches as workflow type name with timeout
// (a type no worker knows tests the fallback) until the returned restore is called.
func SetStartBatch(name string, timeout time.Duration) (restore func()) {
	oldName, oldTimeout := startBatchWorkflow, startBatchTimeout
	startBatchWorkflow, startBatchTimeout = name, timeout
	return func() { startBatchWorkflow, startBatchTimeout = oldName, oldTimeout }
}
