package cli_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// explainFixture is a ledger with source demo (its server names itself with an ESC sequence)
// and default's subscription to demo://notes/1, whose history has a stale read: reads 1 and 2
// were dispatched, 2 was accepted, then 1 answered and was refused STALE; consumer cache
// passed the version's outbox row; a get for index search-index stored the guard's verdict
// and the lineage; notification 3 came after 5 (out of order); the close fence was passed with read 3 in flight, whose
// late answer was refused STALE_AFTER_CLOSE.
func explainFixture(t *testing.T) *ledger.Store {
	t.Helper()
	ctx := t.Context()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "demo", Transport: ledger.TransportStdio, Command: []string{"demo-server"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, "host-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	sess, _, err := st.OpenSession(ctx, src.ID, "host-a", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125,
		Resources: true, Subscribe: true, ServerName: "demo\x1b[31m", ServerVersion: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	const uri = "demo://notes/1"
	sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "default", SourceID: src.ID, URI: uri, ServerURI: uri, WorkflowID: "wf-explain"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := st.BeginSubscribe(ctx, sub.ID, sub.Generation, sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("subscribe: %+v %v", r, err)
	}
	if r, err := st.Activate(ctx, sub.ID, sub.Generation, sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("activate: %+v %v", r, err)
	}
	dispatch := func(req string) {
		t.Helper()
		if d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sess.Generation, URI: uri, RequestID: req, Reason: mcpsync.ReasonNotification}); err != nil || d.Outcome != mcpsync.OutcomeAllocated {
			t.Fatalf("allocate %s: %+v %v", req, d, err)
		}
	}
	answer := func(ord int64, req, body string, want mcpsync.Outcome) {
		t.Helper()
		digest, err := st.PutBlob(ctx, []byte(body), "text/plain")
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sess.Generation, URI: uri, Ordinal: ord, RequestID: req,
			Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(body)), ServerName: "demo\x1b[31m", ServerVersion: "1.0.0"}})
		if err != nil || r.Outcome != want {
			t.Fatalf("answer %d: %+v %v, want %s", ord, r, err, want)
		}
	}
	dispatch("req-1")
	dispatch("req-2")
	answer(2, "req-2", "second", mcpsync.OutcomeAccepted)
	answer(1, "req-1", "first", mcpsync.OutcomeStale)
	for _, c := range []string{"cache", "search"} {
		if _, err := st.EnsureConsumer(ctx, c, false); err != nil {
			t.Fatal(err)
		}
	}
	var cur ledger.OutboxCursor
	if err := st.Pool().QueryRow(ctx, `SELECT txid::text::bigint, id FROM invalidation_outbox WHERE subscription_id = $1`, sub.ID).
		Scan(&cur.TxID, &cur.ID); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.CommitConsumer(ctx, "cache", cur, 1); err != nil || !ok {
		t.Fatalf("commit cache: %v %v", ok, err)
	}
	// The consumer read through the output guard for a derived index (guard verdict, lineage).
	if _, errOut, code := runStore(t, st, "get", "demo", uri, "--for-index", "search-index"); code != cli.ExitOK {
		t.Fatalf("get --for-index: exit %d: %s", code, errOut)
	}
	// Notifications 5 then 3 of the session: the second is out of order and audited.
	for _, seq := range []int64{5, 3} {
		if _, _, err := st.RecordNotification(ctx, ledger.Notification{SourceID: src.ID, SessionGeneration: sess.Generation, Seq: seq, URI: uri, ServerURI: uri}); err != nil {
			t.Fatal(err)
		}
	}
	dispatch("req-3")
	if c, err := st.BeginUnsubscribe(ctx, sub.ID, sub.Generation, "operator"); err != nil || c.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("close: %+v %v", c, err)
	}
	answer(3, "req-3", "third", mcpsync.OutcomeStaleAfterClose)
	return st
}

