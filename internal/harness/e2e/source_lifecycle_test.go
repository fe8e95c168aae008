package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// serveChaos starts a fault-injecting server over streamable HTTP with one resource and
// returns its URL; it is not registered as a source.
func (s *stack) serveChaos(name, uri, body string) string {
	s.t.Helper()
	srv := chaosmcp.New(chaosmcp.Options{Name: name, Version: "1.0.0"})
	s.t.Cleanup(func() { srv.Close() })
	srv.Set(uri, body, "text/plain")
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { h.Close() })
	return h.URL
}

// Issue 14 item 5, end to end with a real worker: `source update --url` makes the host connect
// to the new server as a new session generation, and the subscription goes on there;
// `source remove` closes the subscription through the close fence and keeps its versions;
// `--purge` then deletes the bodies; nothing can be subscribed on the removed source, and
// `source add` brings it back.
func TestSourceUpdateAndRemove(t *testing.T) {
	s := newStack(t)
	const uri = "demo://notes/1"
	urlA := s.serveChaos("a", uri, "from A")
	urlB := s.serveChaos("b", uri, "from B")
	s.mustCLI("source", "add", "life", "--url", urlA, "--backstop", "2s")
	s.mustCLI("subscribe", "life", uri)
	first := s.waitDigest("life", uri, ledger.Digest([]byte("from A")))

	out := s.mustCLI("source", "update", "life", "--url", urlB)
	if !strings.Contains(out, "updated to definition version 1") {
		t.Errorf("update said %q", out)
	}
	src := s.source("life")
	if src.URL != urlB || src.BackstopSeconds != 2 || src.DefinitionVersion != 1 {
		t.Errorf("after update: url %s backstop %d version %d; want %s, 2 (kept), 1", src.URL, src.BackstopSeconds, src.DefinitionVersion, urlB)
	}
	second := s.waitDigest("life", uri, ledger.Digest([]byte("from B")))
	if second.SessionGeneration <= first.SessionGeneration {
		t.Errorf("content of the new server accepted on session %d, not after %d", second.SessionGeneration, first.SessionGeneration)
	}
	sess, err := s.st.CurrentSession(s.ctx, src.ID)
	if err != nil || sess.Generation <= first.SessionGeneration {
		t.Errorf("current session %+v %v: want a generation after %d", sess, err, first.SessionGeneration)
	}

	start := time.Now()
	out = s.mustCLI("source", "remove", "life")
	t.Logf("remove took %s: %s", time.Since(start), out)
	closed := s.sub("life", uri)
	if closed.State != mcpsync.StateClosed || closed.CloseOrdinal == nil {
		t.Errorf("after remove: %s (%s), close ordinal %v; want CLOSED through the close fence", closed.State, closed.StateReason, closed.CloseOrdinal)
	}
	t.Logf("closed: %q, close ordinal %d", closed.StateReason, *closed.CloseOrdinal)
	if n := s.count(`SELECT count(*) FROM resource_versions WHERE source_id = $1`, src.ID); n < 2 {
		t.Errorf("%d versions kept after remove, want >= 2", n)
	}
	if _, err := s.st.Blob(s.ctx, ledger.Digest([]byte("from A"))); err != nil {
		t.Errorf("content gone after a remove without --purge: %v", err)
	}
	if _, errOut, code := s.cli("subscribe", "life", uri); code != cli.ExitNotFound || !strings.Contains(errOut, "was removed") {
		t.Errorf("subscribe on a removed source: exit %d %q, want 3 and 'was removed'", code, errOut)
	}

	s.mustCLI("source", "remove", "life", "--purge")
	for _, body := range []string{"from A", "from B"} {
		if _, err := s.st.Blob(s.ctx, ledger.Digest([]byte(body))); err == nil {
			t.Errorf("body %q still stored after --purge", body)
		}
	}

	s.mustCLI("source", "add", "life", "--url", urlA)
	if back := s.source("life"); back.ID != src.ID || back.RemovedAt != nil || back.DefinitionVersion != 2 {
		t.Errorf("added again: id %d (was %d), removed %v, version %d", back.ID, src.ID, back.RemovedAt, back.DefinitionVersion)
	}
	s.mustCLI("subscribe", "life", uri)
	if sub := s.waitDigest("life", uri, ledger.Digest([]byte("from A"))); sub.Generation != 2 {
		t.Errorf("subscribed again in generation %d, want 2", sub.Generation)
	}
	s.checkInvariants()
}

