// Package gcpolicy holds the garbage collector's setting of mcpsync's long-running processes
// (mcpsync-worker, mcpsync-dev, and the benchmark processes that play their part): one value,
// chosen by measurement (issue 16), that the environment's GOGC overrides.
package gcpolicy

import (
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
)

// Percent is the collector's target (GOGC) of the long-running processes when the environment
// sets none: between two collections the heap may grow to three times what the last one left
// live, instead of twice. Measured on the throughput bench (1,000 subscriptions, 150 offered
// updates/s, the make run default, 2 cores; GOGC=100 and 200 alternating): CPU per accepted
// update fell from 4.0 to 3.45 ms in the worker and from 10.9 to 9.4 ms in the embedded
// Temporal server's process (means of five and four runs), PostgreSQL's did not move; 400
// gave nothing more. At 10,000 subscriptions (the scale bench) the worker and mcpsync-dev each
// peaked at 0.92–1.11 GiB resident, against 0.66–0.78 GiB at 100 (the goal: under 2 GiB).
const Percent = 200

// Setting is the collector's target a process runs with, and where it came from.
type Setting struct {
	// Percent is the GOGC value in force; -1 when the collector is off (GOGC=off).
	Percent int
	// FromEnv reports that the environment's GOGC chose it (Apply left it as it was).
	FromEnv bool
}

// String is the setting as a log shows it, e.g. "200 (mcpsync default)" or "off (GOGC)".
func (s Setting) String() string {
	v := strconv.Itoa(s.Percent)
	if s.Percent < 0 {
		v = "off"
	}
	if s.FromEnv {
		return v + " (GOGC)"
	}
	return v + " (mcpsync default)"
}

// Apply sets the collector's target to Percent unless the environment sets GOGC (the runtime
// has applied that at start: Apply leaves it in force), and returns the setting in force. Call
// it once, at the start of main: the target is the whole process's.
func Apply() Setting {
	if _, ok := os.LookupEnv("GOGC"); ok {
		return Setting{Percent: Current(), FromEnv: true}
	}
	debug.SetGCPercent(Percent)
	return Setting{Percent: Percent}
}

// Current is the collector's target in force in this process (-1: off), as the runtime
// reports it.
func Current() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	// The runtime reports "off" (-1) as the uint64 of -1.
	if s[0].Value.Kind() != metrics.KindUint64 || s[0].Value.Uint64() > math.MaxInt32 {
		return -1
	}
	return int(s[0].Value.Uint64())
}
