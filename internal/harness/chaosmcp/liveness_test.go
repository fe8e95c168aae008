package chaosmcp_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// Live sessions are counted per HTTP listener, with the most ever live at once (issue 12: one
// listener per source shows two clients holding one source); a session from which nothing
// arrives for the idle time is ended by CloseIdleSessions, one that pings is kept.
func TestLiveSessionsPerListener(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	a := startHTTP(t, s)
	b := startHTTP(t, s)
	quiet := dialHTTP(t, a, 0)
	dialHTTP(t, a, 50*time.Millisecond) // pings
	first := dialHTTP(t, b, 0)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Await(testCtx(t), func(st chaosmcp.Stats) bool { return st.LiveByListener[b.ListenerID()] == 0 }); err != nil {
		t.Fatal(err)
	}
	dialHTTP(t, b, 0)
	st := s.Stats()
	want := map[string]int{a.ListenerID(): 2, b.ListenerID(): 1}
	if diff := cmp.Diff(want, st.LiveByListener); diff != "" {
		t.Errorf("live per listener (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, st.MaxLiveByListener); diff != "" {
		t.Errorf("most live at once per listener (-want +got):\n%s", diff)
	}

	time.Sleep(300 * time.Millisecond)
	if n := s.CloseIdleSessions(200 * time.Millisecond); n != 2 {
		t.Errorf("closed %d idle sessions, want 2 (the quiet ones)", n)
	}
	if err := quiet.Ping(testCtx(t), nil); err == nil {
		t.Error("the quiet session still answers after it was closed as idle")
	}
	st = s.Stats()
	if diff := cmp.Diff(map[string]int{a.ListenerID(): 1}, st.LiveByListener); diff != "" {
		t.Errorf("live per listener after closing idle sessions (-want +got):\n%s", diff)
	}
}

// A session closed by its client (HTTP DELETE) stops counting as live when the DELETE is
// answered, not later when its goroutines have wound down: a client that closes its session
// and then connects again at once is never seen with two live sessions (the scale-out test's
// hand-over between hosts).
func TestSessionEndsWhenItsDeleteIsAnswered(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	hs := startHTTP(t, s)
	for i := range 100 {
		if err := dialHTTP(t, hs, 0).Close(); err != nil {
			t.Fatal(err)
		}
		if n := s.Stats().LiveByListener[hs.ListenerID()]; n != 0 {
			t.Fatalf("session %d: %d live right after its DELETE was answered, want 0", i+1, n)
		}
	}
	if n := s.Stats().MaxLiveByListener[hs.ListenerID()]; n != 1 {
		t.Errorf("most live at once: %d, want 1", n)
	}
}
