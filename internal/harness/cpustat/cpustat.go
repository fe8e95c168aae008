// Package cpustat reads the CPU time of processes on Linux, for the benchmarks' figures of
// CPU per unit of work: this process's own through getrusage, any process's from
// /proc/<pid>/stat.
package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const userHZ = 100

// Self is the user + system CPU time this process has used so far; zero if it cannot be read.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Stat is what /proc/<pid>/stat says of one process's CPU time.
type Stat struct {
	// PPID is the parent's process ID.
	PPID int
	// Own is the user + system CPU time of the process itself (its threads, live or ended).
	Own time.Duration
	// Reaped is the user + system CPU time of its children that ended and were waited for
	// (with theirs, recursively): the CPU of an exited PostgreSQL backend, say, shows here on
	// the postmaster.
	Reaped time.Duration
}

// Read reads pid's Stat; ok is false when the process is gone or its entry unreadable.
func Read(pid int) (s Stat, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, false
	}
	return parse(string(b))
}

// All reads the Stat of every process, by process ID.
func All() map[int]Stat {
	out := map[int]Stat{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, ok := Read(pid); ok {
			out[pid] = s
		}
	}
	return out
}

// parse reads a /proc/<pid>/stat line. The command (field 2) may hold spaces and parentheses,
// so the fields are counted from its last closing parenthesis: state (3), ppid (4), …, utime
// (14), stime (15), cutime (16), cstime (17).
func parse(line string) (Stat, bool) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return Stat{}, false
	}
	f := strings.Fields(line[i+1:])
	if len(f) < 15 {
		return Stat{}, false
	}
	n := make([]int64, 5)
	for j, k := range []int{1, 11, 12, 13, 14} {
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return Stat{}, false
		}
		n[j] = v
	}
	tick := func(t int64) time.Duration { return time.Duration(t) * time.Second / userHZ }
	return Stat{PPID: int(n[0]), Own: tick(n[1] + n[2]), Reaped: tick(n[3] + n[4])}, true
}
