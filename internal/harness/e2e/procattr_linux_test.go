package e2e_test

import "syscall"

// workerProcAttr returns the process attributes of a worker child process: on Linux the
// kernel kills it with SIGKILL when the test binary dies, so an aborted test leaves no worker
// behind.
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
