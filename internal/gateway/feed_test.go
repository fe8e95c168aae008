package gateway_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/api/serviceerror"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// arrival is one notification a watcher received: for resources/updated the gateway URI and
// the digest the ledger held for the principal's subscription at that moment.
type arrival struct {
	Method string
	URI    string
	Digest string
}

// watcher is a go-sdk client session to the gateway that records the notifications it gets
// and the streams (2025 GET streams, 2026 listen requests) its HTTP layer opened and saw end.
type watcher struct {
	*mcp.ClientSession
	t         *testing.T
	mu        sync.Mutex
	arrivals  []arrival
	acks      int
	streams   []int // HTTP status of every stream request, in order
	open      int   // stream responses (200) whose body has not ended
	ended     int
	principal string
}

func (w *watcher) snapshot() (arr []arrival, acks, open, ended int, statuses []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]arrival(nil), w.arrivals...), w.acks, w.open, w.ended, append([]int(nil), w.streams...)
}

// updates returns the resources/updated arrivals for uri.
func (w *watcher) updates(uri string) []arrival {
	arr, _, _, _, _ := w.snapshot()
	var out []arrival
	for _, a := range arr {
		if a.Method == "updated" && a.URI == uri {
			out = append(out, a)
		}
	}
	return out
}

func (w *watcher) listChanges() int {
	arr, _, _, _, _ := w.snapshot()
	n := 0
	for _, a := range arr {
		if a.Method == "list_changed" {
			n++
		}
	}
	return n
}

// watch connects a watcher for principal with token in era. upstreamOf maps a gateway URI
// to (source, upstream URI) for the ledger lookup at arrival.
func (s *gwStack) watch(principal, token, era string) (*watcher, error) {
	w := &watcher{t: s.t, principal: principal}
	onUpdated := func(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
		a := arrival{Method: "updated", URI: req.Params.URI}
		if u, err := gateway.ParseURI(req.Params.URI); err == nil {
			if sub, err := s.Store.SubscriptionByKey(context.Background(), principal, u.Source, u.Upstream); err == nil {
				a.Digest = sub.LastAcceptedDigest
			}
		}
		w.mu.Lock()
		w.arrivals = append(w.arrivals, a)
		w.mu.Unlock()
	}
	onList := func(context.Context, *mcp.ResourceListChangedRequest) {
		w.mu.Lock()
		w.arrivals = append(w.arrivals, arrival{Method: "list_changed"})
		w.mu.Unlock()
	}
	cl := mcp.NewClient(&mcp.Implementation{Name: "gateway-feed-test", Version: "1"},
		&mcp.ClientOptions{ResourceUpdatedHandler: onUpdated, ResourceListChangedHandler: onList})
	cl.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "notifications/subscriptions/acknowledged" {
				w.mu.Lock()
				w.acks++
				w.mu.Unlock()
			}
			return next(ctx, method, req)
		}
	})
	tr := &mcp.StreamableClientTransport{Endpoint: s.URL, MaxRetries: 1,
		HTTPClient: &http.Client{Transport: &streamTransport{w: w, token: token, base: http.DefaultTransport}}}
	var so *mcp.ClientSessionOptions
	if era == era2025 {
		so = &mcp.ClientSessionOptions{ProtocolVersion: era2025}
	}
	ctx, cancel := context.WithTimeout(s.Ctx, 20*time.Second)
	defer cancel()
	cs, err := cl.Connect(ctx, tr, so)
	if err != nil {
		return nil, err
	}
	s.t.Cleanup(func() { cs.Close() })
	w.ClientSession = cs
	return w, nil
}

func (s *gwStack) mustWatch(principal, token, era string) *watcher {
	s.t.Helper()
	w, err := s.watch(principal, token, era)
	if err != nil {
		s.t.Fatalf("connect %s (%s): %v", principal, era, err)
	}
	return w
}

// subscribe subscribes through the gateway and, in the 2026 era (where Subscribe returns
// before the server answered), waits for the listen's acknowledgement.
func (w *watcher) subscribe(ctx context.Context, era, uri string) {
	w.t.Helper()
	_, acks, _, _, _ := w.snapshot()
	if err := w.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		w.t.Fatalf("subscribe %s: %v", uri, err)
	}
	if era == era2026 {
		eventually(w.t, 20*time.Second, "listen acknowledged", func() (bool, string) {
			_, n, _, _, _ := w.snapshot()
			return n > acks, "no acknowledgement yet"
		})
	}
}

