package cli_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// signalRecorder is a Temporal client that records signals; any other call panics (the
// embedded interface is nil), so a test sees a command contact Temporal for anything else.
type signalRecorder struct {
	client.Client
	mu      sync.Mutex
	signals []string // "workflowID signalName"
}

// DescribeTaskQueue answers that a worker polled just now.
func (r *signalRecorder) DescribeTaskQueue(context.Context, string, enums.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error) {
	return &workflowservice.DescribeTaskQueueResponse{Pollers: []*taskqueue.PollerInfo{{LastAccessTime: timestamppb.Now()}}}, nil
}

func (r *signalRecorder) SignalWorkflow(_ context.Context, wfID, _, name string, _ any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, wfID+" "+name)
	return nil
}

// runOn runs mcpsync against the ledger st and the Temporal client tc (nil: none reachable).
func runOn(t *testing.T, st *ledger.Store, tc client.Client, args ...string) (stdout, stderr string, code cli.ExitCode) {
	t.Helper()
	addr := closedAddr(t)
	var out, errb bytes.Buffer
	code = cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Store: st, Temporal: tc, Config: config.Env{
		TemporalAddress: addr, Namespace: "default", DatabaseURL: "postgres://mcpsync@" + addr + "/mcpsync?sslmode=disable&connect_timeout=2",
	}}, args)
	return out.String(), errb.String(), code
}

// Every flag of source add is carried over by source update (or given): a flag missing from
// the groups would be silently reset by an update.
func TestSourceUpdateFlagGroups(t *testing.T) {
	http, stdio, neutral := cli.SourceFlagGroups()
	grouped := slices.Concat(http, stdio, neutral)
	slices.Sort(grouped)
	names := cli.SourceFlagNames()
	slices.Sort(names)
	if diff := cmp.Diff(names, grouped); diff != "" {
		t.Errorf("flags of newSourceFlags against the groups source update carries (-flags +groups):\n%s", diff)
	}
}