// explain prints the timeline of a resource that had a stale read: the header, the why lines
// and one row per event, with the server's name escaped; --json gives the typed events;
// --ordinal narrows to one read and what followed; the URI is normalized (issue 17 part 4).
func TestExplainTimeline(t *testing.T) {
	st := explainFixture(t)
	out, errOut, code := runStore(t, st, "explain", "demo", "DEMO://notes/1")
	if code != cli.ExitOK {
		t.Fatalf("explain: exit %d: %s", code, errOut)
	}
	t.Logf("mcpsync explain demo demo://notes/1:\n%s", out)
	if strings.Contains(out, "\x1b") {
		t.Errorf("explain printed a raw ESC:\n%q", out)
	}
	const ts = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`
	const dg = `sha256:[0-9a-f]{12}…`
	for _, re := range []string{
		`(?m)^demo demo://notes/1 for default \(subscription \d+, workflow wf-explain\)$`,
		`(?m)^state UNSUBSCRIBING \(operator\), generation 1, session 1; watermark 2, last issued ordinal 3, close fence at ordinal 3$`,
		`(?m)^current version: ordinal 2 sha256:[0-9a-f]{64} \(text/plain, 6 B\) from demo\\x1b\[31m 1\.0\.0, accepted ` + ts,
		`(?m)^why: ordinal 2 is the newest read the acceptance point accepted with new content$`,
		`(?m)^why: answers refused: 1 STALE, 1 STALE_AFTER_CLOSE \(each kept only its receipt\)$`,
		`(?m)^why: the close fence at ordinal 3 refuses every later answer \(STALE_AFTER_CLOSE\)$`,
		`(?m)^TIME +ORD +EVENT +DETAIL$`,
		`(?m)^` + ts + ` +1 +dispatch +reason notification, request req-1, session 1, generation 1; answered STALE at `,
		`(?m)^` + ts + ` +2 +ACCEPTED +` + dg + `; text/plain 6 B; from demo\\x1b\[31m 1\.0\.0; request req-2, session 1; watermark 0 -> 2; version \d+; receipt \d+$`,
		`(?m)^` + ts + ` +2 +outbox version +row \d+; ` + dg + `; passed by: cache; not yet: search$`,
		`(?m)^` + ts + ` +1 +STALE +` + dg + `; from demo\\x1b\[31m 1\.0\.0 \(session's\); request req-1, session 1; refused: ordinal not above watermark 2 \(set by read 2\); receipt \d+$`,
		`(?m)^last notification recorded: session 1 seq 5 \(routed notifications are kept only as this last pair\)$`,
		`(?m)^` + ts + ` +2 +guard PASS +` + dg + ` under \S+$`,
		`(?m)^` + ts + ` +2 +index took +index search-index took version \d+ \(` + dg + `\) 1 time\(s\), last ` + ts + `$`,
		`(?m)^` + ts + ` +- +NOTIFICATION_OUT_OF_ORDER +session 1 seq 3 routed nothing$`,
		`(?m)^` + ts + ` +- +CLOSE_FENCE +close ordinal 3, epoch 1: later answers are STALE_AFTER_CLOSE; reason: operator$`,
		`(?m)^` + ts + ` +3 +STALE_AFTER_CLOSE +` + dg + `; .*refused: answered after the close fence \(R19\); watermark was 2; receipt \d+$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("explain: no line matching %s", re)
		}
	}

	type jsonEvent struct {
		Kind    string
		Ordinal int64
		Outcome string
	}
	var got struct {
		State   string
		Current struct {
			ReadOrdinal int64
			Digest      string
		}
		Events []jsonEvent
	}
	out, errOut, code = runStore(t, st, "explain", "demo", "demo://notes/1", "--json")
	if code != cli.ExitOK {
		t.Fatalf("explain --json: exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := []jsonEvent{
		{"session", 0, "SESSION_OPENED"}, {"transition", 0, "SUBSCRIPTION_OPENED"}, {"transition", 0, "SUBSCRIBING"},
		{"transition", 0, "ACTIVATED"}, {"dispatch", 1, "STALE"}, {"dispatch", 2, "ACCEPTED"}, {"answer", 2, "ACCEPTED"},
		{"outbox", 2, ""}, {"answer", 1, "STALE"}, {"guard_verdict", 2, "PASS"}, {"lineage", 2, ""},
		{"notification", 0, "NOTIFICATION_OUT_OF_ORDER"}, {"dispatch", 3, "STALE_AFTER_CLOSE"}, {"close_fence", 0, "CLOSE_FENCE"},
		{"answer", 3, "STALE_AFTER_CLOSE"},
	}
	if diff := cmp.Diff(want, got.Events); diff != "" {
		t.Errorf("explain --json events (-want +got):\n%s", diff)
	}
	if got.State != "UNSUBSCRIBING" || got.Current.ReadOrdinal != 2 || !strings.HasPrefix(got.Current.Digest, "sha256:") {
		t.Errorf("explain --json header: %+v", got)
	}

	out, errOut, code = runStore(t, st, "explain", "demo", "demo://notes/1", "--ordinal", "2", "--json")
	if code != cli.ExitOK {
		t.Fatalf("explain --ordinal 2: exit %d: %s", code, errOut)
	}
	got.Events = nil
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want = []jsonEvent{{"dispatch", 2, "ACCEPTED"}, {"answer", 2, "ACCEPTED"}, {"outbox", 2, ""}, {"answer", 1, "STALE"},
		{"guard_verdict", 2, "PASS"}, {"lineage", 2, ""}}
	if diff := cmp.Diff(want, got.Events); diff != "" {
		t.Errorf("explain --ordinal 2 events (-want +got):\n%s", diff)
	}
	out, _, code = runStore(t, st, "explain", "demo", "demo://notes/1", "--ordinal", "2")
	if code != cli.ExitOK || !strings.Contains(out, "showing read 2 and what followed from it\n") {
		t.Errorf("explain --ordinal 2: exit %d:\n%s", code, out)
	}
}

// explain rejects bad input with one line and exit 2 before anything is contacted, and exits
// 3 with one line when the source, the subscription or the read does not exist.
func TestExplainBadInput(t *testing.T) {
	const usage = "(usage: mcpsync explain SOURCE URI [--principal P] [--ordinal N] [--json])"
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"explain"}, "mcpsync explain: missing SOURCE URI " + usage},
		{[]string{"explain", "demo"}, "mcpsync explain: missing URI " + usage},
		{[]string{"explain", "demo", "demo://x", "extra"}, `mcpsync explain: unexpected argument "extra" ` + usage},
		{[]string{"explain", "demo", "demo://x", "--bogus"}, "mcpsync explain: flag provided but not defined: -bogus " + usage},
		{[]string{"explain", "demo", "demo://x", "--principal", " "}, "mcpsync explain: --principal must not be empty"},
		{[]string{"explain", "demo", "demo://x", "--ordinal", "0"}, "mcpsync explain: --ordinal must be a read ordinal above 0, got 0"},
		{[]string{"explain", "demo", "demo://x", "--ordinal", "-3"}, "mcpsync explain: --ordinal must be a read ordinal above 0, got -3"},
		{[]string{"explain", "demo", "demo://x", "--ordinal", "two"}, `mcpsync explain: invalid value "two" for flag -ordinal: parse error ` + usage},
		{[]string{"explain", "demo", "demo://x", "--json=maybe"}, `mcpsync explain: invalid boolean value "maybe" for -json: parse error ` + usage},
	} {
		_, errOut, code := run(t, tt.args...)
		if code != cli.ExitUsage || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, cli.ExitUsage, tt.want)
		}
	}
	for _, args := range [][]string{{"explain", "demo", "not a uri"}, {"explain", "demo", ""}} {
		_, errOut, code := run(t, args...)
		if code != cli.ExitUsage || !strings.HasPrefix(errOut, `mcpsync explain: uri "`) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit 2 and one line naming the URI", args, code, errOut)
		}
	}

	st := explainFixture(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"explain", "nosuch", "demo://notes/1"}, `mcpsync explain: unknown source "nosuch" (see mcpsync source list)`},
		{[]string{"explain", "demo", "demo://notes/2"}, "mcpsync explain: no subscription of default to demo://notes/2 on demo"},
		{[]string{"explain", "demo", "demo://notes/1", "--principal", "alice"}, "mcpsync explain: no subscription of alice to demo://notes/1 on demo (subscribed by: default; give --principal)"},
		{[]string{"explain", "demo", "demo://notes/1", "--ordinal", "9"}, "mcpsync explain: no read with ordinal 9 of demo://notes/1 on demo for default (last issued ordinal 3)"},
	} {
		_, errOut, code := runStore(t, st, tt.args...)
		if code != cli.ExitNotFound || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, cli.ExitNotFound, tt.want)
		}
	}
}
