package mcphost

import "context"

// SourceEventKind says what happened to a source's session.
type SourceEventKind int

const (
	// SessionOpened: a new session generation was opened.
	SessionOpened SourceEventKind = iota + 1
	// ListChanged: notifications/resources/list_changed arrived on the session.
	ListChanged
)

// SourceEvent is what Options.SourceEvents is told.
type SourceEvent struct {
	Kind       SourceEventKind
	Source     string
	SourceID   int64
	Generation int64
	// ListChanged is the number of list_changed notifications the session received so far.
	ListChanged int64
}

// sourceEvents forwards one session's events to Options.SourceEvents from its own goroutine,
// never from the MCP client's notification handler.
type sourceEvents struct {
	kick chan struct{} // capacity 1: a burst of list_changed is one wake-up
	stop chan struct{}
	done chan struct{}
}

// startSourceEvents reports c's opening and then every burst of list_changed on c to
// Options.SourceEvents, until stopSourceEvents.
func (h *Host) startSourceEvents(ctx context.Context, c *Conn) {
	if h.opts.SourceEvents == nil {
		return
	}
	ev := &sourceEvents{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	c.events.Store(ev)
	event := func(kind SourceEventKind) SourceEvent {
		return SourceEvent{Kind: kind, Source: c.source.Name, SourceID: c.source.ID, Generation: c.gen, ListChanged: c.ListChangedCount()}
	}
	go func() {
		defer close(ev.done)
		h.opts.SourceEvents(ctx, event(SessionOpened))
		for {
			select {
			case <-ev.stop:
				return
			case <-ctx.Done():
				return
			case <-ev.kick:
				h.opts.SourceEvents(ctx, event(ListChanged))
			}
		}
	}()
}

// stopSourceEvents stops c's forwarder and waits for it.
func (h *Host) stopSourceEvents(c *Conn) {
	if ev := c.events.Load(); ev != nil {
		close(ev.stop)
		<-ev.done
	}
}

// kickSourceEvents wakes c's forwarder after a list_changed, without blocking.
func (c *Conn) kickSourceEvents() {
	if ev := c.events.Load(); ev != nil {
		select {
		case ev.kick <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}
