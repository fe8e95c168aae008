package cpustat_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
)

func TestParseMachine(t *testing.T) {
	tests := []struct {
		name string
		line string
		want cpustat.MachineTime
		ok   bool
	}{
		{
			name: "with guest fields",
			line: "cpu  113012 5 36868 62507 971 3 2405 7 100 0",
			want: cpustat.MachineTime{
				Busy: (113012 + 5 + 36868 + 3 + 2405 + 7) * 10 * time.Millisecond,
				// guest time is already in user: not added again.
				Total:  (113012 + 5 + 36868 + 62507 + 971 + 3 + 2405 + 7) * 10 * time.Millisecond,
				Kernel: (36868 + 3 + 2405) * 10 * time.Millisecond,
			},
			ok: true,
		},
		{
			name: "without guest fields", line: "cpu 100 0 50 850 0 0 0 0",
			want: cpustat.MachineTime{Busy: 1500 * time.Millisecond, Total: 10 * time.Second, Kernel: 500 * time.Millisecond}, ok: true,
		},
		{name: "a single CPU's line", line: "cpu0 100 0 50 850 0 0 0 0"},
		{name: "truncated", line: "cpu 100 0 50 850"},
		{name: "not a number", line: "cpu 100 0 fifty 850 0 0 0 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := cpustat.ParseMachine(tt.line)
			if diff := cmp.Diff([]any{tt.want, tt.ok}, []any{got, ok}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The real /proc/stat: the machine's busy time grows at least by the CPU this process burns,
// its total time by about the wall time on each CPU, and its kernel time by at least part of
// the time this process spends entering the kernel.
func TestMachine(t *testing.T) {
	m0, ok := cpustat.Machine()
	if !ok {
		t.Fatal("/proc/stat unreadable")
	}
	wall := time.Now()
	burn(300 * time.Millisecond)
	m1, _ := cpustat.Machine()
	if d := m1.Busy - m0.Busy; d < 280*time.Millisecond {
		t.Errorf("busy grew by %v after burning 300ms", d)
	}
	// Every CPU's time passes whether busy or not (ticks of 10 ms; allow two per CPU), on the
	// CPUs this process may run on (all of them unless taskset restricts it).
	cpus := time.Duration(runtime.NumCPU())
	if d, el := m1.Total-m0.Total, time.Since(wall); d < cpus*(el-20*time.Millisecond)/2 || m1.Busy > m1.Total {
		t.Errorf("total grew by %v in %v on %d CPUs (busy %v of %v)", d, el, cpus, m1.Busy, m1.Total)
	}
	if m1.Kernel > m1.Busy || m1.Kernel < m0.Kernel {
		t.Errorf("kernel time %v → %v, busy %v", m0.Kernel, m1.Kernel, m1.Busy)
	}
	// System calls until this process has spent 150 ms in the kernel (by its own rusage): the
	// machine's kernel time grows by as much, less a tick per CPU at each end.
	stime := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Stime.Nano())
	}
	s0, deadline := stime(), time.Now().Add(10*time.Second)
	for stime()-s0 < 150*time.Millisecond && time.Now().Before(deadline) {
		for range 1000 {
			syscall.Getppid()
		}
	}
	m2, _ := cpustat.Machine()
	if d, own := m2.Kernel-m1.Kernel, stime()-s0; own < 150*time.Millisecond || d < own-2*cpus*10*time.Millisecond {
		t.Errorf("machine kernel time grew by %v while this process spent %v in the kernel", d, own)
	}
}

// The CPUs a process may run on are added up from their own lines of /proc/stat: one of two
// is that CPU's time, all of them the aggregate's (a benchmark under `taskset -c 0` read the
// whole machine before, half of it idle, and printed a one-core run as half busy).
func TestMachineOf(t *testing.T) {
	const stat = `cpu  300 0 150 1550 0 0 0 0 0 0
cpu0 100 0 50 850 0 0 0 0 0 0
cpu1 200 0 100 700 0 0 0 0 0 0
intr 12345 0 0
ctxt 678
`
	tests := []struct {
		name    string
		stat    string
		allowed []int
		want    cpustat.MachineTime
		ok      bool
	}{
		{"CPU 0 only", stat, []int{0}, cpustat.MachineTime{Busy: 1500 * time.Millisecond, Total: 10 * time.Second, Kernel: 500 * time.Millisecond}, true},
		{"CPU 1 only", stat, []int{1}, cpustat.MachineTime{Busy: 3 * time.Second, Total: 10 * time.Second, Kernel: time.Second}, true},
		{"both: the aggregate", stat, []int{0, 1}, cpustat.MachineTime{Busy: 4500 * time.Millisecond, Total: 20 * time.Second, Kernel: 1500 * time.Millisecond}, true},
		{"none of them", stat, []int{7}, cpustat.MachineTime{}, false},
		{"an allowed line broken", strings.Replace(stat, "cpu1 200", "cpu1 x", 1), []int{0, 1}, cpustat.MachineTime{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := cpustat.MachineOf(tt.stat, func(n int) bool { return slices.Contains(tt.allowed, n) })
			if diff := cmp.Diff([]any{tt.want, tt.ok}, []any{got, ok}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	agg, _ := cpustat.ParseMachine(strings.SplitN(stat, "\n", 2)[0])
	if all, _ := cpustat.MachineOf(stat, func(int) bool { return true }); all != agg {
		t.Errorf("every CPU's lines add up to %+v, the aggregate line says %+v", all, agg)
	}
}

// A live child that used CPU: Descendants finds it, Comm names it, and TreeTime counts its CPU
// with this process's.
func TestTree(t *testing.T) {
	// The test binary under a name of its own, to tell it apart by Comm.
	bin := filepath.Join(t.TempDir(), "cpustat-child")
	if err := os.Symlink(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSTAT_BURN=1", "CPUSTAT_STAY=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// The child writes a line once it has burned its CPU, then stays until killed.
	if _, err := stdout.Read(make([]byte, 1)); err != nil {
		t.Fatalf("child: %v", err)
	}
	all := cpustat.All()
	if got := cpustat.Descendants(all, os.Getpid()); !slices.Contains(got, cmd.Process.Pid) {
		t.Errorf("Descendants(self) = %v, want it to hold the child %d", got, cmd.Process.Pid)
	}
	if got := cpustat.Descendants(all, cmd.Process.Pid); len(got) != 0 {
		t.Errorf("Descendants(child) = %v, want none", got)
	}
	if got := cpustat.Comm(cmd.Process.Pid); got != "cpustat-child" {
		t.Errorf("Comm(child) = %q", got)
	}
	self := all[os.Getpid()].Own + all[os.Getpid()].Reaped
	if d := cpustat.TreeTime(all, os.Getpid()) - self; d < 230*time.Millisecond {
		t.Errorf("TreeTime(self) exceeds this process's own by %v; the child burned 250ms", d)
	}
	if got := cpustat.Comm(1 << 30); got != "" {
		t.Errorf("Comm(no such process) = %q", got)
	}
}

func TestSampler(t *testing.T) {
	var n atomic.Int64
	s := cpustat.Sample(5*time.Millisecond, func() int64 { return n.Add(1) })
	first := s.At(time.Time{})
	if first != 1 {
		t.Errorf("the first reading is %d, want 1 (taken at once)", first)
	}
	// waitReadings waits until at least k readings were taken.
	waitReadings := func(k int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for n.Load() < k {
			if time.Now().After(deadline) {
				t.Fatalf("%d readings after 10s, want %d", n.Load(), k)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitReadings(3)
	mid := time.Now()
	// Every reading above atMid was read after mid; the first one recorded at or after mid is
	// at most atMid+1, so two more make it lie before the last.
	atMid := n.Load()
	waitReadings(atMid + 3)
	s.Stop()
	last := n.Load()
	// Stop waited for the reader to end: no reading may follow, however long one waits.
	time.Sleep(20 * time.Millisecond)
	if n.Load() != last {
		t.Errorf("read %d times after Stop", n.Load()-last)
	}
	got := s.At(mid)
	if got <= first || got >= last {
		t.Errorf("At(mid) = %d, want a reading between the first (%d) and the last (%d)", got, first, last)
	}
	if got := s.At(time.Now()); got != last {
		t.Errorf("At(after Stop) = %d, want the last reading %d", got, last)
	}
	s.Stop() // a second Stop is harmless
}
