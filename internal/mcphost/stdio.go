package mcphost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// stdioTransport starts a stdio source as a child process (stderr passed through; on Linux
// killed with its parent) in a sealed environment (issue 14 item 4, see childEnvironment)
// and in the source's working directory (Connection.Cwd; the worker's when empty). Each line
// the child writes is bounded to MessageLimit of the source's --max-bytes before the go-sdk
// buffers it (issue 14 item 6): a longer line ends the session with "message too large (limit
// N bytes)" (childTransport).
func stdioTransport(_ context.Context, src ledger.Source) (mcp.Transport, error) {
	if len(src.Command) == 0 {
		return nil, fmt.Errorf("source %q has no command", src.Name)
	}
	env, err := childEnvironment(src, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(src.Command[0], src.Command[1:]...)
	cmd.Env = env
	if cwd := src.Connection.Cwd; cwd != "" {
		if fi, err := os.Stat(cwd); err != nil {
			return nil, fmt.Errorf("source %q: --cwd %s: %w", src.Name, cwd, err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("source %q: --cwd %s is not a directory", src.Name, cwd)
		}
		cmd.Dir = cwd
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childProcAttr()
	return &childTransport{cmd: cmd, terminate: childTerminateDuration, limit: MessageLimit(src.Connection.EffectiveMaxBytes())}, nil
}

// childTerminateDuration is how long closing a stdio session waits for the child to exit
// after its stdin is closed, and again after SIGTERM, before killing it.
const childTerminateDuration = 2 * time.Second

// childTransport runs a stdio source's child the way the go-sdk's CommandTransport does
// (newline-delimited JSON over its stdin and stdout; closing closes stdin, then waits for the
// exit, then SIGTERM, then SIGKILL, terminate apart), but reads its stdout through a
// lineLimitReader of limit bytes per line, with the go-sdk's own (16 MiB, read-ahead
// counting) line cap off.
type childTransport struct {
	cmd       *exec.Cmd
	terminate time.Duration
	limit     int64
}

// Connect starts the child and returns the connection over its pipes.
func (t *childTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := t.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, err
	}
	conn := &mcp.IOTransport{
		Reader:        &lineLimitReader{r: stdout, limit: t.limit},
		Writer:        &childStdin{stdin: stdin, cmd: t.cmd, terminate: t.terminate},
		MaxLineLength: -1,
	}
	return conn.Connect(ctx)
}

// childStdin is the child's stdin; closing it ends the child as CommandTransport does.
type childStdin struct {
	stdin     io.WriteCloser
	cmd       *exec.Cmd
	terminate time.Duration
}

func (w *childStdin) Write(p []byte) (int, error) { return w.stdin.Write(p) }

// Close closes the child's stdin and waits for it to exit; after terminate it sends SIGTERM,
// after terminate again SIGKILL. It returns the child's exit error.
func (w *childStdin) Close() error {
	if err := w.stdin.Close(); err != nil {
		return fmt.Errorf("closing stdin: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- w.cmd.Wait() }()
	wait := func() (error, bool) {
		select {
		case err := <-exited:
			return err, true
		case <-time.After(w.terminate):
			return nil, false
		}
	}
	if err, ok := wait(); ok {
		return err
	}
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err == nil {
		if err, ok := wait(); ok {
			return err
		}
	}
	if err := w.cmd.Process.Kill(); err != nil {
		return err
	}
	if err, ok := wait(); ok {
		return err
	}
	return errors.New("unresponsive stdio child")
}

// inheritedEnv are the worker variables every stdio child gets, when the worker has them:
// the TypeScript SDK's default list (getDefaultEnvironment: HOME, LOGNAME, PATH, SHELL, TERM,
// USER) plus locale, temporary directory and time zone, which programs need to behave as
// they do in a shell. Nothing here carries a credential.
var inheritedEnv = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LANGUAGE", "TMPDIR", "TZ"}

// ErrReservedEnv is the class of a stdio source that asks for one of the worker's own
// configuration variables (DATABASE_URL, TEMPORAL_*, MCPSYNC_*) by --env NAME=env:VAR.
var ErrReservedEnv = errors.New("a stdio child may not receive the worker's configuration variables (DATABASE_URL, TEMPORAL_*, MCPSYNC_*)")

// reservedWorkerVar reports whether name is one of the worker's own configuration variables
// (ledger.IsReservedWorkerVar); `source add` refuses them too, this catches older rows.
func reservedWorkerVar(name string) bool { return ledger.IsReservedWorkerVar(name) }

// childEnvironment is the whole environment of src's child (issue 14 item 4): the inherited
// minimum (inheritedEnv and LC_*; values starting with "()", exported shell functions, are
// skipped as the TypeScript SDK does), then what the source declares in Connection.Env — a
// literal value, or the worker's variable FromEnv read now, at this start. A declared FromEnv
// variable the worker does not have is an error naming the variable (never a value), as is
// one naming a reserved worker variable. Nothing else of the worker's environment passes:
// not DATABASE_URL, not TEMPORAL_*, not MCPSYNC_*, not any variable the source did not
// declare. A declared name replaces an inherited one. The result is sorted by name.
func childEnvironment(src ledger.Source, lookup func(string) (string, bool)) ([]string, error) {
	vars := map[string]string{}
	inherit := func(name string) {
		if v, ok := lookup(name); ok && !strings.HasPrefix(v, "()") {
			vars[name] = v
		}
	}
	for _, name := range inheritedEnv {
		inherit(name)
	}
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "LC_") {
			inherit(name)
		}
	}
	for _, v := range src.Connection.Env {
		if v.FromEnv == "" {
			vars[v.Name] = v.Value
			continue
		}
		if reservedWorkerVar(v.FromEnv) {
			return nil, fmt.Errorf("source %q: --env %s=env:%s: %w", src.Name, v.Name, v.FromEnv, ErrReservedEnv)
		}
		val, ok := lookup(v.FromEnv)
		if !ok {
			return nil, fmt.Errorf("source %q: --env %s=env:%s: the worker has no environment variable %s", src.Name, v.Name, v.FromEnv, v.FromEnv)
		}
		vars[v.Name] = val
	}
	env := make([]string, 0, len(vars))
	for name, val := range vars {
		env = append(env, name+"="+val)
	}
	sort.Strings(env)
	return env, nil
}
