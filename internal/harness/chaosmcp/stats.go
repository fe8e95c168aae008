package chaosmcp

import (
	"context"
	"fmt"
)

// Stats are cumulative counters since the server was created (live values where noted).
type Stats struct {
	// Epoch is the number of restarts so far.
	Epoch int
	// SessionsStarted counts sessions that completed initialize.
	SessionsStarted int
	// LiveSessions is the number of initialized sessions not yet closed.
	LiveSessions int
	// Reads counts resources/read requests per requested URI.
	Reads map[string]int
	// ListCalls and TemplateListCalls count resources/list and resources/templates/list requests.
	ListCalls, TemplateListCalls int
	// CursorErrors counts list requests answered with -32602 because of their cursor.
	CursorErrors int
	// UpdatesSent counts notifications/resources/updated messages written to sessions
	// (duplicates included); UpdatesDuplicated counts the extra copies among them.
	UpdatesSent, UpdatesDuplicated int
	// UpdatesDropped counts updated notifications dropped by a fault.
	UpdatesDropped int
	// UpdatesHeld is the number of updated notifications currently held for reordering.
	UpdatesHeld int
	// ListChangedSent and ListChangedDropped count notifications/resources/list_changed
	// messages written to sessions, and those suppressed or dropped by a fault.
	ListChangedSent, ListChangedDropped int
	// SendErrors counts notifications the transport failed to write (e.g. a closed session).
	SendErrors int
	// SubscribeCalls and UnsubscribeCalls count subscribe / unsubscribe handler calls.
	SubscribeCalls, UnsubscribeCalls int
	// UnsubscribesUnanswered counts unsubscribe requests left unanswered by a fault.
	UnsubscribesUnanswered int
	// Subscriptions is the live number of subscribed sessions per URI.
	Subscriptions map[string]int
	// LiveByListener is the live number of sessions per HTTP listener
	// ([HTTPServer.ListenerID]); MaxLiveByListener is the most that were ever live at once on
	// each listener, counted whenever a session initializes. With one listener per source,
	// a value above 1 means two clients held sessions of one source at the same time.
	LiveByListener, MaxLiveByListener map[string]int
	// Modern era (era.go): acknowledgements withheld or cut to a subset, updated
	// notifications sent with a stale subscription ID, subscriptions/listen HTTP streams
	// opened and cut by DropListenStreams.
	AcksWithheld, AcksPartial, StaleSubscriptionIDs int
	ListenStreams, ListenStreamsDropped             int
	// ListensStarted counts subscriptions/listen requests of 2026-07-28 sessions over any
	// transport (stdio, in-memory, HTTP); LiveListens is how many are being served now, and
	// LiveListChangedListens how many of those were acknowledged with resourcesListChanged —
	// the streams a list_changed reaches.
	ListensStarted, LiveListens, LiveListChangedListens int
}

// Epoch returns the number of restarts so far.
func (s *Server) Epoch() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

func (s *Server) statsLocked() Stats {
	st := s.stats
	st.Epoch = s.epoch
	st.LiveSessions = len(s.sessions)
	st.LiveListens, st.LiveListChangedListens = len(s.listens), 0
	for l := range s.listens {
		if l.listChanged {
			st.LiveListChangedListens++
		}
	}
	st.Reads = make(map[string]int, len(s.stats.Reads))
	for k, v := range s.stats.Reads {
		st.Reads[k] = v
	}
	st.Subscriptions = map[string]int{}
	st.UpdatesHeld = 0
	st.LiveByListener = map[string]int{}
	st.MaxLiveByListener = make(map[string]int, len(s.stats.MaxLiveByListener))
	for k, v := range s.stats.MaxLiveByListener {
		st.MaxLiveByListener[k] = v
	}
	for _, sess := range s.sessions {
		if sess.listener != "" {
			st.LiveByListener[sess.listener]++
		}
		for u := range sess.subs {
			st.Subscriptions[u]++
		}
		st.UpdatesHeld += len(sess.held)
	}
	return st
}

// Await blocks until cond holds for the server's [Stats] (re-checked after every change), or
// ctx ends, in which case it returns an error wrapping ctx.Err().
func (s *Server) Await(ctx context.Context, cond func(Stats) bool) error {
	for {
		s.mu.Lock()
		st := s.statsLocked()
		ch := s.changed
		s.mu.Unlock()
		if cond(st) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("chaosmcp: condition not reached (stats %+v): %w", st, ctx.Err())
		}
	}
}

// changedLocked wakes every Await.
func (s *Server) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}
