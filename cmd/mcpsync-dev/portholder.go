package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// holder is a process that listens on a TCP port.
type holder struct {
	PID  int
	Name string
	// Owner is the mcpsync process that started it (a leftover mcpsync-dev's PostgreSQL),
	// if any: stopping the owner stops both.
	OwnerPID  int
	OwnerName string
}

// portHolder finds the process listening on TCP port: from /proc on Linux, else through
// lsof(8) if installed. ok is false if neither can tell (another user's process, no lsof).
func portHolder(port int) (h holder, ok bool) {
	pid := procPortHolder(port)
	if pid == 0 {
		pid = lsofPortHolder(port)
	}
	if pid == 0 {
		return holder{}, false
	}
	h = holder{PID: pid, Name: processName(pid)}
	if ppid := parentPID(pid); ppid > 1 {
		if name := processName(ppid); strings.HasPrefix(name, "mcpsync") {
			h.OwnerPID, h.OwnerName = ppid, name
		}
	}
	return h, true
}

// procPortHolder reads /proc/net/tcp{,6} for a listening socket on port and /proc/*/fd for
// the process that has it open; 0 if none is found.
func procPortHolder(port int) int {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		file, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, found := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); found && err == nil && int(p) == port {
				inodes["socket:["+fields[9]+"]"] = true
			}
		}
		file.Close()
	}
	if len(inodes) == 0 {
		return 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// lsofPortHolder asks lsof(8) for the process listening on port; 0 if there is no lsof or
// no answer.
func lsofPortHolder(port int) int {
	path, err := exec.LookPath("lsof")
	if err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-nP", "-t", "-iTCP:"+strconv.Itoa(port), "-sTCP:LISTEN").Output()
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	pid, _ := strconv.Atoi(first)
	return pid
}

// processName is the command name of pid, or "" if unknown.
func processName(pid int) string {
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil {
		return strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ps", "-o", "comm=", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		return ""
	}
	return filepath.Base(strings.TrimSpace(string(out)))
}

// parentPID is pid's parent process, or 0 if unknown.
func parentPID(pid int) int {
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 1 {
				ppid, _ := strconv.Atoi(f[1])
				return ppid
			}
		}
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ps", "-o", "ppid=", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		return 0
	}
	ppid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return ppid
}
