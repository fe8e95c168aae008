package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// lockedBuffer is an io.Writer safe for a command running in another goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startCLI runs a long-running command (outbox tail --follow) until the test ends or the
// returned stop is called; stop waits for it and returns its exit code.
func (s *stack) startCLI(stdout *lockedBuffer, args ...string) (stop func() int) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan int, 1)
	var stderr lockedBuffer
	go func() {
		done <- int(cli.Run(ctx, cli.Env{Stdout: stdout, Stderr: &stderr, Store: s.st, Temporal: s.tc,
			Config: config.Env{Namespace: s.ts.GetDefaultNamespace(), DatabaseURL: s.dbURL}}, args))
	}()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			code = <-done
			if code != 0 {
				s.t.Errorf("mcpsync %s: exit %d: %s", strings.Join(args, " "), code, stderr.String())
			}
		})
		return code
	}
	s.t.Cleanup(func() { stop() })
	return stop
}

// waitAccepted waits until principal's subscription to uri has accepted body.
func (s *stack) waitAccepted(principal, source, uri, body string) ledger.Subscription {
	s.t.Helper()
	var sub ledger.Subscription
	eventually(s.t, 30*time.Second, principal+" accepts "+uri, func() (bool, string) {
		var err error
		sub, err = s.st.SubscriptionByKey(s.ctx, principal, source, uri)
		if err != nil {
			return false, err.Error()
		}
		return sub.LastAcceptedDigest == ledger.Digest([]byte(body)), fmt.Sprintf("state %s digest %s", sub.State, sub.LastAcceptedDigest)
	})
	return sub
}

// expectCode runs a command and checks its exit code and that stderr mentions msg.
func (s *stack) expectCode(code cli.ExitCode, msg string, args ...string) string {
	s.t.Helper()
	out, errOut, got := s.cli(args...)
	if got != code || !strings.Contains(errOut, msg) {
		s.t.Errorf("mcpsync %s: exit %d stderr %q, want exit %d mentioning %q", strings.Join(args, " "), got, errOut, code, msg)
	}
	return out
}

// checkTraced fails the test unless every derived-index entry of a revoked grant was
// invalidated by a revocation (R24), and the other R24 invariants hold.
func (s *stack) checkTraced() {
	s.t.Helper()
	if n, err := s.st.UntracedLineage(s.ctx); err != nil || n != 0 {
		s.t.Errorf("lineage entries not traced by a revocation: %d (%v)", n, err)
	}
	s.checkInvariants()
}

// tailEvent is one line of outbox tail --json.
type tailEvent struct {
	Kind           string `json:"kind"`
	IdempotencyKey string `json:"idempotencyKey"`
	Principal      string `json:"principal"`
	Detail         struct {
		Revocation int64  `json:"revocation"`
		Index      string `json:"index"`
		Entries    []struct {
			URI    string `json:"uri"`
			Digest string `json:"digest"`
		} `json:"entries"`
	} `json:"detail"`
}

