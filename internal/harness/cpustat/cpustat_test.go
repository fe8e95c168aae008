package cpustat_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		line string
		want cpustat.Stat
		ok   bool
	}{
		{
			name: "plain",
			line: "4242 (postgres) S 4200 4242 4242 0 -1 4194560 900 0 0 0 250 50 1200 300 20 0 1 0 100 0 0",
			want: cpustat.Stat{PPID: 4200, Own: 3 * time.Second, Reaped: 15 * time.Second},
			ok:   true,
		},
		{
			name: "command with spaces and parentheses",
			line: "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 100 0 0",
			want: cpustat.Stat{PPID: 1, Own: 100 * time.Millisecond},
			ok:   true,
		},
		{name: "truncated", line: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 7"},
		{name: "no command", line: "7 x R 1"},
		{name: "not a number", line: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 seven 3 0 0 20 0 1 0 100 0 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := cpustat.Parse(tt.line)
			if ok != tt.ok {
				t.Fatalf("ok %v, want %v", ok, tt.ok)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// burn uses CPU for at least d of this goroutine's time.
func burn(d time.Duration) {
	end := cpustat.Self() + d
	x := 0
	for cpustat.Self() < end {
		for i := range 1_000_000 {
			x += i
		}
	}
	_ = x
}

// The real /proc: this process's entry names its parent and grows with the CPU it uses, as
// getrusage does; a child that used CPU and was waited for shows in Reaped; a process that is
// gone has no entry.
func TestReadProc(t *testing.T) {
	before, ok := cpustat.Read(os.Getpid())
	if !ok {
		t.Fatal("no entry for this process")
	}
	if before.PPID != os.Getppid() {
		t.Errorf("parent %d, want %d", before.PPID, os.Getppid())
	}
	self := cpustat.Self()
	burn(300 * time.Millisecond)
	if d := cpustat.Self() - self; d < 300*time.Millisecond {
		t.Errorf("getrusage grew by %v after burning 300ms", d)
	}
	after, _ := cpustat.Read(os.Getpid())
	// /proc counts in ticks of 10 ms; allow two.
	if d := after.Own - before.Own; d < 280*time.Millisecond {
		t.Errorf("/proc grew by %v after burning 300ms", d)
	}

	// A child that burns CPU: this test binary again, in the helper below.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSTAT_BURN=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	reaped, _ := cpustat.Read(os.Getpid())
	if d := reaped.Reaped - after.Reaped; d < used-20*time.Millisecond || used < 200*time.Millisecond {
		t.Errorf("reaped children's CPU grew by %v; the child used %v", d, used)
	}
	if _, ok := cpustat.Read(cmd.Process.Pid); ok {
		t.Errorf("the reaped child %d still has an entry", cmd.Process.Pid)
	}
	if all := cpustat.All(); all[os.Getpid()].PPID != os.Getppid() {
		t.Errorf("All()[self] = %+v", all[os.Getpid()])
	}
}

// TestMain runs as a test's child when CPUSTAT_BURN is set: it burns 250 ms of CPU and
// exits, or with CPUSTAT_STAY set writes a line and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv("CPUSTAT_BURN") == "1" {
		burn(250 * time.Millisecond)
		if os.Getenv("CPUSTAT_STAY") == "1" {
			fmt.Println("burned")
			time.Sleep(time.Hour)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
