// Package parentwatch ends a process's work when the process that started it goes away.
//
// `make run` starts mcpsync-dev and mcpsync-worker in their own sessions (so that a Ctrl-C
// reaches only the script, which then stops them in order). If the script itself is killed —
// SIGKILL, SIGHUP from a closed terminal — nothing would stop them, and they would keep
// holding their ports. Context watches the parent in two independent ways:
//
//   - on Linux, the kernel's parent-death signal (prctl PR_SET_PDEATHSIG): SIGTERM is
//     delivered the moment the parent exits, which the programs already handle as "stop";
//   - everywhere, a poll of the parent: the watched process no longer exists, or this
//     process was re-parented (its parent PID changed).
//
// Either one cancels the returned context with cause ErrParentGone (or delivers SIGTERM); the
// program then stops as it would on Ctrl-C.
package parentwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// ErrParentGone is the cause of a context cancelled because the watched process went away.
var ErrParentGone = errors.New("parent process exited")

// DefaultInterval is how often the portable watch polls the parent.
const DefaultInterval = 500 * time.Millisecond

// Options selects how the parent is watched.
type Options struct {
	// Interval between two polls of the parent; zero means DefaultInterval.
	Interval time.Duration
	// NoDeathSignal leaves the kernel's parent-death signal unset (Linux), so that only the
	// portable poll watches the parent.
	NoDeathSignal bool
}

// Context returns a context derived from ctx that is cancelled, with cause ErrParentGone,
// once the process pid has exited or this process has been re-parented away from it; on
// Linux, when pid is this process's parent, it also asks the kernel to send this process
// SIGTERM when the parent exits. A pid of zero or less watches nothing: the context only ends
// with ctx or the returned cancel function. The context is already cancelled if pid is gone
// when Context is called.
func Context(ctx context.Context, pid int, opts Options) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := func() { cancel(context.Canceled) }
	if pid <= 0 {
		return ctx, stop
	}
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	ppid := os.Getppid()
	if pid == ppid && !opts.NoDeathSignal {
		// Should the kernel refuse, the poll below still watches the parent.
		_ = setDeathSignal(syscall.SIGTERM)
	}
	gone := func() bool {
		return (pid == ppid && os.Getppid() != ppid) || !alive(pid)
	}
	if gone() { // it may have exited before the death signal was set
		cancel(fmt.Errorf("process %d: %w", pid, ErrParentGone))
		return ctx, stop
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if gone() {
					cancel(fmt.Errorf("process %d: %w", pid, ErrParentGone))
					return
				}
			}
		}
	}()
	return ctx, stop
}
