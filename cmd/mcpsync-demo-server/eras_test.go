package main_test

import (
	"context"
	"os/exec"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestErasFlag: by default the demo server speaks the legacy era only (a go-sdk client that
// negotiates freely gets 2025-11-25); with --eras both a go-sdk client negotiates 2026-07-28.
func TestErasFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{args: nil, want: "2025-11-25"},
		{args: []string{"--eras", "both"}, want: "2026-07-28"},
	} {
		t.Run(tt.want, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			cmd := exec.Command(binary, append([]string{"--interval", "1h"}, tt.args...)...)
			c := mcp.NewClient(&mcp.Implementation{Name: "eras", Version: "0"}, nil)
			cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != tt.want {
				t.Errorf("negotiated %s, want %s", got, tt.want)
			}
			if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://notes/1"}); err != nil {
				t.Errorf("read demo://notes/1 at %s: %v", tt.want, err)
			}
		})
	}
}

// TestUnwatchedLeftOutOfAck: with --eras both, a 2026-07-28 client's listen acknowledgement
// leaves out the --unwatched resources (by default the computed demo://clock/now) and no
// updated notification for them reaches a listen stream, while demo://notes/1 is acknowledged
// and notified; --unwatched "" watches everything; a legacy (2025-11-25) session is told of
// every change of both, as its subscribe was answered (issue 13 item 11).
func TestUnwatchedLeftOutOfAck(t *testing.T) {
	const clock, note = "demo://clock/now", "demo://notes/1"
	for _, tt := range []struct {
		name        string
		args        []string
		wantAcked   []string // the URIs acknowledged over all acks (nil: no ack, legacy)
		wantClockUp bool     // updates of demo://clock/now arrive
	}{
		{name: "legacy", args: nil, wantClockUp: true},
		{name: "modern default", args: []string{"--eras", "both"}, wantAcked: []string{note}},
		{name: "modern watch all", args: []string{"--eras", "both", "--unwatched", ""}, wantAcked: []string{clock, note}, wantClockUp: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			var (
				mu     sync.Mutex
				acked  []string
				asked  int
				counts = map[string]int{}
			)
			updated := make(chan string, 1000)
			c := mcp.NewClient(&mcp.Implementation{Name: "unwatched-test", Version: "0"}, &mcp.ClientOptions{
				ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
					updated <- req.Params.URI
				},
			})
			acks := make(chan struct{}, 100)
			c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok && method == "notifications/subscriptions/acknowledged" {
						mu.Lock()
						acked = append(acked, p.Notifications.ResourceSubscriptions...)
						asked++
						mu.Unlock()
						acks <- struct{}{}
					}
					return next(ctx, method, req)
				}
			})
			cmd := exec.Command(binary, append([]string{"--interval", "100ms"}, tt.args...)...)
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatalf("connect: %v\nstderr:\n%s", err, stderr)
			}
			defer cs.Close()
			for _, u := range []string{clock, note} {
				if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: u}); err != nil {
					t.Fatalf("subscribe %s: %v", u, err)
				}
			}
			if tt.wantAcked != nil { // one listen per URI (go-sdk client): two acks
				for range 2 {
					select {
					case <-acks:
					case <-ctx.Done():
						t.Fatalf("acknowledgements: %v\nstderr:\n%s", ctx.Err(), stderr)
					}
				}
			}
			// The server changes both every tick, the clock first: three updates of the
			// note come after any update of the clock in the same or an earlier tick.
			for counts[note] < 3 {
				select {
				case u := <-updated:
					counts[u]++
				case <-ctx.Done():
					t.Fatalf("updates so far %v: %v\nstderr:\n%s", counts, ctx.Err(), stderr)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			slices.Sort(acked)
			if d := cmp.Diff(tt.wantAcked, acked); d != "" {
				t.Errorf("acknowledged URIs over %d acks (-want +got):\n%s", asked, d)
			}
			if got := counts[clock] > 0; got != tt.wantClockUp {
				t.Errorf("updates of %s arrived: %t (%d), want %t", clock, got, counts[clock], tt.wantClockUp)
			}
		})
	}
}