// streamTransport adds the bearer token and watches the stream requests: GET (the 2025
// standalone SSE stream) and POST subscriptions/listen (2026).
type streamTransport struct {
	w     *watcher
	token string
	base  http.RoundTripper
}

func (st *streamTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if st.token != "" {
		r.Header.Set("Authorization", "Bearer "+st.token)
	}
	resp, err := st.base.RoundTrip(r)
	stream := r.Method == http.MethodGet || r.Header.Get("Mcp-Method") == "subscriptions/listen"
	if err != nil || !stream {
		return resp, err
	}
	st.w.mu.Lock()
	st.w.streams = append(st.w.streams, resp.StatusCode)
	if resp.StatusCode == http.StatusOK {
		st.w.open++
		resp.Body = &endWatcher{ReadCloser: resp.Body, end: func() {
			st.w.mu.Lock()
			st.w.open--
			st.w.ended++
			st.w.mu.Unlock()
		}}
	}
	st.w.mu.Unlock()
	return resp, nil
}

// endWatcher calls end once, when its body reaches EOF, fails or is closed.
type endWatcher struct {
	io.ReadCloser
	once sync.Once
	end  func()
}

func (e *endWatcher) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if err != nil {
		e.once.Do(e.end)
	}
	return n, err
}

func (e *endWatcher) Close() error {
	e.once.Do(e.end)
	return e.ReadCloser.Close()
}

// readText reads a gateway resource and returns its text.
func readText(ctx context.Context, c *mcp.ClientSession, uri string) (string, error) {
	res, err := c.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return "", err
	}
	if len(res.Contents) != 1 {
		return "", errors.New("not one content")
	}
	return res.Contents[0].Text, nil
}

