//go:build linux

package parentwatch

import (
	"fmt"
	"syscall"
)

// setDeathSignal asks the kernel to send sig to this process when its parent exits.
func setDeathSignal(sig syscall.Signal) error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(sig), 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_PDEATHSIG): %w", errno)
	}
	return nil
}
