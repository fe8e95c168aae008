package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/mcpgoserver"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// mcpgoRelayArg, as the test binary's first argument, makes it the stdio process of an mcp-go
// source (mcpgoserver.Relay): it connects to the in-test server's listener at the second
// argument. The server's state lives in the test, so killing this process is a server process
// restart that keeps the resources.
const mcpgoRelayArg = "mcpsync-mcpgo-relay"

func init() {
	if len(os.Args) == 3 && os.Args[1] == mcpgoRelayArg {
		if err := mcpgoserver.Relay(os.Args[2], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// serveMcpgoHTTP serves srv over streamable HTTP on a free 127.0.0.1 port, stopped by the test,
// and returns the source flags that reach it.
func serveMcpgoHTTP(t *testing.T, srv *mcpgoserver.Server) []string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return []string{"--url", "http://" + ln.Addr().String() + "/mcp"}
}

// serveMcpgoStdio serves srv's stdio on a free 127.0.0.1 port, stopped by the test, and
// returns the source flags of a stdio source whose process is this test binary as a relay to
// it.
func serveMcpgoStdio(t *testing.T, srv *mcpgoserver.Server) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeListener(ctx, ln)
	}()
	t.Cleanup(func() { cancel(); _ = ln.Close(); <-done })
	return []string{"--stdio", exe + " " + mcpgoRelayArg + " " + ln.Addr().String()}
}

// sourceEra is the era `source list --json` shows for the source.
func (s *stack) sourceEra(name string) string {
	s.t.Helper()
	var list []struct {
		Name   string `json:"name"`
		Health *struct {
			Era string `json:"era"`
		} `json:"health"`
	}
	if err := json.Unmarshal([]byte(s.mustCLI("source", "list", "--json")), &list); err != nil {
		s.t.Fatal(err)
	}
	for _, x := range list {
		if x.Name == name && x.Health != nil {
			return x.Health.Era
		}
	}
	return ""
}

