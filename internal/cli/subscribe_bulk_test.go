package cli_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// tookRE is the duration a bulk summary ends with.
var tookRE = regexp.MustCompile(` \(\d+\.\ds\)$`)

// Bulk subscribe against a real stack (Temporal test server, Postgres ledger, worker, MCP
// server over streamable HTTP): many URIs from arguments, a file or standard input become
// ACTIVE in one call with one summary line; a URI the server does not have is one failure
// line and exit 1 without holding back the others; a malformed line refuses the whole list
// before anything is started (a window of one starts each after the previous is ACTIVE); the
// one-URI form prints what it always printed.
func TestBulkSubscribe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stack, err := localstack.Start(ctx, localstack.Options{AdminURL: pgtest.AdminURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Stop()
	srv := chaosmcp.New(chaosmcp.Options{Name: "bulk", Version: "1.0.0"})
	defer srv.Close()
	for i := 1; i <= 9; i++ {
		srv.Set("demo://items/"+string(rune('0'+i)), "body "+string(rune('0'+i)), "text/plain")
	}
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := stack.MustCLI(ctx, "source", "add", "bulk", "--url", h.URL); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good.txt", "# items\ndemo://items/3\n\n  demo://items/4  \ndemo://items/3\n")
	bad := file("bad.txt", "demo://items/7\nnot-a-uri\n")
	empty := file("empty.txt", "# nothing\n\n")

	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantCode   cli.ExitCode
		wantOut    string // tookRE removed
		wantErr    string
		wantActive []string // URIs ACTIVE in the ledger afterwards
		wantAbsent []string // URIs with no subscription afterwards
	}{{
		name:       "arguments",
		args:       []string{"subscribe", "bulk", "demo://items/1", "demo://items/2", "--wait", "60s"},
		wantOut:    "bulk default: 2 URIs, 2 ACTIVE, 0 failed\n",
		wantActive: []string{"demo://items/1", "demo://items/2"},
	}, {
		name:       "file with comments, blanks and a repeat",
		args:       []string{"subscribe", "bulk", "--uris-file", good, "--wait", "60s", "--parallel", "2", "--window", "1"},
		wantOut:    "bulk default: 2 URIs, 2 ACTIVE, 0 failed, 1 repeated URIs skipped\n",
		wantActive: []string{"demo://items/3", "demo://items/4"},
	}, {
		name:       "standard input and an argument",
		args:       []string{"subscribe", "bulk", "demo://items/5", "--uris-file", "-", "--wait", "60s"},
		stdin:      "demo://items/6\n",
		wantOut:    "bulk default: 2 URIs, 2 ACTIVE, 0 failed\n",
		wantActive: []string{"demo://items/5", "demo://items/6"},
	}, {
		name:       "again: idempotent",
		args:       []string{"subscribe", "bulk", "demo://items/1", "demo://items/2", "demo://items/5", "--wait", "60s"},
		wantOut:    "bulk default: 3 URIs, 3 ACTIVE, 0 failed\n",
		wantActive: []string{"demo://items/1", "demo://items/2", "demo://items/5"},
	}, {
		name:       "malformed line: nothing started",
		args:       []string{"subscribe", "bulk", "--uris-file", bad, "--wait", "60s"},
		wantCode:   cli.ExitUsage,
		wantErr:    `mcpsync subscribe: 1 of 2 URIs are malformed, nothing was subscribed: line 2 of "` + bad + `": uri "not-a-uri": no scheme` + "\n",
		wantAbsent: []string{"demo://items/7"},
	}, {
		name:     "empty file",
		args:     []string{"subscribe", "bulk", "--uris-file", empty},
		wantCode: cli.ExitUsage,
		wantErr:  `mcpsync subscribe: no URIs given: "` + empty + `" holds none` + "\n",
	}, {
		name:       "unknown source",
		args:       []string{"subscribe", "nosuch", "demo://items/8", "demo://items/9"},
		wantCode:   cli.ExitNotFound,
		wantErr:    "mcpsync subscribe: unknown source \"nosuch\" (see mcpsync source list)\n",
		wantAbsent: []string{"demo://items/8", "demo://items/9"},
	}, {
		name:       "a URI the server lacks fails alone",
		args:       []string{"subscribe", "bulk", "demo://items/8", "demo://missing/1", "--wait", "60s"},
		wantCode:   cli.ExitFailure,
		wantOut:    "bulk default: 2 URIs, 1 ACTIVE, 1 failed\n",
		wantErr:    "<one failure line for demo://missing/1>",
		wantActive: []string{"demo://items/8"},
	}, {
		name:       "one URI: the original output",
		args:       []string{"subscribe", "bulk", "demo://items/9", "--wait", "60s"},
		wantOut:    "bulk demo://items/9 default: ACTIVE (generation 1, session 1, workflow <id>)\n",
		wantActive: []string{"demo://items/9"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer cli.SetStdin(strings.NewReader(tt.stdin))()
			out, errOut, code := stack.CLI(ctx, tt.args...)
			if out != "" {
				out = tookRE.ReplaceAllString(strings.TrimSuffix(out, "\n"), "") + "\n"
				out = regexp.MustCompile(`workflow [^ )]+\)`).ReplaceAllString(out, "workflow <id>)")
			}
			if strings.HasPrefix(tt.wantErr, "<one failure line") {
				lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
				if len(lines) != 2 || !strings.HasPrefix(lines[0], "mcpsync subscribe: demo://missing/1 (argument 3): ") ||
					lines[1] != "mcpsync subscribe: 1 of 2 URIs failed (listed above)" {
					t.Errorf("stderr %q: want one failure line for demo://missing/1 and the error line", errOut)
				}
				t.Logf("failure line: %s", lines[0])
				errOut = tt.wantErr
			}
			type result struct {
				Code     cli.ExitCode
				Out, Err string
			}
			if diff := cmp.Diff(result{tt.wantCode, tt.wantOut, tt.wantErr}, result{cli.ExitCode(code), out, errOut}); diff != "" {
				t.Errorf("mcpsync %s (-want +got):\n%s", strings.Join(tt.args, " "), diff)
			}
			for _, u := range tt.wantActive {
				sub, err := stack.Store.SubscriptionByKey(ctx, "default", "bulk", u)
				if err != nil || sub.State != mcpsync.StateActive {
					t.Errorf("%s: %v %v, want ACTIVE", u, sub.State, err)
				}
			}
			for _, u := range tt.wantAbsent {
				if _, err := stack.Store.SubscriptionByKey(ctx, "default", "bulk", u); !errors.Is(err, ledger.ErrNotFound) {
					t.Errorf("%s: subscription lookup %v, want none", u, err)
				}
			}
		})
	}
}
