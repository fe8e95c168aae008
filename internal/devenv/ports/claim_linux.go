//go:build linux

package ports

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// claimPath is the machine's claim file: byte N of it, write-locked, is port N claimed by the
// process that holds the lock.
var claimPath = filepath.Join(os.TempDir(), "mcpsync-ports.lock")

// claims is this process's descriptor of the claim file (nil: it could not be opened). It is
// never closed: closing any descriptor of the file drops every lock the process holds on it.
var claims struct {
	once sync.Once
	f    *os.File
}

// claim claims port for this process from the other processes of this machine that pick
// ports with this package, until this process exits: a record lock on byte port of the claim
// file, which the kernel drops when the process ends, however it ends. It reports false when
// another live process holds the claim; when the claim file cannot be opened or locked at all
// it claims nothing and reports true (each process then only keeps its own picks apart).
func claim(port int) bool {
	claims.once.Do(func() {
		if f, err := os.OpenFile(claimPath, os.O_RDWR|os.O_CREATE, 0o666); err == nil {
			claims.f = f
		}
	})
	if claims.f == nil {
		return true
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(port), Len: 1}
	err := syscall.FcntlFlock(claims.f.Fd(), syscall.F_SETLK, &lk)
	return err == nil || !(errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES))
}
