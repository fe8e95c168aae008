package pgcluster

import "syscall"

// postmasterProcAttr returns the process attributes of the postmaster: its own process
// group (so a terminal's Ctrl-C reaches only this process, which then stops the server
// itself), and SIGINT (a fast shutdown) from the kernel when this process dies, so the
// cluster dies with its owner.
func postmasterProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT}
}
