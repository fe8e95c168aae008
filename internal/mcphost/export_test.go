package mcphost

import (
	"slices"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// Holders returns the IDs of the subscriptions holding the server-side subscription of
// serverURI on this session, sorted.
func (c *Conn) Holders(serverURI string) []int64 {
	us := c.uriSub(serverURI, false)
	if us == nil {
		return nil
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	out := make([]int64, 0, len(us.holders))
	for id := range us.holders {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// LastPulse returns when the latest notification for serverURI reached this session.
func (c *Conn) LastPulse(serverURI string) (time.Time, bool) {
	r, ok := c.pulseRunAt(pulseKey(serverURI))
	return r.last, ok
}

// NewPulseConn returns a connection with no session, for the read quieting alone (NotePulse,
// QuietFor, AwaitQuiet).
func NewPulseConn() *Conn { return &Conn{} }

// NotePulse records a notification for serverURI as arrived at at, as the session's handler
// does.
func (c *Conn) NotePulse(serverURI string, at time.Time) {
	c.nmu.Lock()
	defer c.nmu.Unlock()
	c.notePulse(serverURI, at)
}

// QuietFor returns the quiet period a read of serverURI waits for now.
func (c *Conn) QuietFor(serverURI string) time.Duration {
	r, _ := c.pulseRunAt(pulseKey(serverURI))
	return r.quiet()
}

// ReadQuiet, BurstQuiet and ReadQuietMax are AwaitQuiet's quiet periods and cap; BurstPulses
// is how many notifications in a row make a burst.
const (
	ReadQuiet    = readQuiet
	BurstQuiet   = burstQuiet
	BurstPulses  = burstPulses
	ReadQuietMax = readQuietMax
)

// ControlAcknowledged reports whether the set's current control stream (list-changed) has
// been acknowledged.
func (l *ListenSet) ControlAcknowledged() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.control != nil && l.control.acked
}

// SetTapEndHook makes every HTTP listen tap run f when its stream's body has ended, before it
// decides how the stream ended (nil: none).
func SetTapEndHook(f func()) { tapEndHook = f }

// SignalPending reports whether a notification of the server URI u needs no delivery to t now:
// t holds a pending one no read has answered (signalPending).
func (c *Conn) SignalPending(u string, t ledger.NotificationTarget) bool {
	norm, err := uri.Normalize(u)
	if err != nil {
		norm = u
	}
	return c.signalPending(norm, t)
}