// Issue 14 item 5: `source update` replaces only what is given; a repeatable flag given
// replaces its list; switching transport keeps only the settings every source has. Each case's
// result equals the source `source add` makes of want.
func TestSourceUpdateKeepsWhatIsNotGiven(t *testing.T) {
	httpFull := []string{"--url", "http://a.example/mcp", "--header", "X-A: 1", "--header-env", "X-Key=KEY",
		"--bearer-env", "TOKEN", "--backstop", "60s", "--poll", "7s", "--subject", "s1", "--max-bytes", "1000"}
	oauth := []string{"--url", "https://a.example/mcp", "--oauth", "client_credentials", "--oauth-client-id", "c",
		"--oauth-client-key-file", "/etc/key.pem", "--oauth-scopes", "a b", "--ca-file", "/etc/ca.pem",
		"--cert-file", "/etc/c.pem", "--key-file", "/etc/k.pem"}
	code := []string{"--url", "https://a.example/mcp", "--oauth", "authorization_code", "--oauth-client-secret-file", "/etc/s",
		"--oauth-client-id", "c", "--oauth-token-file", "/var/tok", "--oauth-client-metadata-url", "https://client.example/meta.json"}
	stdio := []string{"--stdio", "srv --flag 'two words'", "--env", "K=V", "--env", "H=env:HOME", "--cwd", "/tmp", "--backstop", "9s"}
	tests := []struct {
		name         string
		add, update  []string
		want         []string // what source add would make of the result
		wantVersion  int64
		wantUnchange bool
	}{
		{name: "new URL keeps the rest", add: httpFull, update: []string{"--url", "http://b.example/mcp"},
			want: append(slices.Clone(httpFull[2:]), "--url", "http://b.example/mcp"), wantVersion: 1},
		{name: "a period only", add: httpFull, update: []string{"--backstop", "90s"},
			want: append(slices.Clone(httpFull), "--backstop", "90s"), wantVersion: 1},
		{name: "a repeatable flag replaces its list", add: httpFull, update: []string{"--header", "X-B: 2"},
			want: []string{"--url", "http://a.example/mcp", "--header", "X-B: 2", "--header-env", "X-Key=KEY",
				"--bearer-env", "TOKEN", "--backstop", "60s", "--poll", "7s", "--subject", "s1", "--max-bytes", "1000"}, wantVersion: 1},
		{name: "an empty value clears", add: httpFull, update: []string{"--bearer-env", ""},
			want: []string{"--url", "http://a.example/mcp", "--header", "X-A: 1", "--header-env", "X-Key=KEY",
				"--backstop", "60s", "--poll", "7s", "--subject", "s1", "--max-bytes", "1000"}, wantVersion: 1},
		{name: "http to stdio drops the http settings", add: httpFull, update: []string{"--stdio", "srv"},
			want: []string{"--stdio", "srv", "--backstop", "60s", "--poll", "7s", "--subject", "s1", "--max-bytes", "1000"}, wantVersion: 1},
		{name: "stdio to http drops env and cwd", add: stdio, update: []string{"--url", "http://c.example/", "--bearer-file", "/run/tok"},
			want: []string{"--url", "http://c.example/", "--bearer-file", "/run/tok", "--backstop", "9s"}, wantVersion: 1},
		{name: "stdio keeps its command and env", add: stdio, update: []string{"--poll", "3s"},
			want: append(slices.Clone(stdio), "--poll", "3s"), wantVersion: 1},
		{name: "oauth and TLS kept", add: oauth, update: []string{"--subject", "s2"},
			want: append(slices.Clone(oauth), "--subject", "s2"), wantVersion: 1},
		{name: "authorization code kept", add: code, update: []string{"--url", "https://b.example/mcp"},
			want: append(slices.Clone(code[2:]), "--url", "https://b.example/mcp"), wantVersion: 1},
		{name: "the same definition", add: httpFull, update: []string{"--backstop", "60s"},
			want: httpFull, wantVersion: 0, wantUnchange: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := ledger.New(pgtest.NewPool(t))
			ctx := context.Background()
			if _, errOut, code := runOn(t, st, nil, append([]string{"source", "add", "a"}, tt.add...)...); code != 0 {
				t.Fatalf("add: exit %d %s", code, errOut)
			}
			out, errOut, code := runOn(t, st, nil, append([]string{"source", "update", "a"}, tt.update...)...)
			if code != 0 {
				t.Fatalf("update: exit %d %s", code, errOut)
			}
			if tt.wantUnchange != strings.Contains(out, "unchanged") {
				t.Errorf("update said %q", out)
			}
			if _, errOut, code := runOn(t, st, nil, append([]string{"source", "add", "want"}, tt.want...)...); code != 0 {
				t.Fatalf("add want: exit %d %s", code, errOut)
			}
			got, err := st.SourceByName(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			want, err := st.SourceByName(ctx, "want")
			if err != nil {
				t.Fatal(err)
			}
			got.Name, want.Name = "", ""
			if diff := cmp.Diff(want.SourceSpec, got.SourceSpec); diff != "" {
				t.Errorf("definition after update (-want +got):\n%s", diff)
			}
			if got.DefinitionVersion != tt.wantVersion {
				t.Errorf("definition version %d, want %d", got.DefinitionVersion, tt.wantVersion)
			}
		})
	}
}

// Bad updates that need the stored source: one line, the right exit code, nothing written.
func TestSourceUpdateRefusals(t *testing.T) {
	st := ledger.New(pgtest.NewPool(t))
	for _, args := range [][]string{{"source", "add", "s", "--stdio", "srv"}, {"source", "add", "h", "--url", "http://h.example/"}} {
		if _, errOut, code := runOn(t, st, nil, args...); code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, errOut)
		}
	}
	tests := []struct {
		args []string
		code cli.ExitCode
		want string
	}{
		{[]string{"source", "update", "s", "--bearer-env", "TOKEN"}, cli.ExitUsage,
			"mcpsync source update: --bearer-env applies to an http source and s is stdio: give --url too to switch its transport"},
		{[]string{"source", "update", "h", "--env", "K=V"}, cli.ExitUsage,
			"mcpsync source update: --env applies to a stdio source and h is http: give --stdio too to switch its transport"},
		{[]string{"source", "update", "nope", "--poll", "5s"}, cli.ExitNotFound,
			`mcpsync source update: unknown source "nope" (see mcpsync source list)`},
	}
	for _, tt := range tests {
		_, errOut, code := runOn(t, st, nil, tt.args...)
		if code != tt.code || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %s: exit %d %q, want %d %q", strings.Join(tt.args, " "), code, errOut, tt.code, tt.want)
		}
	}
	for _, name := range []string{"s", "h"} {
		if src, _ := st.SourceByName(context.Background(), name); src.DefinitionVersion != 0 {
			t.Errorf("source %s was changed by a refused update (version %d)", name, src.DefinitionVersion)
		}
	}
}

