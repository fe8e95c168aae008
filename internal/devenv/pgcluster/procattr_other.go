//go:build !linux

package pgcluster

import "syscall"

// postmasterProcAttr returns the process attributes of the postmaster: its own process
// group (so a terminal's Ctrl-C reaches only this process, which then stops the server
// itself). Outside Linux there is no parent-death signal: a server whose owner is killed
// keeps running until it is stopped.
func postmasterProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
