//go:build !linux

package parentwatch

import "syscall"

// setDeathSignal does nothing: only Linux has a parent-death signal; the poll watches alone.
func setDeathSignal(syscall.Signal) error { return nil }
