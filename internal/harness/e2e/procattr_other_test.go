//go:build !linux

package e2e_test

import "syscall"

// workerProcAttr returns the process attributes of a worker child process. Outside Linux
// there is no parent-death signal: the test's cleanup kills the worker, but an aborted test
// binary leaves it running.
func workerProcAttr() *syscall.SysProcAttr { return nil }
