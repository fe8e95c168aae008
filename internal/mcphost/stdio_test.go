package mcphost_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/envmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// envServerArg makes the test binary, run as a child, serve envmcp (a server that reports its
// environment and working directory) over stdin and stdout. It is handled in init, before
// TestMain, so that nothing else of the test binary runs in the child.
const envServerArg = "mcphost-test-env-server"

func init() {
	if len(os.Args) > 1 && os.Args[1] == envServerArg {
		if err := envmcp.ServeStdio(context.Background()); err != nil {
			os.Stderr.WriteString("env server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// inheritedNames are the worker variables a stdio child gets without declaring them.
var inheritedNames = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LANGUAGE", "TMPDIR", "TZ"}

// readChild starts src through the real host path (mcphost.DefaultTransport and a go-sdk
// client) and returns what the child reports as its environment and working directory.
func readChild(t *testing.T, src ledger.Source) (map[string]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := mcphost.DefaultTransport(ctx, src)
	if err != nil {
		t.Fatalf("DefaultTransport: %v", err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-env-test", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()
	read := func(uri string) string {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("read %s: %v", uri, err)
		}
		return res.Contents[0].Text
	}
	return envmcp.ParseEnv(read(envmcp.EnvURI)), read(envmcp.CwdURI)
}

// A stdio child sees only the minimal inherited environment plus what the source declares
// (issue 14 item 4): never DATABASE_URL, TEMPORAL_*, MCPSYNC_* or any undeclared variable of
// the worker; --env K=V literally, --env K=env:VAR from the worker at start; --cwd honoured.
func TestStdioChildEnvironmentIsSealed(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u:secret@h/db")
	t.Setenv("TEMPORAL_ADDRESS", "127.0.0.1:7233")
	t.Setenv("MCPSYNC_SOMETHING", "worker-only")
	t.Setenv("FOO", "foo-of-the-worker")
	t.Setenv("GITHUB_TOKEN", "ghp_worker_secret")
	t.Setenv("LC_CTYPE", "C.UTF-8")
	if os.Getenv("HOME") == "" {
		t.Setenv("HOME", "/nonexistent-home")
	}
	cwd := t.TempDir()
	src := ledger.Source{SourceSpec: ledger.SourceSpec{
		Name: "env", Transport: ledger.TransportStdio, Command: []string{os.Args[0], envServerArg},
		Connection: ledger.Connection{
			Env: []ledger.EnvVar{
				{Name: "GREETING", Value: "hello world"},
				{Name: "FOO_FROM_WORKER", FromEnv: "FOO"},
				{Name: "TZ", Value: "UTC"}, // a declared name replaces an inherited one
			},
			Cwd: cwd,
		},
	}}
	env, dir := readChild(t, src)

	want := map[string]string{"GREETING": "hello world", "FOO_FROM_WORKER": "foo-of-the-worker", "LC_CTYPE": "C.UTF-8"}
	for _, name := range inheritedNames {
		if v, ok := os.LookupEnv(name); ok {
			want[name] = v
		}
	}
	want["TZ"] = "UTC"
	for _, kv := range os.Environ() {
		if name, v, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "LC_") {
			want[name] = v
		}
	}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("child environment (-want +got):\n%s", diff)
	}
	for _, name := range []string{"DATABASE_URL", "TEMPORAL_ADDRESS", "MCPSYNC_SOMETHING", "FOO", "GITHUB_TOKEN"} {
		if v, ok := env[name]; ok {
			t.Errorf("child sees the worker's %s=%s", name, v)
		}
	}
	if env["PATH"] == "" || env["HOME"] == "" {
		t.Errorf("child lacks PATH or HOME: %v", env)
	}
	wantDir, _ := filepath.EvalSymlinks(cwd)
	if gotDir, _ := filepath.EvalSymlinks(dir); gotDir != wantDir {
		t.Errorf("child working directory %q, want %q (--cwd)", dir, cwd)
	}

	// Without --cwd the child runs in the worker's working directory.
	src.Connection.Cwd = ""
	_, dir = readChild(t, src)
	if wd, _ := os.Getwd(); dir != wd {
		t.Errorf("child working directory %q, want the worker's %q", dir, wd)
	}
}

// A declared variable the worker cannot supply is a clear session error naming the variable,
// never its value; so is one asking for the worker's own configuration, and a bad --cwd.
func TestStdioChildEnvironmentErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u:secret@h/db")
	t.Setenv("TEMPORAL_API_KEY", "temporal-secret")
	os.Unsetenv("MCPSYNC_TEST_SURELY_UNSET")
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		conn     ledger.Connection
		want     []string
		reserved bool
	}{
		{"missing variable", ledger.Connection{Env: []ledger.EnvVar{{Name: "TOKEN", FromEnv: "SURELY_UNSET_VAR_14"}}},
			[]string{`source "env"`, "SURELY_UNSET_VAR_14", "TOKEN"}, false},
		{"database url", ledger.Connection{Env: []ledger.EnvVar{{Name: "DB", FromEnv: "DATABASE_URL"}}},
			[]string{"DATABASE_URL"}, true},
		{"temporal", ledger.Connection{Env: []ledger.EnvVar{{Name: "K", FromEnv: "TEMPORAL_API_KEY"}}},
			[]string{"TEMPORAL_API_KEY"}, true},
		{"mcpsync", ledger.Connection{Env: []ledger.EnvVar{{Name: "K", FromEnv: "MCPSYNC_TEST_DATABASE_URL"}}},
			[]string{"MCPSYNC_TEST_DATABASE_URL"}, true},
		{"missing cwd", ledger.Connection{Cwd: "/nonexistent/dir/14"}, []string{"/nonexistent/dir/14"}, false},
		{"cwd not a directory", ledger.Connection{Cwd: notDir}, []string{notDir, "not a directory"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := ledger.Source{SourceSpec: ledger.SourceSpec{Name: "env", Transport: ledger.TransportStdio, Command: []string{os.Args[0], envServerArg}, Connection: tc.conn}}
			_, err := mcphost.DefaultTransport(context.Background(), src)
			if err == nil {
				t.Fatal("DefaultTransport succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			for _, secret := range []string{"secret", "temporal-secret"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows a value", err)
				}
			}
			if got := errors.Is(err, mcphost.ErrReservedEnv); got != tc.reserved {
				t.Errorf("errors.Is(err, ErrReservedEnv) = %v, want %v", got, tc.reserved)
			}
		})
	}
}
