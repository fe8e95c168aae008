//go:build !unix

package parentwatch

import "os"

// alive reports whether process pid exists; on systems without kill(pid, 0), whether it can
// still be opened.
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	p.Release()
	return true
}
