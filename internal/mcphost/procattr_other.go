//go:build !linux

package mcphost

import "syscall"

// childProcAttr returns the process attributes of a stdio source's child process. Outside
// Linux there is no parent-death signal: the child is stopped when its session closes (the
// go-sdk's CommandTransport terminates it), but not if this process is killed.
func childProcAttr() *syscall.SysProcAttr { return nil }