// Interop with an independent MCP 2026-07-28 implementation (issue 13 item 10): a server on
// github.com/mark3labs/mcp-go v1.2.1 (internal/harness/mcpgoserver), added with the default
// --protocol auto, negotiates 2026-07-28 (the capability receipt and `source list` show it),
// and discovery publishes a catalog of its resource. A subscription rides on its
// subscriptions/listen stream: the acknowledgement makes it ACTIVE (watched, not polled), and
// an update made on the server becomes a new accepted version, read because of the
// notification. Then the stream is lost while the server holds every new listen back, and the
// resource changes meanwhile, notified to nobody (nothing is replayed in this era); once
// listens are let through, the subscription leaves ACTIVE, re-listens and re-reads (reason
// session_change) and accepts the change; a later update is again delivered as a notification
// on the new stream; `mcpsync get` returns the server's bytes.
//
// How the stream is lost, per transport: over streamable HTTP the server cuts the live listen
// responses mid-stream (a transport drop, no complete result): a listen epoch of the same
// session generation. Over stdio a listen stream cannot be cut alone; mcp-go can end a listen
// only with its complete result, which the host also takes as a listen epoch (same
// generation); or the server process dies (the stdio process is this test binary relaying to
// the in-test server, killed by PID), which ends the connection: the host starts the process
// again as a new session generation.
func TestInteropMcpGo(t *testing.T) {
	tests := []struct {
		name  string
		serve func(t *testing.T, srv *mcpgoserver.Server) []string
		// lose ends the listen stream carrying the subscription.
		lose func(t *testing.T, srv *mcpgoserver.Server)
		// newGeneration: losing the stream ends the session (the re-read is on the next
		// generation); otherwise it is a listen epoch of the same generation.
		newGeneration bool
	}{
		{"http listen stream cut", serveMcpgoHTTP, func(t *testing.T, srv *mcpgoserver.Server) {
			if n := srv.DropListenStreams(); n == 0 {
				t.Fatal("no live HTTP listen stream to cut")
			}
		}, false},
		{"stdio listen ended by mcp-go", serveMcpgoStdio, func(t *testing.T, srv *mcpgoserver.Server) {
			if n := srv.EndListenStreams(); n == 0 {
				t.Fatal("no live listen to end")
			}
		}, false},
		{"stdio server process restarted", serveMcpgoStdio, func(t *testing.T, _ *mcpgoserver.Server) {
			kill(t, childPID(t, mcpgoRelayArg))
		}, true},
	}
	const uri = "demo://mcpgo/notes/1"
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStack(t)
			srv := mcpgoserver.New("mcpgo")
			srv.Set(uri, "v1\n")
			s.mustCLI(append(append([]string{"source", "add", "mcpgo"}, tt.serve(t, srv)...), "--backstop", "1h")...)
			src := s.source("mcpgo")
			w := s.worker()
			c := s.liveSession(w, src.ID, 0)
			if caps := c.Caps(); caps.ProtocolVersion != mcpsync.ProtocolVersion20260728 || !caps.Resources || !caps.Subscribe || caps.ServerName != "mcpgo" {
				t.Fatalf("capability receipt %+v, want era %s with resources and subscribe from mcpgo", caps, mcpsync.ProtocolVersion20260728)
			}
			if stored, err := s.st.CurrentSession(s.ctx, src.ID); err != nil || stored.Generation != c.Generation() ||
				stored.Caps.ProtocolVersion != mcpsync.ProtocolVersion20260728 {
				t.Fatalf("stored capability receipt %+v, %v; want era %s on generation %d", stored, err, mcpsync.ProtocolVersion20260728, c.Generation())
			}
			eventually(t, 30*time.Second, "source list shows the era", func() (bool, string) {
				era := s.sourceEra("mcpgo")
				return era == mcpsync.ProtocolVersion20260728, "era " + era
			})
			// Discovery lists the server's resources in this era too.
			if diff := cmp.Diff([]string{uri}, s.entryURIs(s.waitCatalog(src, "a catalog of the mcp-go server", anyCatalog))); diff != "" {
				t.Errorf("catalog entries (-server +catalog):\n%s", diff)
			}

			s.mustCLI("subscribe", "mcpgo", uri)
			first := s.waitDigest("mcpgo", uri, ledger.Digest([]byte("v1\n")))
			if first.State != mcpsync.StateActive || first.NotAcknowledged || first.SessionGeneration != c.Generation() {
				t.Fatalf("subscribed: %s (%q), not acknowledged %v, generation %d; want ACTIVE on the acknowledged stream of generation %d",
					first.State, first.StateReason, first.NotAcknowledged, first.SessionGeneration, c.Generation())
			}
			if got := srv.Watching(); !slices.Contains(got, uri) {
				t.Fatalf("the server watches %v, not %s", got, uri)
			}

			// An update on the server: notified on the listen stream, read, accepted.
			srv.Set(uri, "v2\n")
			sub := s.waitDigest("mcpgo", uri, ledger.Digest([]byte("v2\n")))
			if last := s.acceptedRead(sub.ID, ledger.Digest([]byte("v2\n"))); last.Reason != string(mcpsync.ReasonNotification) {
				t.Errorf("v2 accepted by %+v, want a read caused by the notification", last)
			}

			// The stream is lost; a change made while nothing watches is notified to nobody.
			lastReceipt := s.lastReceiptID(sub.ID)
			release := srv.HoldListens()
			defer release()
			tt.lose(t, srv)
			eventually(t, 30*time.Second, "the server stops watching", func() (bool, string) {
				got := srv.Watching()
				return !slices.Contains(got, uri), fmt.Sprintf("watching %v", got)
			})
			sent := srv.Stats().UpdatesSent
			srv.Set(uri, "v3 changed while the stream was down\n")
			if got := srv.Stats().UpdatesSent; got != sent {
				t.Fatalf("%d updates sent while the stream was down", got-sent)
			}
			release()

			v3 := ledger.Digest([]byte("v3 changed while the stream was down\n"))
			after := s.waitDigest("mcpgo", uri, v3)
			gen := c.Generation()
			if tt.newGeneration {
				gen = s.liveSession(w, src.ID, c.Generation()).Generation()
			}
			read := s.acceptedRead(after.ID, v3)
			if read.Reason != string(mcpsync.ReasonSessionChange) || read.SessionGeneration != gen {
				t.Errorf("the change made while the stream was down was accepted by %+v; want a re-read (session_change) on generation %d (all reads %+v)",
					read, gen, s.dispatches(after.ID))
			}
			eventually(t, 30*time.Second, "the re-established subscription is active and watched", func() (bool, string) {
				after = s.sub("mcpgo", uri)
				return after.State == mcpsync.StateActive && !after.NotAcknowledged && after.SessionGeneration == gen && slices.Contains(srv.Watching(), uri),
					fmt.Sprintf("%s (%q) on generation %d, not acknowledged %v, server watching %v", after.State, after.StateReason,
						after.SessionGeneration, after.NotAcknowledged, srv.Watching())
			})
			// The ledger saw the subscription leave ACTIVE and come back before the re-read: on
			// the same generation for a listen epoch, on the next after a new session.
			type step struct {
				Kind        string
				Generation  int64
				ListenEpoch bool
			}
			var got []step
			for _, r := range s.receiptsSince(after.ID, lastReceipt) {
				got = append(got, step{r.Kind, r.SessionGeneration, strings.Contains(r.Detail, "listen stream ended")})
				if r.Kind == string(mcpsync.OutcomeAccepted) {
					break
				}
			}
			want := []step{{string(mcpsync.ReceiptReconciliationRequired), gen, true}, {string(mcpsync.ReceiptSubscribing), gen, false},
				{string(mcpsync.ReceiptActivated), gen, false}, {string(mcpsync.OutcomeAllocated), gen, false}, {string(mcpsync.OutcomeAccepted), gen, false}}
			if tt.newGeneration {
				want[0] = step{string(mcpsync.ReceiptSessionChanged), c.Generation(), false}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("receipts from the loss of the stream to the accepted re-read (-want +got):\n%s", diff)
			}
			if !tt.newGeneration {
				if cur, ok := w.Host.Current(src.ID); !ok || cur.Generation() != c.Generation() {
					t.Errorf("a listen epoch changed the session: current %v", ok)
				}
			}

			// The re-opened stream delivers updates again.
			srv.Set(uri, "v4\n")
			sub = s.waitDigest("mcpgo", uri, ledger.Digest([]byte("v4\n")))
			if last := s.acceptedRead(sub.ID, ledger.Digest([]byte("v4\n"))); last.Reason != string(mcpsync.ReasonNotification) || last.SessionGeneration != gen {
				t.Errorf("v4 accepted by %+v, want a read caused by a notification on generation %d", last, gen)
			}
			if got := s.mustCLI("get", "mcpgo", uri); got != "v4\n" {
				t.Errorf("get = %q, want the server's bytes %q", got, "v4\n")
			}
			st := srv.Stats()
			t.Logf("server: %d listens served, %d updates sent, %d HTTP streams cut, %d listens ended, %d stdio connections, reads %v",
				st.Listens, st.UpdatesSent, st.ListenStreamsDropped, st.ListensEnded, st.StdioConnections, st.Reads)
			s.checkInvariants()
		})
	}
}