func parseTail(t *testing.T, out string) []tailEvent {
	t.Helper()
	var evs []tailEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e tailEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("outbox tail line %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

type revokeOut struct {
	Revocation    int64 `json:"revocation"`
	Subscriptions []struct {
		URI   string `json:"uri"`
		State string `json:"state"`
	} `json:"subscriptions"`
	Indexes []struct {
		Index          string   `json:"index"`
		Entries        int      `json:"entries"`
		OutboxKey      string   `json:"outboxKey"`
		AckedConsumers []string `json:"ackedConsumers"`
	} `json:"indexes"`
}

// Revocation, lineage and the outbox end to end: a principal's grant is revoked while
// derived indexes hold its content and their consumers follow the outbox. The revocation
// closes the principal's subscriptions through the fence (the workflows pass it), invalidates
// exactly the indexes holding its content, each consumer receives its invalidation with the
// entries to drop, and `mcpsync revocation` traces it to every index and consumer (R24).
func TestRevocationTracedToEveryDerivedIndex(t *testing.T) {
	s := newStack(t)
	srv := s.startChaosHTTP("kb", map[string]string{
		"demo://kb/1": "one", "demo://kb/2": "two", "demo://kb/3": "three",
	})
	s.expectCode(cli.ExitDenied, "no standing grant", "subscribe", "kb", "demo://kb/1", "--principal", "alice")
	s.mustCLI("grant", "alice", "kb")
	for _, u := range []string{"demo://kb/1", "demo://kb/2"} {
		s.mustCLI("subscribe", "kb", u, "--principal", "alice")
	}
	s.mustCLI("subscribe", "kb", "demo://kb/1") // default's: proves the server still notifies later
	s.mustCLI("subscribe", "kb", "demo://kb/3")
	s.waitAccepted("alice", "kb", "demo://kb/1", "one")
	s.waitAccepted("alice", "kb", "demo://kb/2", "two")
	s.waitAccepted("default", "kb", "demo://kb/3", "three")

	// Two consumers follow the outbox from the start, one per index.
	var tail1, tail2 lockedBuffer
	stop1 := s.startCLI(&tail1, "outbox", "tail", "--consumer", "search", "--follow", "--json", "--poll", "1h")
	stop2 := s.startCLI(&tail2, "outbox", "tail", "--consumer", "embeddings", "--follow", "--json", "--poll", "1h")

	takes := []struct{ principal, uri, index, body string }{
		{"alice", "demo://kb/1", "search", "one"},
		{"alice", "demo://kb/2", "search", "two"},
		{"alice", "demo://kb/2", "embeddings", "two"},
		{"default", "demo://kb/3", "embeddings", "three"},
		{"default", "demo://kb/3", "summaries", "three"},
	}
	for _, tk := range takes {
		if got := s.mustCLI("get", "kb", tk.uri, "--principal", tk.principal, "--for-index", tk.index); got != tk.body {
			t.Errorf("get %s for %s = %q, want %q", tk.uri, tk.index, got, tk.body)
		}
	}

	var rv revokeOut
	if err := json.Unmarshal([]byte(s.mustCLI("revoke", "alice", "kb", "--reason", "left", "--json")), &rv); err != nil {
		t.Fatal(err)
	}
	type ix struct {
		Index   string
		Entries int
		Key     string
	}
	var gotIx []ix
	for _, i := range rv.Indexes {
		gotIx = append(gotIx, ix{i.Index, i.Entries, i.OutboxKey})
	}
	key := func(index string) string { return fmt.Sprintf("revocation/%d/index/%s", rv.Revocation, index) }
	if diff := cmp.Diff([]ix{{"embeddings", 1, key("embeddings")}, {"search", 2, key("search")}}, gotIx); diff != "" {
		t.Errorf("revoke invalidated (-want +got):\n%s", diff)
	}
	for _, sub := range rv.Subscriptions {
		if !mcpsync.State(sub.State).Closing() {
			t.Errorf("revoke returned with %s in %s, want past the close fence", sub.URI, sub.State)
		}
	}
	for _, u := range []string{"demo://kb/1", "demo://kb/2"} {
		eventually(t, 30*time.Second, "alice's "+u+" CLOSED", func() (bool, string) {
			sub, err := s.st.SubscriptionByKey(s.ctx, "alice", "kb", u)
			if err != nil {
				return false, err.Error()
			}
			return sub.State == mcpsync.StateClosed && strings.HasPrefix(sub.StateReason, "revoked"), fmt.Sprintf("%s %q", sub.State, sub.StateReason)
		})
		s.expectCode(cli.ExitDenied, "no standing grant", "get", "kb", u, "--principal", "alice")
	}
	if got := s.mustCLI("get", "kb", "demo://kb/3"); got != "three" {
		t.Errorf("default's get after alice's revocation = %q", got)
	}
	s.expectCode(cli.ExitDenied, "no standing grant", "subscribe", "kb", "demo://kb/3", "--principal", "alice")

	// Each consumer receives its index's invalidation, listing the entries to drop.
	want := map[string][]string{"search": {"demo://kb/1", "demo://kb/2"}, "embeddings": {"demo://kb/2"}}
	for consumer, buf := range map[string]*lockedBuffer{"search": &tail1, "embeddings": &tail2} {
		eventually(t, 30*time.Second, consumer+" receives its invalidation", func() (bool, string) {
			for _, e := range parseTail(t, buf.String()) {
				if e.Kind != ledger.OutboxIndexInvalidation || e.Detail.Index != consumer {
					continue
				}
				var uris []string
				for _, en := range e.Detail.Entries {
					uris = append(uris, en.URI)
				}
				if e.IdempotencyKey != key(consumer) || e.Principal != "alice" || !cmp.Equal(want[consumer], uris) {
					return false, fmt.Sprintf("got %+v", e)
				}
				return true, ""
			}
			return false, "not yet: " + buf.String()
		})
	}
	// The trace names every index and the consumers that committed its invalidation.
	eventually(t, 30*time.Second, "trace with acknowledging consumers", func() (bool, string) {
		var tr revokeOut
		if err := json.Unmarshal([]byte(s.mustCLI("revocation", fmt.Sprint(rv.Revocation), "--json")), &tr); err != nil {
			return false, err.Error()
		}
		if len(tr.Indexes) != 2 {
			return false, fmt.Sprintf("%+v", tr.Indexes)
		}
		for _, i := range tr.Indexes {
			if !cmp.Equal(i.AckedConsumers, []string{"embeddings", "search"}) {
				return false, fmt.Sprintf("%s acked by %v", i.Index, i.AckedConsumers)
			}
		}
		return true, ""
	})
	stop1()
	stop2()

	var lineage []struct {
		Index, Principal, URI string
		RevocationID          *int64
	}
	if err := json.Unmarshal([]byte(s.mustCLI("lineage", "--json")), &lineage); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lineage {
		state := "live"
		if l.RevocationID != nil {
			state = fmt.Sprintf("revocation %d", *l.RevocationID)
		}
		got = append(got, fmt.Sprintf("%s %s %s %s", l.Index, l.Principal, l.URI, state))
	}
	revoked := fmt.Sprintf("revocation %d", rv.Revocation)
	wantLineage := []string{
		"search alice demo://kb/1 " + revoked, "search alice demo://kb/2 " + revoked,
		"embeddings alice demo://kb/2 " + revoked, "embeddings default demo://kb/3 live",
		"summaries default demo://kb/3 live",
	}
	if diff := cmp.Diff(wantLineage, got); diff != "" {
		t.Errorf("lineage (-want +got):\n%s", diff)
	}

	// A stored offset: a new tail under the same name prints only what came after.
	srv.Set("demo://kb/3", "three, edited", "text/plain")
	s.waitAccepted("default", "kb", "demo://kb/3", "three, edited")
	var rows []tailEvent
	eventually(t, 30*time.Second, "the edit reaches the search consumer", func() (bool, string) {
		out, errOut, code := s.cli("outbox", "tail", "--consumer", "search", "--json")
		if code != 0 {
			return false, errOut
		}
		rows = append(rows, parseTail(t, out)...)
		return len(rows) > 0, "nothing new"
	})
	if len(rows) != 1 || rows[0].Kind != "version" || rows[0].Principal != "default" {
		t.Errorf("search consumer after its offset: %+v, want the one new version", rows)
	}
	// Nothing was accepted for alice after her subscriptions closed (R24).
	srv.Set("demo://kb/1", "one, edited", "text/plain")
	s.waitAccepted("default", "kb", "demo://kb/1", "one, edited")
	for _, u := range []string{"demo://kb/1", "demo://kb/2"} {
		sub, err := s.st.SubscriptionByKey(s.ctx, "alice", "kb", u)
		if err != nil {
			t.Fatal(err)
		}
		if vs, err := s.st.Versions(s.ctx, sub.ID); err != nil || len(vs) != 1 {
			t.Errorf("alice's %s has %d versions (%v), want only the one before the revocation", u, len(vs), err)
		}
	}
	s.checkTraced()
}

// Fault (R23): cache hit after permission revocation. Subscribe, read, revoke, then get must fail
// with zero hits — also while gets race the revocation from many goroutines. A get that
// starts after revoke returned never delivers a byte, with or without an index. In both eras
// (issue 13 item 9), the source pinned.
func TestFaultCacheHitAfterPermissionRevocation(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			srv := s.startChaosEra("vault", era, map[string]string{"demo://vault/secret": "s3cr3t", "demo://vault/public": "hello"})
			s.mustCLI("grant", "mallory", "vault")
			for _, u := range []string{"demo://vault/secret", "demo://vault/public"} {
				s.mustCLI("subscribe", "vault", u, "--principal", "mallory")
				s.waitAccepted("mallory", "vault", u, map[string]string{"demo://vault/secret": "s3cr3t", "demo://vault/public": "hello"}[u])
			}
			if got := s.mustCLI("get", "vault", "demo://vault/secret", "--principal", "mallory"); got != "s3cr3t" {
				t.Fatalf("get before revocation = %q", got)
			}
			assertEra(t, srv, era)

			var revoked atomic.Bool
			var hits, hitsAfter, denials atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := range 4 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						after := revoked.Load()
						args := []string{"get", "vault", "demo://vault/secret", "--principal", "mallory"}
						if i%2 == 1 {
							args = append(args, "--for-index", fmt.Sprintf("idx-%d", g))
						}
						out, errOut, code := s.cli(args...)
						switch code {
						case 0:
							hits.Add(1)
							if after {
								hitsAfter.Add(1)
								t.Errorf("get after the revocation returned %q", out)
							}
						case cli.ExitDenied:
							denials.Add(1)
						default:
							t.Errorf("get: exit %d: %s", code, errOut)
							return
						}
					}
				})
			}
			eventually(t, 30*time.Second, "gets hit before the revocation", func() (bool, string) {
				return hits.Load() >= 20, fmt.Sprint(hits.Load(), " hits")
			})
			out := s.mustCLI("revoke", "mallory", "--json")
			revoked.Store(true)
			eventually(t, 30*time.Second, "gets denied after the revocation", func() (bool, string) {
				return denials.Load() >= 20, fmt.Sprint(denials.Load(), " denials")
			})
			close(stop)
			wg.Wait()
			if n := hitsAfter.Load(); n != 0 {
				t.Errorf("%d cache hits after the revocation, want 0", n)
			}
			// Every index that took the secret before the revocation is named by it.
			var rv revokeOut
			if err := json.Unmarshal([]byte(out), &rv); err != nil {
				t.Fatal(err)
			}
			live, err := s.st.Lineage(s.ctx, ledger.LineageFilter{Principal: "mallory", LiveOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			taken, err := s.st.Lineage(s.ctx, ledger.LineageFilter{Principal: "mallory"})
			if err != nil {
				t.Fatal(err)
			}
			indexes := map[string]bool{}
			for _, l := range taken {
				indexes[l.Index] = true
			}
			if len(live) != 0 || len(rv.Indexes) != len(indexes) {
				t.Errorf("revocation invalidated %d indexes, %d took content; %d lineage entries escaped", len(rv.Indexes), len(indexes), len(live))
			}
			for _, u := range []string{"demo://vault/secret", "demo://vault/public"} {
				for _, extra := range [][]string{nil, {"--json"}, {"--for-index", "late"}} {
					args := append([]string{"get", "vault", u, "--principal", "mallory"}, extra...)
					if out := s.expectCode(cli.ExitDenied, "no standing grant", args...); out != "" {
						t.Errorf("mcpsync %s printed %q after the revocation", strings.Join(args, " "), out)
					}
				}
			}
			s.checkTraced()
			t.Logf("%d hits before the revocation, %d denials after", hits.Load(), denials.Load())
		})
	}
}

