package machine

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data (not its timestamps), as PostgreSQL's default wal_sync_method.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
