package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// runWithArgs runs mcpsync-dev's run with args and returns its exit code and stderr.
func runWithArgs(t *testing.T, args ...string) (int, string) {
	t.Helper()
	oldArgs, oldStderr := os.Args, os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Args, os.Stderr = append([]string{"mcpsync-dev"}, args...), w
	code := run()
	os.Args, os.Stderr = oldArgs, oldStderr
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// A bad shard flag is one line naming the flag and exit code 2, before anything starts.
func TestShardFlagsRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"negative shards", []string{"--temporal-history-shards=-4"}, "--temporal-history-shards -4"},
		{"too many shards", []string{"--temporal-history-shards", "4096"}, "want 1 to 1024"},
		{"negative shard IO", []string{"--temporal-shard-io-concurrency", "-1"}, "--temporal-shard-io-concurrency -1"},
		{"shards not a number", []string{"--temporal-history-shards", "four"}, "invalid value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runWithArgs(t, append(tc.args, "--data-dir", t.TempDir())...)
			if code != 2 {
				t.Errorf("exit code %d, want 2 (stderr %q)", code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q lacks %q", stderr, tc.want)
			}
		})
	}
}