// The output guard on the real stack (R22): control characters are stripped from what get
// delivers, a type outside the allow-list is refused with its own exit code, and both
// verdicts are stored with the read.
func TestGuardOnGet(t *testing.T) {
	s := newStack(t)
	srv := s.startChaosHTTP("tools", map[string]string{"demo://tools/log": "ok \x1b[31mred\x1b[0m\u202e!"})
	srv.SetBlob("demo://tools/bin", []byte{0x7f, 'E', 'L', 'F', 0}, "application/octet-stream")
	for _, u := range []string{"demo://tools/log", "demo://tools/bin"} {
		s.mustCLI("subscribe", "tools", u)
	}
	s.waitAccepted("default", "tools", "demo://tools/log", "ok \x1b[31mred\x1b[0m\u202e!")
	s.waitAccepted("default", "tools", "demo://tools/bin", "\x7fELF\x00")

	if got := s.mustCLI("get", "tools", "demo://tools/log"); got != "ok [31mred[0m!" {
		t.Errorf("get of content with control characters = %q, want them stripped", got)
	}
	var j struct {
		Digest string `json:"digest"`
		Guard  struct {
			Outcome, DeliveredDigest string
			Stripped                 int
		} `json:"guard"`
		Body string `json:"body"`
	}
	if err := json.Unmarshal([]byte(s.mustCLI("get", "tools", "demo://tools/log", "--json")), &j); err != nil {
		t.Fatal(err)
	}
	if j.Guard.Outcome != ledger.VerdictSanitized || j.Guard.Stripped != 3 || j.Body != "ok [31mred[0m!" ||
		j.Guard.DeliveredDigest != ledger.Digest([]byte(j.Body)) || j.Digest == j.Guard.DeliveredDigest {
		t.Errorf("get --json: %+v", j)
	}
	out := s.expectCode(cli.ExitGuardRejected, `mime: "application/octet-stream" is not allowed`, "get", "tools", "demo://tools/bin")
	if out != "" {
		t.Errorf("rejected get printed %q", out)
	}
	s.expectCode(cli.ExitGuardRejected, "rejected by output guard", "get", "tools", "demo://tools/bin", "--for-index", "idx")
	if l, err := s.st.Lineage(s.ctx, ledger.LineageFilter{Index: "idx"}); err != nil || len(l) != 0 {
		t.Errorf("a rejected read recorded lineage: %+v %v", l, err)
	}
	var verdicts []string
	rows, err := s.st.Pool().Query(s.ctx, `SELECT outcome FROM guard_verdicts ORDER BY outcome`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		verdicts = append(verdicts, o)
	}
	if diff := cmp.Diff([]string{ledger.VerdictRejected, ledger.VerdictSanitized}, verdicts); diff != "" {
		t.Errorf("stored verdicts (-want +got):\n%s", diff)
	}
	s.checkTraced()
}

