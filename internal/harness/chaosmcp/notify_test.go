package chaosmcp_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// TestUpdateFaults changes demo://a, demo://b, demo://c (in that order) under one fault, then
// demo://end with faults cleared, and compares what the client received up to demo://end.
func TestUpdateFaults(t *testing.T) {
	tests := []struct {
		name      string
		fault     func(s *chaosmcp.Server)
		want      []string
		wantStats func(st chaosmcp.Stats) bool
	}{
		{
			name:  "none",
			fault: func(*chaosmcp.Server) {},
			want:  []string{"demo://a", "demo://b", "demo://c", "demo://end"},
		},
		{
			name:      "drop next 2",
			fault:     func(s *chaosmcp.Server) { s.DropUpdates(2) },
			want:      []string{"demo://c", "demo://end"},
			wantStats: func(st chaosmcp.Stats) bool { return st.UpdatesDropped == 2 && st.UpdatesSent == 2 },
		},
		{
			name:      "drop rate 1",
			fault:     func(s *chaosmcp.Server) { s.SetUpdateDropRate(1) },
			want:      []string{"demo://end"},
			wantStats: func(st chaosmcp.Stats) bool { return st.UpdatesDropped == 3 },
		},
		{
			name:      "duplicates",
			fault:     func(s *chaosmcp.Server) { s.SetUpdateDuplicates(2) },
			want:      []string{"demo://a", "demo://a", "demo://a", "demo://b", "demo://b", "demo://b", "demo://c", "demo://c", "demo://c", "demo://end"},
			wantStats: func(st chaosmcp.Stats) bool { return st.UpdatesDuplicated == 6 && st.UpdatesSent == 10 },
		},
		{
			name:  "reorder batches of 3",
			fault: func(s *chaosmcp.Server) { s.ReorderUpdates(3) },
			want:  []string{"demo://c", "demo://b", "demo://a", "demo://end"},
		},
		{
			name:  "reorder batches of 2, rest flushed in order",
			fault: func(s *chaosmcp.Server) { s.ReorderUpdates(2) },
			want:  []string{"demo://b", "demo://a", "demo://c", "demo://end"},
		},
		{
			name:  "hold until flushed",
			fault: func(s *chaosmcp.Server) { s.HoldUpdates(true) },
			want:  []string{"demo://a", "demo://b", "demo://c", "demo://end"},
		},
		{
			name:  "upper-case scheme and host",
			fault: func(s *chaosmcp.Server) { s.SetUpdateURIRewrite(chaosmcp.UpperSchemeHost) },
			want:  []string{"DEMO://A", "DEMO://B", "DEMO://C", "demo://end"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{})
			all := []string{"demo://a", "demo://b", "demo://c", "demo://end"}
			for _, u := range all {
				s.Set(u, "v0", "text/plain")
			}
			cs, ev := connect(t, s)
			subscribe(t, cs, all...)
			tt.fault(s)
			for _, u := range all[:3] {
				s.Set(u, "v1", "text/plain")
			}
			s.ClearFaults()
			s.Set("demo://end", "v1", "text/plain")
			if diff := cmp.Diff(tt.want, ev.updatesUntil(t, "demo://end")); diff != "" {
				t.Errorf("updates received (-want +got):\n%s", diff)
			}
			if tt.wantStats != nil && !tt.wantStats(s.Stats()) {
				t.Errorf("stats %+v", s.Stats())
			}
		})
	}
}

func TestHoldUpdatesBuffersUntilFlush(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	s.Set("demo://a", "v0", "text/plain")
	s.Set("demo://b", "v0", "text/plain")
	cs, ev := connect(t, s)
	subscribe(t, cs, "demo://a", "demo://b")
	s.HoldUpdates(true)
	s.Set("demo://a", "v1", "text/plain")
	s.Set("demo://a", "v2", "text/plain")
	if st := s.Stats(); st.UpdatesHeld != 2 || st.UpdatesSent != 0 {
		t.Fatalf("held %d sent %d, want 2 and 0", st.UpdatesHeld, st.UpdatesSent)
	}
	s.FlushUpdates()
	s.Set("demo://b", "v1", "text/plain") // still held: hold stays on after a flush
	s.HoldUpdates(false)
	if diff := cmp.Diff([]string{"demo://a", "demo://a", "demo://b"}, ev.updatesUntil(t, "demo://b")); diff != "" {
		t.Errorf("updates (-want +got):\n%s", diff)
	}
}

func TestUpdateDelay(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	s.Set("demo://slow", "v0", "text/plain")
	s.Set("demo://fast", "v0", "text/plain")
	cs, ev := connect(t, s)
	subscribe(t, cs, "demo://slow", "demo://fast")
	// The delayed notification is sent asynchronously, a second later; the undelayed one
	// written synchronously afterwards overtakes it.
	s.SetUpdateDelay(time.Second)
	s.Set("demo://slow", "v1", "text/plain")
	s.SetUpdateDelay(0)
	s.Set("demo://fast", "v1", "text/plain")
	if diff := cmp.Diff([]string{"demo://fast", "demo://slow"}, []string{ev.nextUpdate(t), ev.nextUpdate(t)}); diff != "" {
		t.Errorf("arrival order (-want +got):\n%s", diff)
	}
}