// acceptedRead returns the subscription's read dispatch that accepted the version with
// digest (the zero dispatch when none did).
func (s *stack) acceptedRead(subID int64, digest string) dispatch {
	s.t.Helper()
	vs, err := s.st.Versions(s.ctx, subID)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, v := range vs {
		if v.Digest != digest {
			continue
		}
		for _, d := range s.dispatches(subID) {
			if d.Ordinal == v.ReadOrdinal {
				return d
			}
		}
	}
	return dispatch{}
}

// receipt is one receipts row of a subscription, as the tests compare them.
type receipt struct {
	ID                int64
	Kind              string
	SessionGeneration int64
	Detail            string
}

// receiptsSince returns the subscription's receipts with an ID above after, in order.
func (s *stack) receiptsSince(subID, after int64) []receipt {
	s.t.Helper()
	rows, err := s.st.Pool().Query(s.ctx, `SELECT id, kind, coalesce(session_generation, 0), coalesce(detail::text, '')
		FROM receipts WHERE subscription_id = $1 AND id > $2 ORDER BY id`, subID, after)
	if err != nil {
		s.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[receipt])
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// lastReceiptID is the ID of the subscription's newest receipt (0: none).
func (s *stack) lastReceiptID(subID int64) int64 {
	s.t.Helper()
	var id int64
	if err := s.st.Pool().QueryRow(s.ctx, `SELECT coalesce(max(id), 0) FROM receipts WHERE subscription_id = $1`, subID).Scan(&id); err != nil {
		s.t.Fatal(err)
	}
	return id
}
