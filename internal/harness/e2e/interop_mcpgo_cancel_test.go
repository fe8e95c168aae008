package e2e_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/mcpgoserver"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Ending one listen stream must not end the session (issue 13 items 2 and 10): two
// subscriptions on an mcp-go v1.2.1 server ride on two listen streams (subscribed one after
// the other); unsubscribing one cancels its stream, which the go-sdk client does by closing
// the stream and sending notifications/cancelled. The server stops watching that URI, the
// session keeps its generation, and the other subscription goes on receiving updates on it.
// (Over HTTP mcp-go answers 400 to a 2026-07-28 notification without the protocol version
// in _meta, and a 4xx answer to a notification closes the go-sdk's connection.)
func TestInteropMcpGoUnsubscribeKeepsSession(t *testing.T) {
	for _, tt := range mcpgoTransports {
		t.Run(tt.name, func(t *testing.T) {
			const dropped, kept = "demo://mcpgo/dropped", "demo://mcpgo/kept"
			s := newStack(t)
			srv := mcpgoserver.New("mcpgo")
			srv.Set(dropped, "d1\n")
			srv.Set(kept, "k1\n")
			s.mustCLI(append(append([]string{"source", "add", "mcpgo"}, tt.serve(t, srv)...), "--backstop", "1h")...)
			src := s.source("mcpgo")
			w := s.worker()
			c := s.liveSession(w, src.ID, 0)
			for _, u := range []string{dropped, kept} {
				s.mustCLI("subscribe", "mcpgo", u)
				eventually(t, 30*time.Second, "the server watches "+u, func() (bool, string) {
					return slices.Contains(srv.Watching(), u), fmt.Sprintf("watching %v", srv.Watching())
				})
			}
			s.mustCLI("unsubscribe", "mcpgo", dropped)
			eventually(t, 30*time.Second, "the server stops watching the unsubscribed URI", func() (bool, string) {
				got := srv.Watching()
				return cmp.Equal(got, []string{kept}), fmt.Sprintf("watching %v", got)
			})

			srv.Set(kept, "k2\n")
			sub := s.waitDigest("mcpgo", kept, ledger.Digest([]byte("k2\n")))
			type view struct {
				CurrentGeneration int64
				State             mcpsync.State
				Generation        int64
				ReadReason        string
				ReadGeneration    int64
			}
			cur, _ := w.Host.Current(src.ID)
			var curGen int64
			if cur != nil {
				curGen = cur.Generation()
			}
			read := s.acceptedRead(sub.ID, ledger.Digest([]byte("k2\n")))
			want := view{c.Generation(), mcpsync.StateActive, c.Generation(), string(mcpsync.ReasonNotification), c.Generation()}
			got := view{curGen, sub.State, sub.SessionGeneration, read.Reason, read.SessionGeneration}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after the unsubscribe (-want +got):\n%s\nsubscription reason %q", diff, sub.StateReason)
			}
			if got := s.mustCLI("get", "mcpgo", kept); got != "k2\n" {
				t.Errorf("get = %q", got)
			}
		})
	}
}

// A listen the server refuses is a failed subscribe of its URIs, retried, and nothing more
// (issue 13 items 3 and 10): mcp-go v1.2.1 has no partial acknowledgement and refuses a whole
// listen when it cannot subscribe one of its URIs (over HTTP with a 400). The host cancels the
// refused stream (notifications/cancelled); the session keeps its generation through the
// retries, and a URI subscribed later on the same session is watched and updated.
func TestInteropMcpGoRefusedListen(t *testing.T) {
	for _, tt := range mcpgoTransports {
		t.Run(tt.name, func(t *testing.T) {
			const refused, good = "demo://mcpgo/refused", "demo://mcpgo/good"
			s := newStack(t)
			srv := mcpgoserver.New("mcpgo")
			srv.Set(refused, "r1\n")
			srv.Set(good, "g1\n")
			srv.RefuseSubscriptions(refused)
			s.mustCLI(append(append([]string{"source", "add", "mcpgo"}, tt.serve(t, srv)...), "--backstop", "1h")...)
			src := s.source("mcpgo")
			w := s.worker()
			c := s.liveSession(w, src.ID, 0)
			if _, _, code := s.cli("subscribe", "mcpgo", refused, "--wait", "3s"); code == 0 {
				t.Fatalf("subscribe %s succeeded; the server refuses every listen asking for it", refused)
			}
			var sub ledger.Subscription
			eventually(t, 30*time.Second, "the refused subscribe tried again", func() (bool, string) {
				sub = s.sub("mcpgo", refused)
				marks := 0
				for _, r := range s.receiptsSince(sub.ID, 0) {
					if r.Kind == string(mcpsync.ReceiptReconciliationRequired) {
						marks++
					}
				}
				return marks >= 2, fmt.Sprintf("%s (%q), %d failed subscribes", sub.State, sub.StateReason, marks)
			})
			if sub.State == mcpsync.StateActive || sub.LastAcceptedDigest != "" {
				t.Errorf("refused subscription %s with digest %q", sub.State, sub.LastAcceptedDigest)
			}

			s.mustCLI("subscribe", "mcpgo", good)
			srv.Set(good, "g2\n")
			ok := s.waitDigest("mcpgo", good, ledger.Digest([]byte("g2\n")))
			cur, _ := w.Host.Current(src.ID)
			var curGen int64
			if cur != nil {
				curGen = cur.Generation()
			}
			type view struct {
				CurrentGeneration, RefusedGeneration, GoodGeneration int64
				Watching                                             []string
			}
			want := view{c.Generation(), c.Generation(), c.Generation(), []string{good}}
			got := view{curGen, s.sub("mcpgo", refused).SessionGeneration, ok.SessionGeneration, srv.Watching()}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after the refused listens (-want +got):\n%s\nrefused subscription: %q", diff, s.sub("mcpgo", refused).StateReason)
			}
		})
	}
}

// mcpgoTransports are the two ways the mcp-go server is reached, for tests that run over both.
var mcpgoTransports = []struct {
	name  string
	serve func(t *testing.T, srv *mcpgoserver.Server) []string
}{
	{"http", serveMcpgoHTTP},
	{"stdio", serveMcpgoStdio},
}
