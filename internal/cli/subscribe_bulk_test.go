package cli_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/contract"
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
	items := map[string]string{}
	for i := 1; i <= 9; i++ {
		items["demo://items/"+string(rune('0'+i))] = "body " + string(rune('0'+i))
	}
	stack := bulkStack(ctx, t, "bulk", items)
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

// A bulk subscribe from a process that runs no worker (as the CLI is) hands its starts to the
// worker in batches, so that every subscription workflow is started eagerly (its first event
// says the server accepted eager execution: its first workflow task went straight to the
// worker). When no worker runs the batch workflow (an older worker: here a type nobody
// registered, with a short timeout), or the start window is above contract.EagerWindowMax, the
// URIs are started from the CLI, not eagerly, and still all become ACTIVE (issue 16 item 4).
// A one-URI subscribe is never eager, even from a client a worker polls through.
func TestBulkSubscribeStartsEagerly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const n = 24
	uri := func(i int) string { return fmt.Sprintf("demo://items/%02d", i) }
	items := map[string]string{}
	for i := range n + 1 {
		items[uri(i)] = fmt.Sprintf("body %d", i)
	}
	stack := bulkStack(ctx, t, "eager", items)
	// The CLI's own client: no worker polls through it, so none of its starts can be eager.
	cliClient, err := client.Dial(client.Options{HostPort: stack.TemporalAddress, Namespace: stack.Namespace,
		Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer cliClient.Close()
	run := func(uris []string, flags ...string) (string, string, cli.ExitCode) {
		var out, errb strings.Builder
		args := append(append([]string{"subscribe", "eager", "--wait", "60s", "--parallel", "4"}, flags...), uris...)
		code := cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb, Store: stack.Store, Temporal: cliClient,
			Config: config.Env{Namespace: stack.Namespace, DatabaseURL: stack.DatabaseURL}}, args)
		return out.String(), errb.String(), code
	}
	eager := func(u string) bool {
		wfID := contract.SubscriptionWorkflowID("default", "eager", u)
		it := stack.Client.GetWorkflowHistory(ctx, wfID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("history of %s: %v", u, err)
		}
		return ev.GetWorkflowExecutionStartedEventAttributes().GetEagerExecutionAccepted()
	}
	tests := []struct {
		name      string
		from, to  int
		flags     []string
		batchType string // "" the real one
		wantEager bool
	}{
		{name: "through the worker: eager", from: 0, to: n / 3, wantEager: true},
		{name: "no worker runs the batch: from the CLI", from: n / 3, to: 2 * n / 3, batchType: "NoSuchBatchWorkflow"},
		// A window above contract.EagerWindowMax does not bound the eager first tasks enough.
		{name: "window above the eager bound: from the CLI", from: 2 * n / 3, to: n,
			flags: []string{"--window", strconv.Itoa(contract.EagerWindowMax + 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.batchType != "" {
				defer cli.SetStartBatch(tt.batchType, 3*time.Second)()
			}
			var uris []string
			for i := tt.from; i < tt.to; i++ {
				uris = append(uris, uri(i))
			}
			out, errOut, code := run(uris, tt.flags...)
			want := fmt.Sprintf("eager default: %d URIs, %d ACTIVE, 0 failed\n", len(uris), len(uris))
			if got := tookRE.ReplaceAllString(strings.TrimSuffix(out, "\n"), "") + "\n"; code != 0 || got != want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 0, %q", code, out, errOut, want)
			}
			var got []string
			for _, u := range uris {
				sub, err := stack.Store.SubscriptionByKey(ctx, "default", "eager", u)
				if err != nil || sub.State != mcpsync.StateActive || sub.LastAcceptedOrdinal == 0 {
					t.Errorf("%s: %v (ordinal %d) %v, want ACTIVE with a version", u, sub.State, sub.LastAcceptedOrdinal, err)
				}
				if eager(u) != tt.wantEager {
					got = append(got, u)
				}
			}
			if len(got) > 0 {
				t.Errorf("started eagerly, want %v: not so for %v", tt.wantEager, got)
			}
		})
	}
	// One URI through the worker's own client (as the gateway starts): a plain start, since
	// nothing would bound a burst of such eager starts.
	if _, err := stack.MustCLI(ctx, "subscribe", "eager", uri(n), "--wait", "60s"); err != nil {
		t.Fatal(err)
	}
	if eager(uri(n)) {
		t.Errorf("a one-URI subscribe through the worker's client started eagerly")
	}
}

// bulkStack starts a stack (stopped when the test ends) with source name: an MCP server over
// streamable HTTP holding items (URI → text body).
func bulkStack(ctx context.Context, t *testing.T, name string, items map[string]string) *localstack.Stack {
	t.Helper()
	stack, err := localstack.Start(ctx, localstack.Options{AdminURL: pgtest.AdminURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Stop)
	srv := chaosmcp.New(chaosmcp.Options{Name: name, Version: "1.0.0"})
	t.Cleanup(func() { srv.Close() })
	for u, body := range items {
		srv.Set(u, body, "text/plain")
	}
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if _, err := stack.MustCLI(ctx, "source", "add", name, "--url", h.URL); err != nil {
		t.Fatal(err)
	}
	return stack
}