func TestDropRateIsSeeded(t *testing.T) {
	run := func() []string {
		s := newServer(t, chaosmcp.Options{Seed: 42})
		var uris []string
		for i := range 40 {
			uris = append(uris, fmt.Sprintf("demo://x/%02d", i))
		}
		for _, u := range append(uris, "demo://end") {
			s.Set(u, "v0", "text/plain")
		}
		cs, ev := connect(t, s)
		subscribe(t, cs, append(uris, "demo://end")...)
		s.SetUpdateDropRate(0.5)
		for _, u := range uris {
			s.Set(u, "v1", "text/plain")
		}
		s.SetUpdateDropRate(0)
		s.Set("demo://end", "v1", "text/plain")
		got := ev.updatesUntil(t, "demo://end")
		if st := s.Stats(); st.UpdatesDropped == 0 || st.UpdatesDropped == 40 || st.UpdatesDropped+len(got)-1 != 40 {
			t.Errorf("dropped %d of 40, received %d", st.UpdatesDropped, len(got)-1)
		}
		return got
	}
	if diff := cmp.Diff(run(), run()); diff != "" {
		t.Errorf("same seed, different drops (-first +second):\n%s", diff)
	}
}

func TestURIRewriters(t *testing.T) {
	tests := []struct {
		name string
		f    func(string) string
		in   string
		want string
	}{
		{"encode unreserved", chaosmcp.EncodeUnreserved, "demo://host.x/~user/a-b_c.txt?q=~#f.g", "demo://host.x/%7Euser/a%2Db%5Fc%2Etxt?q=%7E#f%2Eg"},
		{"encode unreserved opaque", chaosmcp.EncodeUnreserved, "urn:a.b", "urn:a%2Eb"},
		{"encode unreserved nothing to do", chaosmcp.EncodeUnreserved, "demo://x/a", "demo://x/a"},
		{"upper scheme host", chaosmcp.UpperSchemeHost, "demo://user@notes.local:80/a/b", "DEMO://user@NOTES.LOCAL:80/a/b"},
		{"upper scheme opaque", chaosmcp.UpperSchemeHost, "urn:x:y", "URN:x:y"},
		{"upper scheme no path", chaosmcp.UpperSchemeHost, "demo://host", "DEMO://HOST"},
		{"lower hex", chaosmcp.LowerHexEscapes, "demo://x/a%2Fb%7E", "demo://x/a%2fb%7e"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.f(tt.in)
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			// The rewrite is a different string for the same resource under RFC 3986.
			if !uri.Equal(tt.in, got) {
				t.Errorf("uri.Equal(%q, %q) = false", tt.in, got)
			}
		})
	}
}

func TestURIEncodingConfusionOnTheWire(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	const original = "demo://Notes.Local/~user/a%2Fb"
	s.Set(original, "v0", "text/plain")
	cs, ev := connect(t, s)
	subscribe(t, cs, original)
	s.SetUpdateURIRewrite(func(u string) string {
		return chaosmcp.LowerHexEscapes(chaosmcp.UpperSchemeHost(chaosmcp.EncodeUnreserved(u)))
	})
	s.Set(original, "v1", "text/plain")
	got := ev.nextUpdate(t)
	if want := "DEMO://NOTES.LOCAL/%7euser/a%2fb"; got != want {
		t.Errorf("notified URI %q, want %q", got, want)
	}
	if got == original || !uri.Equal(got, original) {
		t.Errorf("notified %q should differ from %q as a string and match after normalization", got, original)
	}
}

