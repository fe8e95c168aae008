package machine_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/bench/machine"
)

// TestMeasure runs every probe briefly on this machine: each figure is a positive, finite
// measurement, and the durable writes' file is gone afterwards.
func TestMeasure(t *testing.T) {
	dir := t.TempDir()
	f, err := machine.Measure(context.Background(), machine.Options{Duration: 90 * time.Millisecond, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if f.Cores != runtime.NumCPU() {
		t.Errorf("Cores = %d, want %d", f.Cores, runtime.NumCPU())
	}
	if f.SHA256 <= 0 || math.IsInf(f.SHA256, 0) || math.IsNaN(f.SHA256) {
		t.Errorf("SHA256 = %v MB/s, want a positive finite rate", f.SHA256)
	}
	for name, d := range map[string]time.Duration{"Syscall": f.Syscall, "LoopbackRTT": f.LoopbackRTT, "Fdatasync": f.Fdatasync} {
		if d <= 0 {
			t.Errorf("%s = %v, want a positive duration", name, d)
		}
	}
	// A round trip through the kernel's TCP stack and back to another goroutine enters the
	// kernel several times.
	if f.LoopbackRTT <= f.Syscall {
		t.Errorf("LoopbackRTT %v <= Syscall %v", f.LoopbackRTT, f.Syscall)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) > 0 {
		t.Errorf("files left in the probe's directory: %v", left)
	}
}

// TestMeasureBadDir: a directory that does not exist fails the durable-write probe with an
// error naming it.
func TestMeasureBadDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := machine.Measure(context.Background(), machine.Options{Duration: 10 * time.Millisecond, Dir: dir})
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Measure in a missing directory: %v, want an error naming %s", err, dir)
	}
}

// TestMeasureCancelled: an ended context stops the probes with its error.
func TestMeasureCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := machine.Measure(ctx, machine.Options{Duration: time.Second, Dir: t.TempDir()}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Measure with a cancelled context: %v, want %v", err, context.Canceled)
	}
}

// TestReport: the figures as bench lines, in the units the README names.
func TestReport(t *testing.T) {
	var b strings.Builder
	machine.Report(&b, machine.Figures{Cores: 2, SHA256: 1633.7, Syscall: 1054 * time.Nanosecond,
		LoopbackRTT: 19100 * time.Nanosecond, Fdatasync: 1250 * time.Microsecond})
	want := `bench: machine-cores 2 cores
bench: machine-sha256 1634 MB/s
bench: machine-syscall 1054 ns
bench: machine-loopback-rtt 19.1 us
bench: machine-fdatasync 1250 us
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("Report (-want +got):\n%s", diff)
	}
}