// TestSubscribeNotifiesAcceptedVersions: a subscription through the gateway (both eras)
// starts the principal's subscription workflow; each accepted version reaches the
// subscribed session as exactly one resources/updated carrying the gateway URI, sent only
// once the ledger holds the version, and a read then returns the new bytes. Another
// principal's session gets nothing for it until it subscribes itself. After `mcpsync revoke`
// the principal is told list_changed, gets no further updates and its reads fail.
func TestSubscribeNotifiesAcceptedVersions(t *testing.T) {
	s := newGWStack(t)
	ctx := s.Ctx
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s.t = t
			alice, bob := "alice-"+era, "bob-"+era
			up := "demo://feed/" + era
			barrier := "demo://feed/" + era + "-barrier"
			gw, gwBarrier := GatewayURI(testSource, up), GatewayURI(testSource, barrier)
			s.Grant(alice, testSource)
			s.Grant(bob, testSource)
			s.Put(up, "v1")
			s.Put(barrier, "b1")
			a := s.mustWatch(alice, s.Token(alice), era)
			b := s.mustWatch(bob, s.Token(bob), era)

			a.subscribe(ctx, era, gw)
			s.WaitBody(alice, testSource, up, "v1")
			// The first version is announced too, even when it was accepted before the SDK
			// registered the session's subscription.
			eventually(t, 20*time.Second, "first version announced", func() (bool, string) {
				u := a.updates(gw)
				return len(u) > 0 && u[len(u)-1].Digest == ledger.Digest([]byte("v1")), "updates so far: " + fmtArrivals(u)
			})
			before := len(a.updates(gw))

			s.Put(up, "v2")
			eventually(t, 30*time.Second, "update after v2", func() (bool, string) {
				return len(a.updates(gw)) > before, "none yet"
			})
			got := a.updates(gw)[before]
			if want := ledger.Digest([]byte("v2")); got.Digest != want {
				t.Errorf("resources/updated arrived while the ledger held %q, want the new version %q", got.Digest, want)
			}
			if text, err := readText(ctx, a.ClientSession, gw); err != nil || text != "v2" {
				t.Errorf("read after the notification = %q, %v; want v2", text, err)
			}
			// Barrier: a later version of another resource arrives after every notification
			// the v2 outbox row caused (the feed sends in outbox order, each session in order).
			a.subscribe(ctx, era, gwBarrier)
			s.WaitBody(alice, testSource, barrier, "b1")
			eventually(t, 20*time.Second, "barrier announced", func() (bool, string) {
				return len(a.updates(gwBarrier)) > 0, "none yet"
			})
			if n := len(a.updates(gw)) - before; n != 1 {
				t.Errorf("v2 caused %d resources/updated, want exactly 1: %s", n, fmtArrivals(a.updates(gw)))
			}
			if u := b.updates(gw); len(u) != 0 {
				t.Errorf("bob, not subscribed, got alice's notifications: %s", fmtArrivals(u))
			}

			// Bob subscribes too: each gets its own notification for the next change.
			b.subscribe(ctx, era, gw)
			s.WaitBody(bob, testSource, up, "v2")
			aBefore, bBefore := len(a.updates(gw)), len(b.updates(gw))
			s.Put(up, "v3")
			eventually(t, 30*time.Second, "both notified of v3", func() (bool, string) {
				ua, ub := a.updates(gw), b.updates(gw)
				okA := len(ua) > aBefore && ua[len(ua)-1].Digest == ledger.Digest([]byte("v3"))
				okB := len(ub) > bBefore && ub[len(ub)-1].Digest == ledger.Digest([]byte("v3"))
				return okA && okB, "alice " + fmtArrivals(ua) + "; bob " + fmtArrivals(ub)
			})

			// Revoke alice: she is told to re-list, gets no update for v4, and cannot read.
			lists := a.listChanges()
			s.MustCLI("revoke", alice, testSource)
			eventually(t, 20*time.Second, "list_changed after the revocation", func() (bool, string) {
				return a.listChanges() > lists, "none yet"
			})
			aBefore, bBefore = len(a.updates(gw)), len(b.updates(gw))
			s.Put(up, "v4")
			eventually(t, 30*time.Second, "bob notified of v4", func() (bool, string) {
				ub := b.updates(gw)
				return len(ub) > bBefore && ub[len(ub)-1].Digest == ledger.Digest([]byte("v4")), fmtArrivals(ub)
			})
			if u := a.updates(gw)[aBefore:]; len(u) != 0 {
				t.Errorf("alice got updates after her grant was revoked: %s", fmtArrivals(u))
			}
			if text, err := readText(ctx, a.ClientSession, gw); err == nil {
				t.Errorf("alice read %q after her grant was revoked; want an error", text)
			}
		})
	}
}

func fmtArrivals(as []arrival) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, a.Method+" "+a.URI+" @"+a.Digest)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// TestSubscribeRefusals: a subscribe by a principal without a grant, to an unknown source or
// with a malformed gateway URI is refused with an MCP error and starts no workflow and
// writes no subscription (both eras; the 2026 client does not report the listen's error, so
// there only the absence of effects is checked).
func TestSubscribeRefusals(t *testing.T) {
	s := newGWStack(t)
	ctx := s.Ctx
	s.Put("demo://refused/a", "x")
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s.t = t
			p := "carol-" + era
			c := s.mustWatch(p, s.Token(p), era)
			for _, tc := range []struct {
				name, uri, reason string
				source, upstream  string // what must not have been started
			}{
				{"no grant", GatewayURI(testSource, "demo://refused/a"), gateway.ReasonNoGrant, testSource, "demo://refused/a"},
				{"unknown source", GatewayURI("nosuch", "demo://refused/a"), gateway.ReasonNoGrant, "nosuch", "demo://refused/a"},
				{"not a gateway URI", "demo://refused/a", gateway.ReasonBadURI, "", ""},
				{"two segments", "mcpsync://docs/a/b", gateway.ReasonBadURI, "", ""},
			} {
				_, _, _, _, st := c.snapshot()
				err := c.Subscribe(ctx, &mcp.SubscribeParams{URI: tc.uri})
				if era == era2026 {
					// The listen's answer: its stream request completes (refused or ended).
					eventually(t, 20*time.Second, "listen answered", func() (bool, string) {
						_, _, open, _, now := c.snapshot()
						return len(now) > len(st) && open == 1, "statuses " + cmp.Diff(st, now)
					})
				}
				if era == era2025 {
					if err == nil {
						t.Errorf("%s: subscribe %s succeeded", tc.name, tc.uri)
					} else {
						msg := readErr(t, err, -32602, tc.reason)
						t.Logf("%s: %s", tc.name, msg)
					}
				}
				if tc.source == "" {
					continue
				}
				wfID := contract.SubscriptionWorkflowID(p, tc.source, tc.upstream)
				_, derr := s.Stack.Client.DescribeWorkflowExecution(ctx, wfID, "")
				var nf *serviceerror.NotFound
				if !errors.As(derr, &nf) {
					t.Errorf("%s: workflow %s exists (describe: %v)", tc.name, wfID, derr)
				}
				if _, err := s.Store.SubscriptionByKey(ctx, p, tc.source, tc.upstream); !errors.Is(err, ledger.ErrNotFound) {
					t.Errorf("%s: a subscription was written (lookup: %v)", tc.name, err)
				}
			}
		})
	}
}

