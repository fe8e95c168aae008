package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// watchFixture is a ledger with source "modern" (backstop 60 s, poll 10 s) live on a
// 2026-07-28 session whose server honours resources.subscribe, and three ACTIVE
// subscriptions of alice: demo://watched (in the listen acknowledgement) and demo://computed
// (left out of it: ActivateWatch(..., true)); demo://stale was left out of the ack on
// generation 1 and is parked since the session moved to generation 2.
func watchFixture(t *testing.T) *ledger.Store {
	t.Helper()
	ctx := t.Context()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "modern", Transport: ledger.TransportStdio,
		Command: []string{"demo-server"}, BackstopSeconds: 60, PollSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.GrantAccess(ctx, "alice", src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, "host-w", time.Minute); err != nil {
		t.Fatal(err)
	}
	caps := ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20260728, Resources: true, Subscribe: true,
		ServerName: "demo", ServerVersion: "1.0.0", Raw: json.RawMessage(`{"resources":{"subscribe":true}}`)}
	open := func() ledger.Session {
		sess, _, err := st.OpenSession(ctx, src.ID, "host-w", caps)
		if err != nil {
			t.Fatal(err)
		}
		return sess
	}
	activate := func(sess ledger.Session, uri string, notAcknowledged bool) {
		sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "alice", SourceID: src.ID, URI: uri,
			ServerURI: uri, WorkflowID: "wf/alice/" + uri})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := st.BeginSubscribe(ctx, sub.ID, sub.Generation, sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("begin subscribe %s: %+v %v", uri, r, err)
		}
		if r, err := st.ActivateWatch(ctx, sub.ID, sub.Generation, sess.Generation, notAcknowledged); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("activate %s: %+v %v", uri, r, err)
		}
	}
	activate(open(), "demo://stale", true)
	sess := open() // generation 2: demo://stale's acknowledgement belongs to generation 1
	if sess.Generation != 2 {
		t.Fatalf("second session has generation %d, want 2", sess.Generation)
	}
	activate(sess, "demo://watched", false)
	activate(sess, "demo://computed", true)
	return st
}

// `status` shows a subscription the server left out of its subscriptions/listen
// acknowledgement as polling with the poll period's bound, never as real-time; one in the
// acknowledgement as notify with the backstop's bound; and one marked on an older session
// generation as not live at all (issue 13 item 3, R9, R11).
func TestStatusShowsNotAcknowledgedAsPolling(t *testing.T) {
	st := watchFixture(t)
	type row struct {
		Refresh string
		Bound   int
		Watch   string
	}
	want := map[string]row{
		"demo://watched":  {Refresh: "notify", Bound: 72},
		"demo://computed": {Refresh: "poll", Bound: 12, Watch: "not acknowledged"},
		"demo://stale":    {},
	}
	out, errOut, code := runStore(t, st, "status", "modern", "--json")
	if code != cli.ExitOK {
		t.Fatalf("status --json: exit %d: %s", code, errOut)
	}
	var rows []struct {
		URI                   string `json:"uri"`
		Refresh               string `json:"refresh"`
		StalenessBoundSeconds int    `json:"stalenessBoundSeconds"`
		Watch                 string `json:"watch"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("status --json: %v:\n%s", err, out)
	}
	got := map[string]row{}
	for _, r := range rows {
		got[r.URI] = row{Refresh: r.Refresh, Bound: r.StalenessBoundSeconds, Watch: r.Watch}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("status --json refresh per URI (-want +got):\n%s", d)
	}

	out, errOut, code = runStore(t, st, "status", "modern")
	if code != cli.ExitOK {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	t.Logf("status modern:\n%s", out)
	for _, tt := range []struct {
		uri, re string
	}{
		{"demo://watched", `(?m)^modern\s+demo://watched\s+alice\s+ACTIVE\s.*\snotify, stale <= 72s\s`},
		{"demo://computed", `(?m)^modern\s+demo://computed\s+alice\s+ACTIVE\s.*\spoll \(not acknowledged\), stale <= 12s\s`},
		{"demo://stale", `(?m)^modern\s+demo://stale\s+alice\s+RECONCILIATION_REQUIRED\s.*\s-\s+session changed to generation 2$`},
	} {
		if !regexp.MustCompile(tt.re).MatchString(out) {
			t.Errorf("status: %s: no line matching %s", tt.uri, tt.re)
		}
	}
	if regexp.MustCompile(`(?m)demo://computed.*notify`).MatchString(out) {
		t.Errorf("status shows the not-acknowledged demo://computed as notify:\n%s", out)
	}
}

// `watch` prints an accepted version when the outbox notifies its commit, not on its next
// poll: with the poll an hour away, a version of a kind that notifies (the gateway turns
// versions on) accepted while watch waits is printed all the same.
func TestWatchWakesOnNotification(t *testing.T) {
	defer cli.SetWatchPoll(time.Hour)()
	st := watchFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := st.SetOutboxNotify(ctx, "version", true); err != nil {
		t.Fatal(err)
	}
	src, err := st.SourceByName(ctx, "modern")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.SubscriptionOf(ctx, "alice", src.ID, "demo://watched")
	if err != nil {
		t.Fatal(err)
	}
	accept := func(body string) string {
		t.Helper()
		d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sub.SessionGeneration, URI: sub.URI, RequestID: body, Reason: mcpsync.ReasonNotification})
		if err != nil {
			t.Fatal(err)
		}
		digest := ledger.Digest([]byte(body))
		r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sub.SessionGeneration, URI: sub.URI, Ordinal: d.Ordinal, RequestID: body,
			Version: ledger.VersionInfo{Digest: digest}})
		if err != nil || r.Outcome != mcpsync.OutcomeAccepted {
			t.Fatalf("accept %s: %+v %v", body, r, err)
		}
		return digest
	}
	// Accepted before watch starts: --from-start prints it on watch's first read, so once its
	// line is out, watch has listened, read and caught up.
	first := accept("before watch")
	pr, pw := io.Pipe()
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	done := make(chan cli.ExitCode, 1)
	var errb bytes.Buffer
	go func() {
		done <- cli.Run(ctx, cli.Env{Stdout: pw, Stderr: &errb, Store: st, Config: config.Env{DatabaseURL: "unused"}},
			[]string{"watch", "modern", "--json", "--from-start"})
		pw.Close()
	}()
	next := func(what, digest string) {
		t.Helper()
		select {
		case line := <-lines:
			var j struct{ URI, Digest string }
			if err := json.Unmarshal([]byte(line), &j); err != nil || j.URI != "demo://watched" || j.Digest != digest {
				t.Fatalf("watch printed %s (%v), want %s: demo://watched at %s", line, err, what, digest)
			}
		case <-ctx.Done():
			t.Fatalf("watch did not print %s: %v (stderr %q)", what, ctx.Err(), errb.String())
		}
	}
	next("the version accepted before it started", first)
	next("the version accepted while it waits", accept("while watch waits"))
	cancel()
	if code := <-done; code != cli.ExitOK {
		t.Errorf("watch: exit %d: %s", code, errb.String())
	}
}
