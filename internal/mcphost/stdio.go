package mcphost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// stdioTransport starts a stdio source as a child process (stderr passed through; on Linux
// killed with its parent) in a sealed environment (issue 14 item 4, see childEnvironment)
// and in the source's working directory (Connection.Cwd; the worker's when empty).
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
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
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