// TestTokenRevocationEndsStreams: revoking a token ends its open streams at once (the
// 2025 standalone GET stream, the 2026 listen streams) and closes its sessions; the
// client's next request is refused.
func TestTokenRevocationEndsStreams(t *testing.T) {
	s := newGWStack(t)
	ctx := s.Ctx
	s.Put("demo://tok/a", "x")
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s.t = t
			p := "dave-" + era
			s.Grant(p, testSource)
			tok, plain, err := s.Store.CreateToken(ctx, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			w := s.mustWatch(p, plain, era)
			w.subscribe(ctx, era, GatewayURI(testSource, "demo://tok/a"))
			eventually(t, 20*time.Second, "a stream open", func() (bool, string) {
				_, _, open, _, st := w.snapshot()
				return open > 0, "stream statuses " + cmp.Diff([]int(nil), st)
			})
			if _, err := s.Store.RevokeToken(ctx, tok.ID); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "every stream ended", func() (bool, string) {
				_, _, open, ended, st := w.snapshot()
				return open == 0 && ended > 0, "streams still open; statuses " + cmp.Diff([]int(nil), st)
			})
			if _, err := w.ListResources(ctx, nil); err == nil {
				t.Errorf("resources/list with a revoked token succeeded")
			}
		})
	}
}

