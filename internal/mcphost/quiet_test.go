package mcphost_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// quietSession starts a host with one live session on a chaos server over HTTP, the source
// named name.
func quietSession(t *testing.T, name string) (*fixture, *chaosmcp.Server, *mcphost.Conn) {
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	src := f.addSource(ledger.SourceSpec{Name: name, Transport: ledger.TransportHTTP, URL: hs.URL})
	h := f.startHost("host-"+name, mcphost.Options{}, newRecorder())
	return f, srv, f.waitSession(h, src.ID, 0)
}

// R13, R27: a read waits until its URI has been quiet, so that every copy of a burst of
// notifications reaches the host before the read is sent and is covered by it; a URI with no
// recent notification is read at once.
func TestAwaitQuietCoversABurst(t *testing.T) {
	f, srv, c := quietSession(t, "quiet")
	const u = "chaos://quiet/burst"

	// No notification yet: no wait at all (the call returns before any burst could start).
	c.AwaitQuiet(f.ctx, u)
	if _, ok := c.LastPulse(u); ok {
		t.Fatal("a pulse recorded before any notification was sent")
	}

	// A burst of 20 copies 10 ms apart, sent while a read waits to be sent.
	seq := srv.Sessions()[0].Seq
	const copies = 20
	sentAll := make(chan struct{})
	go func() {
		defer close(sentAll)
		for range copies {
			if err := srv.SendUpdate(seq, u); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	waitFor(t, 10*time.Second, "the first copy reaches the host", func() (bool, string) {
		_, ok := c.LastPulse(u)
		return ok, "no pulse yet"
	})
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	// The latest copy the host had when the read was about to be sent: AwaitQuiet waits for a
	// quiet period after it (or after a later copy), unless its cap ends the wait first.
	lastBefore, _ := c.LastPulse(u)
	start := time.Now()
	c.AwaitQuiet(ctx, u)
	returned := time.Now()
	<-sentAll
	if quiet := returned.Sub(lastBefore); quiet < mcphost.ReadQuiet && returned.Sub(start) < mcphost.ReadQuietMax {
		t.Errorf("AwaitQuiet returned %s after a copy it had already seen and %s after it was called; want >= %s quiet or the %s cap",
			quiet, returned.Sub(start), mcphost.ReadQuiet, mcphost.ReadQuietMax)
	}
}

// R13, R27: on a loaded machine the copies of one change reach the host with pauses much
// longer than the server's spacing. A lone notification is read after ReadQuiet; once a URI is
// in a burst, its read waits for BurstQuiet of quiet, so a pause shorter than that within the
// burst does not let the read go out before the copies after the pause (each of which would
// cost a follow-up read).
func TestAwaitQuietWaitsOutAPauseInABurst(t *testing.T) {
	f, srv, c := quietSession(t, "quiet-pause")
	const lone, u = "chaos://quiet-pause/lone", "chaos://quiet-pause/burst"
	seq := srv.Sessions()[0].Seq

	if err := srv.SendUpdate(seq, lone); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the lone notification reaches the host", func() (bool, string) {
		return c.PulsesInBurst(lone) == 1, "no pulse yet"
	})
	if got := c.QuietFor(lone); got != mcphost.ReadQuiet {
		t.Errorf("quiet period after a lone notification = %s, want %s", got, mcphost.ReadQuiet)
	}

	// Two groups of copies 5 ms apart with a pause between them longer than ReadQuiet and
	// shorter than BurstQuiet, sent while a read waits to be sent.
	const group, pause = 5, 120 * time.Millisecond
	send := func() bool {
		for range group {
			if err := srv.SendUpdate(seq, u); err != nil {
				t.Error(err)
				return false
			}
			time.Sleep(5 * time.Millisecond)
		}
		return true
	}
	sentAll := make(chan struct{})
	go func() {
		defer close(sentAll)
		if send() {
			time.Sleep(pause)
			send()
		}
	}()
	waitFor(t, 10*time.Second, "the first group reaches the host", func() (bool, string) {
		return c.PulsesInBurst(u) >= group, "not every copy of the first group yet"
	})
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	c.AwaitQuiet(ctx, u)
	returned := time.Now()
	<-sentAll
	waitFor(t, 10*time.Second, "the second group reaches the host", func() (bool, string) {
		last, _ := c.LastPulse(u)
		return c.PulsesInBurst(u) == 2*group || last.After(returned), "not every copy of the second group yet"
	})
	if last, _ := c.LastPulse(u); last.After(returned) {
		t.Errorf("AwaitQuiet returned in the %s pause of a burst, %s before its last copy arrived", pause, last.Sub(returned))
	}
	if got := c.QuietFor(u); got != mcphost.BurstQuiet {
		t.Errorf("quiet period in a burst = %s, want %s", got, mcphost.BurstQuiet)
	}
}
