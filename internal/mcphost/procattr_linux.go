package mcphost

import "syscall"

// childProcAttr returns the process attributes of a stdio source's child process: on Linux
// the kernel kills it with SIGKILL when this process dies, so a crashed worker leaves no
// orphaned MCP servers behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
