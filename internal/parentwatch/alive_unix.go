//go:build unix

package parentwatch

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// alive reports whether process pid exists and has not exited: kill(pid, 0) succeeds or is
// refused for permission (it exists), and on Linux it is not a zombie (exited, not yet
// reaped).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	return !zombie(pid)
}

// zombie reports whether /proc says pid has exited but was not reaped; false where there is
// no /proc.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may contain any byte.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