// TestStreamLimit: a token holds at most MaxStreamsPerToken sessions (2025) and listen
// streams (2026); one more is refused with HTTP 429 and leaves nothing open, and closing one
// frees its place.
func TestStreamLimit(t *testing.T) {
	s := newGWStack(t, func(o *gateway.Options) { o.MaxStreamsPerToken = 2 })
	ctx := s.Ctx
	s.Put("demo://lim/a", "a")
	s.Put("demo://lim/b", "b")
	s.Put("demo://lim/c", "c")

	t.Run(era2025, func(t *testing.T) {
		s.t = t
		p := "erin-2025"
		tok := s.Token(p)
		first := s.mustWatch(p, tok, era2025)
		s.mustWatch(p, tok, era2025)
		_, err := s.watch(p, tok, era2025)
		if err == nil || !strings.Contains(err.Error(), "Too Many Requests") && !strings.Contains(err.Error(), "429") {
			t.Fatalf("third session: err = %v, want HTTP 429", err)
		}
		t.Logf("third session refused: %v", err)
		// Another token of the same principal is bounded on its own.
		s.mustWatch(p, s.Token(p), era2025)
		first.Close()
		eventually(t, 20*time.Second, "a place freed by closing a session", func() (bool, string) {
			_, err := s.watch(p, tok, era2025)
			return err == nil, "connect: " + errString(err)
		})
	})

	t.Run(era2026, func(t *testing.T) {
		s.t = t
		p := "erin-2026"
		s.Grant(p, testSource)
		w := s.mustWatch(p, s.Token(p), era2026) // its list_changed listen is the first stream
		w.subscribe(ctx, era2026, GatewayURI(testSource, "demo://lim/a"))
		if err := w.Subscribe(ctx, &mcp.SubscribeParams{URI: GatewayURI(testSource, "demo://lim/b")}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the third listen refused", func() (bool, string) {
			_, _, _, _, st := w.snapshot()
			return len(st) >= 3 && st[2] == http.StatusTooManyRequests, "statuses " + cmp.Diff([]int(nil), st)
		})
		_, _, open, _, st := w.snapshot()
		if diff := cmp.Diff([]int{200, 200, 429}, st); diff != "" || open != 2 {
			t.Errorf("listen statuses (-want +got):\n%s; open %d, want 2", diff, open)
		}
		// The refused listen started nothing.
		wfID := contract.SubscriptionWorkflowID(p, testSource, "demo://lim/b")
		var nf *serviceerror.NotFound
		if _, err := s.Stack.Client.DescribeWorkflowExecution(ctx, wfID, ""); !errors.As(err, &nf) {
			t.Errorf("the refused listen started workflow %s (describe: %v)", wfID, err)
		}
		// Ending a listen frees its place.
		if err := w.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: GatewayURI(testSource, "demo://lim/a")}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "listen ended", func() (bool, string) {
			_, _, open, _, _ := w.snapshot()
			return open == 1, "still open"
		})
		w.subscribe(ctx, era2026, GatewayURI(testSource, "demo://lim/c"))
	})
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestListChangedOnGrant: a principal whose visible set changes without an outbox row — a
// grant given — is told list_changed (both eras), by the feed's visible-set poll; also when
// the snapshot of the visible set taken at the principal's first request is slow (a loaded
// database): the grant, made after the first answer, is still a change.
func TestListChangedOnGrant(t *testing.T) {
	s := newGWStack(t)
	for _, tc := range []struct {
		era  string
		slow time.Duration // the snapshot of the visible set at the principal's first request waits this long
	}{{era2025, 0}, {era2026, 0}, {era2025, 2 * time.Second}, {era2026, 2 * time.Second}} {
		era := tc.era
		name := era
		if tc.slow > 0 {
			name += " slow snapshot"
		}
		t.Run(name, func(t *testing.T) {
			s.t = t
			t.Cleanup(gateway.DelayVisibleSnapshot(tc.slow))
			p := "frank-" + strings.ReplaceAll(name, " ", "-")
			w := s.mustWatch(p, s.Token(p), era)
			if era == era2026 {
				eventually(t, 20*time.Second, "list_changed listen open", func() (bool, string) {
					_, _, open, _, _ := w.snapshot()
					return open == 1, "no listen open"
				})
			}
			before := w.listChanges()
			s.Grant(p, testSource)
			eventually(t, 20*time.Second, "list_changed after the grant", func() (bool, string) {
				return w.listChanges() > before, "none yet"
			})
			res, err := w.ListResources(s.Ctx, nil)
			if err != nil {
				t.Fatalf("resources/list after the grant: %v", err)
			}
			t.Logf("%d resources visible after the grant", len(res.Resources))
		})
	}
}

// TestFirstVersionAcceptedBeforeRegistration: a version accepted between the subscribe
// handler starting the workflow and the SDK registering the session's subscription (it does
// so only after the handler returns) is still announced to the session, once it is
// registered (both eras). The handler is held until the feed has announced the first
// version to nobody, which forces the race.
//
// The wait for the announcement is long because the outbox is read in commit-safe order: a
// write transaction open anywhere in the PostgreSQL cluster, in another package's database
// too (the test suite shares one cluster), holds back every outbox row committed after it
// began. Held past the handler's 30 s, the first version is announced once that transaction
// ends, to the session registered by then (the race not forced, the version still announced).
func TestFirstVersionAcceptedBeforeRegistration(t *testing.T) {
	s := newGWStack(t)
	t.Cleanup(gateway.HoldSubscribeUntilAnnounced())
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s.t = t
			p, up := "gina-"+era, "demo://race/"+era
			gw := GatewayURI(testSource, up)
			s.Grant(p, testSource)
			s.Put(up, "first")
			w := s.mustWatch(p, s.Token(p), era)
			w.subscribe(s.Ctx, era, gw)
			eventually(t, 3*time.Minute, "first version announced", func() (bool, string) {
				u := w.updates(gw)
				return len(u) > 0 && u[0].Digest == ledger.Digest([]byte("first")), "updates: " + fmtArrivals(u)
			})
		})
	}
}