func TestUnsubscribeFaults(t *testing.T) {
	tests := []struct {
		name            string
		mode            chaosmcp.UnsubscribeMode
		wantSubscribers []int
		wantUpdates     []string
	}{
		{"normal", chaosmcp.UnsubscribeNormal, nil, []string{"demo://end"}},
		{"hang keeps the subscription", chaosmcp.UnsubscribeHang, []int{1}, []string{"demo://a", "demo://end"}},
		{"response lost after unsubscribing", chaosmcp.UnsubscribeLoseResponse, nil, []string{"demo://end"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{})
			s.Set("demo://a", "v0", "text/plain")
			s.Set("demo://end", "v0", "text/plain")
			cs, ev := connect(t, s)
			subscribe(t, cs, "demo://a", "demo://end")
			s.SetUnsubscribeMode(tt.mode)
			ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
			defer cancel()
			err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "demo://a"})
			if tt.mode == chaosmcp.UnsubscribeNormal {
				if err != nil {
					t.Fatalf("unsubscribe: %v", err)
				}
			} else if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("unsubscribe = %v, want no answer (deadline exceeded)", err)
			}
			if diff := cmp.Diff(tt.wantSubscribers, s.Subscribers("demo://a")); diff != "" {
				t.Errorf("subscribers (-want +got):\n%s", diff)
			}
			s.Set("demo://a", "v1", "text/plain")
			s.Set("demo://end", "v1", "text/plain")
			if diff := cmp.Diff(tt.wantUpdates, ev.updatesUntil(t, "demo://end")); diff != "" {
				t.Errorf("updates (-want +got):\n%s", diff)
			}
			st := s.Stats()
			wantUnanswered := 1
			if tt.mode == chaosmcp.UnsubscribeNormal {
				wantUnanswered = 0
			}
			if st.UnsubscribeCalls != 1 || st.UnsubscribesUnanswered != wantUnanswered {
				t.Errorf("unsubscribe calls %d unanswered %d, want 1 and %d", st.UnsubscribeCalls, st.UnsubscribesUnanswered, wantUnanswered)
			}
		})
	}
}

func TestRestartInMemory(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	s.Set("demo://a", "v0", "text/plain")
	cs, _ := connect(t, s)
	subscribe(t, cs, "demo://a")

	// A read held at a gate that nobody opens, and an unanswered unsubscribe, must not keep
	// the restart from ending the session.
	gate := chaosmcp.NewGate()
	s.AddReadFault(chaosmcp.ReadFault{URI: "demo://a", Gate: gate})
	readErr := make(chan error, 1)
	go func() {
		_, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: "demo://a"})
		readErr <- err
	}()
	<-gate.Arrived()

	if got := s.Restart(); got != 1 || s.Epoch() != 1 {
		t.Errorf("Restart() = %d, Epoch() = %d, want 1", got, s.Epoch())
	}
	if err := <-readErr; err == nil {
		t.Errorf("the held read succeeded across a restart")
	}
	done := make(chan error, 1)
	go func() { done <- cs.Wait() }()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("client session still open after Restart")
	}
	st := s.Stats()
	if st.LiveSessions != 0 || st.Epoch != 1 || len(st.Subscriptions) != 0 {
		t.Errorf("after restart: %+v", st)
	}

	s.ClearFaults()
	cs2, ev2 := connect(t, s)
	sessions := s.Sessions()
	if diff := cmp.Diff([]chaosmcp.SessionInfo{{
		Seq: 2, Epoch: 1, ProtocolVersion: chaosmcp.ProtocolVersion,
		Capabilities: chaosmcp.DefaultCapabilities, Subscriptions: []string{},
	}}, sessions); diff != "" {
		t.Errorf("sessions after restart (-want +got):\n%s", diff)
	}
	subscribe(t, cs2, "demo://a")
	s.Set("demo://a", "v1", "text/plain")
	if got := ev2.nextUpdate(t); got != "demo://a" {
		t.Errorf("updated on the new session: %q", got)
	}
}

func TestClosedServerRefusesSessions(t *testing.T) {
	s := chaosmcp.New(chaosmcp.Options{})
	cs, _ := connect(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_ = cs.Wait() // returns once the server ended the session; its error is not the point
	if _, err := s.ConnectInMemory(testCtx(t), nil); err == nil {
		t.Errorf("a closed server accepted a session")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSendUpdate(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	s.Set("demo://a", "v0", "text/plain")
	old, oldEv := connect(t, s)
	subscribe(t, old, "demo://a")
	// The client reconnects but keeps its first session open: the server can still notify
	// the old session, and notify URIs nobody subscribed to.
	_, newEv := connect(t, s)
	if err := s.SendUpdate(1, "demo://a"); err != nil {
		t.Fatalf("SendUpdate to session 1: %v", err)
	}
	if err := s.SendUpdate(2, "demo://never-listed"); err != nil {
		t.Fatalf("SendUpdate to session 2: %v", err)
	}
	if got := oldEv.nextUpdate(t); got != "demo://a" {
		t.Errorf("old session got %q", got)
	}
	if got := newEv.nextUpdate(t); got != "demo://never-listed" {
		t.Errorf("new session got %q", got)
	}
	if err := s.SendUpdate(99, "demo://a"); err == nil {
		t.Errorf("SendUpdate to a missing session succeeded")
	}
	// SendUpdate goes through the notification faults.
	s.DropUpdates(1)
	if err := s.SendUpdate(1, "demo://dropped"); err != nil {
		t.Fatal(err)
	}
	if err := s.SendUpdate(1, "demo://kept"); err != nil {
		t.Fatal(err)
	}
	if got := oldEv.nextUpdate(t); got != "demo://kept" {
		t.Errorf("after a dropped SendUpdate the old session got %q", got)
	}
}