// Issue 14 item 7: with no worker polling, subscribe and scan --wait say so (exit 1) after the
// few seconds a starting worker is given, instead of waiting their whole timeout (here 60 s)
// and then saying "not found".
func TestNoWorkerPolling(t *testing.T) {
	s := newStack(t, withoutWorker())
	s.mustCLI("source", "add", "idle", "--url", "http://127.0.0.1:9/mcp")
	const want = "no worker is polling task queue mcpsync; start mcpsync-worker (make run) and try again"
	for _, args := range [][]string{
		{"subscribe", "idle", "demo://x", "--wait", "60s"},
		{"scan", "idle", "--wait", "--timeout", "60s"},
	} {
		start := time.Now()
		_, errOut, code := s.cli(args...)
		took := time.Since(start)
		wantLine := "mcpsync " + args[0] + ": " + want + "\n"
		if code != cli.ExitFailure || errOut != wantLine || took >= time.Minute {
			t.Errorf("mcpsync %s: exit %d after %s, stderr %q; want exit 1 before its wait ran out, with %q", strings.Join(args, " "), code, took, errOut, wantLine)
		}
	}
	// Nothing was started for the subscription.
	if _, err := s.st.SubscriptionByKey(s.ctx, "default", "idle", "demo://x"); err == nil {
		t.Error("a subscription row exists although no worker runs")
	}

	// source remove tells the open subscription's workflow to close, then says at once that
	// nothing will run it.
	s.mustCLI("subscribe", "idle", "demo://x", "--wait", "0")
	wfID := contract.SubscriptionWorkflowID("default", "idle", "demo://x")
	src := s.source("idle")
	if _, err := s.st.EnsureSubscription(s.ctx, ledger.EnsureSpec{Principal: "default", SourceID: src.ID, URI: "demo://x", ServerURI: "demo://x", WorkflowID: wfID}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, errOut, code := s.cli("source", "remove", "idle", "--wait", "60s")
	wantLine := "mcpsync source remove: source idle is removed and its 1 open subscription(s) told to close, but " + want + "\n"
	if took := time.Since(start); code != cli.ExitFailure || errOut != wantLine || took >= time.Minute {
		t.Errorf("source remove: exit %d after %s, stderr %q; want exit 1 before its wait ran out, with %q", code, took, errOut, wantLine)
	}
}

// A subscribe that waits on a source whose server does not answer says, on its one line, why
// nothing became ACTIVE: the source's health as status shows it (its state and last error),
// in the one-URI and the bulk form alike; exit 1.
func TestSubscribeWaitNamesADeadSource(t *testing.T) {
	s := newStack(t)
	s.mustCLI("source", "add", "dead", "--url", "http://127.0.0.1:9/mcp") // nothing listens (as in TestNoWorkerPolling)
	// The worker has tried to connect (and failed) before the subscribes wait on it.
	eventually(t, 30*time.Second, "a failed connect reported", func() (bool, string) {
		h, err := s.st.SourceHealth(s.ctx, s.source("dead").ID)
		return err == nil && h.LastError != "", fmt.Sprintf("health %+v, %v", h, err)
	})
	for _, tt := range []struct {
		args []string
		want string // the line's start; the health line follows
	}{
		{[]string{"subscribe", "dead", "demo://x", "--wait", "2s"},
			"mcpsync subscribe: not ACTIVE after 2s: DISCOVERED -; source dead: "},
		{[]string{"subscribe", "dead", "demo://y", "demo://z", "--wait", "2s"},
			"mcpsync subscribe: 2 of 2 URIs failed (listed above); source dead: "},
	} {
		_, errOut, code := s.cli(tt.args...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		last := lines[len(lines)-1]
		if code != cli.ExitFailure || !strings.HasPrefix(last, tt.want) || !strings.Contains(last, "last error") ||
			!strings.Contains(last, "connection refused") {
			t.Errorf("mcpsync %s: exit %d, stderr %q; want exit 1 and a last line starting %q with the source's last error",
				strings.Join(tt.args, " "), code, errOut, tt.want)
		}
	}
}

// Issue 14 item 7: the CLI's URI limit is Temporal's own, to the byte. A search attribute
// value is limited to 2048 bytes as the SDK encodes it (JSON, with quotes); a subscription to
// a URI that encodes to 2048 bytes starts, one byte more is refused by the CLI (exit 2) before
// anything is written, and Temporal itself refuses such a value.
func TestURISearchAttributeLimit(t *testing.T) {
	s := newStack(t, withoutWorker())
	s.mustCLI("source", "add", "long", "--url", "http://127.0.0.1:9/mcp")
	fits := "demo://x/" + strings.Repeat("a", 2046-len("demo://x/")) // 2046 + 2 quotes = 2048
	over := fits + "b"
	if _, errOut, code := s.cli("subscribe", "long", fits, "--wait", "0"); code != 0 {
		t.Errorf("subscribe to a URI that encodes to 2048 bytes: exit %d %q, want 0", code, errOut)
	}
	_, errOut, code := s.cli("subscribe", "long", over, "--wait", "0")
	if code != cli.ExitUsage || !strings.Contains(errOut, "2049 bytes once encoded for Temporal's search attribute, at most 2048") {
		t.Errorf("subscribe to a URI that encodes to 2049 bytes: exit %d %q, want 2", code, errOut)
	}
	_, err := s.tc.ExecuteWorkflow(s.ctx, client.StartWorkflowOptions{
		ID: "probe-over", TaskQueue: "probe",
		TypedSearchAttributes: temporal.NewSearchAttributes(contract.SearchURI.ValueSet(over)),
	}, "Probe")
	if err == nil || !strings.Contains(err.Error(), "exceeds size limit 2048") {
		t.Errorf("Temporal took a search attribute of 2049 bytes: %v", err)
	}
}
