package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Descendants lists the processes below pid in all (a snapshot from All), children before
// their own children.
func Descendants(all map[int]Stat, pid int) []int {
	children := map[int][]int{}
	for p, st := range all {
		children[st.PPID] = append(children[st.PPID], p)
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			out = append(out, c)
			walk(c)
		}
	}
	walk(pid)
	return out
}

// TreeTime is the CPU time of pid and every process below it in all, each with its reaped
// children's (the processes that ended and were waited for).
func TreeTime(all map[int]Stat, pid int) time.Duration {
	total := all[pid].Own + all[pid].Reaped
	for _, p := range Descendants(all, pid) {
		total += all[p].Own + all[p].Reaped
	}
	return total
}

// Comm is pid's command name (/proc/<pid>/comm, at most 15 bytes); empty when the process is
// gone.
func Comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// MachineTime is CPU time so far, every CPU's read (see Machine) summed.
type MachineTime struct {
	// Busy is the time in user, nice, system, irq, softirq and steal.
	Busy time.Duration
	// Total adds idle and iowait to Busy.
	Total time.Duration
	// Kernel is the part of Busy spent in the kernel: system, irq and softirq.
	Kernel time.Duration
}

// Machine reads the CPU time of the CPUs this process may run on (its affinity, as `taskset`
// restricts it and its children) from their lines of /proc/stat: the whole machine's when
// nothing restricts it, so that a benchmark pinned to one core reports that core's busy share.
// ok is false when it cannot be read.
func Machine() (t MachineTime, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineTime{}, false
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		line, _, _ := strings.Cut(string(b), "\n")
		return parseMachine(line)
	}
	return machineOf(string(b), set.IsSet)
}

// machineOf adds up the lines of the single CPUs ("cpuN …") of a /proc/stat text whose N
// allowed accepts; with every CPU allowed that is the aggregate line, up to rounding. ok is
// false when no such line could be read.
func machineOf(stat string, allowed func(cpu int) bool) (t MachineTime, ok bool) {
	for _, line := range strings.Split(stat, "\n") {
		name, _, _ := strings.Cut(line, " ")
		n, err := strconv.Atoi(strings.TrimPrefix(name, "cpu"))
		if !strings.HasPrefix(name, "cpu") || err != nil || !allowed(n) {
			continue
		}
		c, cok := parseTicks(line)
		if !cok {
			return MachineTime{}, false
		}
		t.Busy, t.Total, t.Kernel, ok = t.Busy+c.Busy, t.Total+c.Total, t.Kernel+c.Kernel, true
	}
	return t, ok
}

// parseMachine reads the aggregate line of /proc/stat: "cpu user nice system idle iowait irq
// softirq steal [guest guest_nice]" in USER_HZ ticks.
func parseMachine(line string) (MachineTime, bool) {
	if f := strings.Fields(line); len(f) == 0 || f[0] != "cpu" {
		return MachineTime{}, false
	}
	return parseTicks(line)
}

// parseTicks reads the times of a line of /proc/stat, the aggregate or one CPU's. guest and
// guest_nice are already counted in user and nice.
func parseTicks(line string) (MachineTime, bool) {
	f := strings.Fields(line)
	if len(f) < 9 {
		return MachineTime{}, false
	}
	var t [8]int64
	for i := range t {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return MachineTime{}, false
		}
		t[i] = v
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
	idle := t[3] + t[4]
	b := t[0] + t[1] + t[2] + t[5] + t[6] + t[7]
	return MachineTime{Busy: tick(b), Total: tick(b + idle), Kernel: tick(t[2] + t[5] + t[6])}, true
}

// Sampler reads a value every interval in the background, so that the CPU used between two
// instants known only afterwards (a phase whose start and end another package measured) can
// be taken from the readings nearest them.
type Sampler[T any] struct {
	mu       sync.Mutex
	at       []time.Time
	vals     []T
	stop     chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}
}

// Sample starts a Sampler that calls read at once and then every interval until Stop.
func Sample[T any](interval time.Duration, read func() T) *Sampler[T] {
	s := &Sampler[T]{stop: make(chan struct{}), stopped: make(chan struct{})}
	s.add(read())
	go func() {
		defer close(s.stopped)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.add(read())
			}
		}
	}()
	return s
}

func (s *Sampler[T]) add(v T) {
	now := time.Now()
	s.mu.Lock()
	s.at = append(s.at, now)
	s.vals = append(s.vals, v)
	s.mu.Unlock()
}

// At is the first reading taken at or after t, or the last one if none was (a phase that
// ended after the sampler stopped is counted up to its last reading).
func (s *Sampler[T]) At(t time.Time) T {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, at := range s.at {
		if !at.Before(t) {
			return s.vals[i]
		}
	}
	return s.vals[len(s.vals)-1]
}

// Stop stops the readings and waits for the background reader; At still answers.
func (s *Sampler[T]) Stop() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.stopped
}