func TestConsumerCommandErrors(t *testing.T) {
	s := newStack(t)
	s.mustCLI("source", "add", "demo", "--stdio", "demo-server")
	tests := []struct {
		args []string
		code cli.ExitCode
		msg  string
	}{
		{[]string{"grant", "alice"}, 2, "usage"},
		{[]string{"grant", "alice", "nosuch"}, 3, "unknown source"},
		{[]string{"grant", "", "demo"}, 2, "PRINCIPAL"},
		{[]string{"revoke"}, 2, "usage"},
		{[]string{"revoke", "alice", "nosuch"}, 3, "unknown source"},
		{[]string{"revoke", "alice", "demo"}, 3, "no standing grant"},
		{[]string{"revocation", "x"}, 2, "not a number"},
		{[]string{"revocation", "42"}, 3, "revocation 42"},
		{[]string{"get", "demo", "demo://x", "--principal", "alice"}, cli.ExitDenied, "no standing grant"},
		{[]string{"get", "demo", "demo://x", "--principal", ""}, 2, "--principal"},
		{[]string{"subscribe", "demo", "demo://x", "--principal", "alice"}, cli.ExitDenied, "no standing grant"},
		{[]string{"outbox", "tail"}, 2, "--consumer"},
		{[]string{"outbox", "tail", "--consumer", "c", "--batch", "0"}, 2, "--batch"},
		{[]string{"lineage", "extra"}, 2, "usage"},
	}
	for _, tt := range tests {
		_, errOut, code := s.cli(tt.args...)
		if code != tt.code {
			t.Errorf("mcpsync %v: exit %d, want %d (stderr %q)", tt.args, code, tt.code, errOut)
		}
		if !strings.Contains(errOut, tt.msg) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("mcpsync %v: stderr %q, want one line mentioning %q", tt.args, errOut, tt.msg)
		}
	}
	// The default principal was granted the source when it was added.
	if out := s.mustCLI("grants"); !strings.Contains(out, "default") || !strings.Contains(out, "true") {
		t.Errorf("grants after source add: %q", out)
	}
}