// Issue 14 item 5: `source remove` tells every open subscription's workflow to pass the close
// fence; --purge is refused (one line, exit 1, how many are not CLOSED) until every one is
// CLOSED; nothing starts on a removed source; `source add` brings it back.
func TestSourceRemove(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	st := ledger.New(pool)
	if _, errOut, code := runOn(t, st, nil, "source", "add", "a", "--stdio", "srv"); code != 0 {
		t.Fatalf("add: exit %d %s", code, errOut)
	}
	src, err := st.SourceByName(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "default", SourceID: src.ID, URI: "demo://x", ServerURI: "demo://x", WorkflowID: "wf-x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutBlob(ctx, []byte("body"), "text/plain"); err != nil {
		t.Fatal(err)
	}

	rec := &signalRecorder{}
	_, errOut, code := runOn(t, st, rec, "source", "remove", "a", "--purge", "--wait", "0")
	want := "mcpsync source remove: content of source a not purged: 1 subscription(s) not CLOSED yet; run mcpsync source remove a --purge again once they are\n"
	if code != cli.ExitFailure || errOut != want {
		t.Errorf("remove --purge with an open subscription: exit %d %q, want 1 %q", code, errOut, want)
	}
	if diff := cmp.Diff([]string{"wf-x " + contract.SignalUnsubscribe}, rec.signals); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	_, errOut, code = runOn(t, st, rec, "source", "remove", "a", "--wait", "300ms")
	if want := "mcpsync source remove: source a is removed, but 1 subscription(s) were not CLOSED after 300ms\n"; code != cli.ExitFailure || errOut != want {
		t.Errorf("remove with a subscription that does not close: exit %d %q, want 1 %q", code, errOut, want)
	}

	// Nothing starts on a removed source (and Temporal is not asked: rec would panic).
	for _, args := range [][]string{{"subscribe", "a", "demo://y"}, {"scan", "a", "--wait"}, {"source", "update", "a", "--poll", "5s"}} {
		_, errOut, code := runOn(t, st, rec, args...)
		if code != cli.ExitNotFound || !strings.Contains(errOut, "source a was removed at ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("mcpsync %s on a removed source: exit %d %q, want 3 and 'was removed'", strings.Join(args, " "), code, errOut)
		}
	}

	// The workflow closes the subscription (here, the ledger row directly).
	if _, err := pool.Exec(ctx, `UPDATE subscriptions SET state = 'CLOSED' WHERE id = $1`, sub.ID); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runOn(t, st, nil, "source", "remove", "a", "--purge")
	if code != 0 || !strings.Contains(out, "content purged: 0 body(ies), 0 bytes") {
		t.Errorf("remove --purge after CLOSED: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := runOn(t, st, nil, "source", "remove", "nope"); code != cli.ExitNotFound || errOut != "mcpsync source remove: unknown source \"nope\" (see mcpsync source list)\n" {
		t.Errorf("remove unknown: exit %d %q", code, errOut)
	}

	out, errOut, code = runOn(t, st, nil, "source", "add", "a", "--stdio", "srv2")
	if code != 0 || !strings.Contains(out, "source a added") {
		t.Errorf("add again: exit %d %q %q", code, out, errOut)
	}
	back, err := st.SourceByName(ctx, "a")
	if err != nil || back.ID != src.ID || back.RemovedAt != nil || back.DefinitionVersion != 1 || back.Command[0] != "srv2" {
		t.Errorf("added again: %+v %v", back, err)
	}
	if s, _ := st.SubscriptionByID(ctx, sub.ID); s.State != mcpsync.StateClosed {
		t.Errorf("the old subscription is %s after re-add, want CLOSED (history)", s.State)
	}
}
