package parentwatch_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/parentwatch"
)

// The test binary plays three roles: the test, a parent that starts a child and waits for it,
// and the child that watches its parent.
const roleEnv = "PARENTWATCH_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "parent":
		os.Exit(parent())
	case "child":
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// parent starts the child (its stdout shared with ours) and waits for it, until killed.
func parent() int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"=child", "PARENTWATCH_TEST_PARENT="+strconv.Itoa(os.Getpid()))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own session, as scripts/run.sh starts mcpsync-dev and mcpsync-worker.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child watches its parent as mcpsync-dev and mcpsync-worker do (SIGTERM or the watch ends
// the context), reports its PID, and says why it stopped.
func child() int {
	pid, _ := strconv.Atoi(os.Getenv("PARENTWATCH_TEST_PARENT"))
	opts := parentwatch.Options{Interval: time.Hour} // only the death signal can end it
	if os.Getenv("PARENTWATCH_TEST_POLL") != "" {
		opts = parentwatch.Options{Interval: 20 * time.Millisecond, NoDeathSignal: true}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := parentwatch.Context(ctx, pid, opts)
	defer cancel()
	fmt.Printf("child %d\n", os.Getpid())
	<-ctx.Done()
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, parentwatch.ErrParentGone):
		fmt.Println("child stops: parent gone")
	default:
		fmt.Printf("child stops: signal (%v)\n", cause)
	}
	return 0
}

// A parent that is SIGKILLed takes its child with it: through the kernel's death signal where
// there is one, and through the portable poll alone.
func TestChildExitsWhenParentIsKilled(t *testing.T) {
	for _, tc := range []struct {
		name string
		poll bool
		want string
	}{
		{"death signal", false, "child stops: signal"},
		{"poll", true, "child stops: parent gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.poll && !hasDeathSignal() {
				t.Skip("no parent-death signal on this system")
			}
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			p := exec.Command(exe)
			p.Env = append(os.Environ(), roleEnv+"=parent")
			if tc.poll {
				p.Env = append(p.Env, "PARENTWATCH_TEST_POLL=1")
			}
			p.Stdout, p.Stderr = w, os.Stderr
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close() // the parent and the child hold the only write ends now
			if err := r.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
				t.Fatal(err)
			}
			out := bufio.NewReader(r)
			first, err := out.ReadString('\n')
			if err != nil {
				p.Process.Kill()
				t.Fatalf("reading the child's PID: %v (got %q)", err, first)
			}
			var childPID int
			if _, err := fmt.Sscanf(first, "child %d", &childPID); err != nil {
				t.Fatalf("first line %q: %v", first, err)
			}
			t.Cleanup(func() { syscall.Kill(childPID, syscall.SIGKILL) })

			if err := p.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			p.Wait()
			// The child closes its end of the pipe when it exits.
			rest, err := io.ReadAll(out)
			if err != nil {
				t.Fatalf("waiting for the child to stop: %v (child said %q)", err, rest)
			}
			if !strings.HasPrefix(string(rest), tc.want) {
				t.Errorf("child said %q, want %q", rest, tc.want)
			}
			deadline := time.Now().Add(30 * time.Second)
			for parentwatch.Alive(childPID) {
				if time.Now().After(deadline) {
					t.Fatalf("child %d still running 30 s after its parent was killed", childPID)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// hasDeathSignal reports whether the kernel offers a parent-death signal.
func hasDeathSignal() bool { return runtime.GOOS == "linux" }

// A parent already gone when the watch starts cancels the context at once; no PID watches
// nothing.
func TestContextStates(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no true(1):", err)
	}
	ctx, cancel := parentwatch.Context(context.Background(), cmd.Process.Pid, parentwatch.Options{})
	defer cancel()
	if !errors.Is(context.Cause(ctx), parentwatch.ErrParentGone) {
		t.Errorf("watching exited process %d: cause %v, want ErrParentGone", cmd.Process.Pid, context.Cause(ctx))
	}
	none, cancelNone := parentwatch.Context(context.Background(), 0, parentwatch.Options{})
	if none.Err() != nil {
		t.Errorf("pid 0: context ended: %v", none.Err())
	}
	cancelNone()
	if !errors.Is(none.Err(), context.Canceled) {
		t.Errorf("pid 0 after cancel: %v, want Canceled", none.Err())
	}
	if !parentwatch.Alive(os.Getpid()) {
		t.Error("this process reported not alive")
	}
}
