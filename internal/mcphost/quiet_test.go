package mcphost_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// R13, R27: a read waits until its URI has been quiet, so that every copy of a burst of
// notifications reaches the host before the read is sent and is covered by it; a URI with no
// recent notification is read at once.
func TestAwaitQuietCoversABurst(t *testing.T) {
	f := newFixture(t)
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	src := f.addSource(ledger.SourceSpec{Name: "quiet", Transport: ledger.TransportHTTP, URL: hs.URL})
	h := f.startHost("host-quiet", mcphost.Options{}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
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
