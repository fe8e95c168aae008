package chaosmcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// notifyFaults are the notification knobs; guarded by Server.mu.
type notifyFaults struct {
	dropNext   int
	dropRate   float64
	delay      time.Duration
	duplicates int
	spacing    time.Duration
	reorder    int
	hold       bool
	rewrite    func(string) string
	suppressLC bool
	dropNextLC int
}

// heldUpdate is an updated notification waiting in a session's reorder buffer.
type heldUpdate struct {
	uri     string
	meta    mcp.Meta
	copies  int
	spacing time.Duration // between copies; 0: back to back
}

// DropUpdates drops the next n notifications/resources/updated deliveries (one delivery is one
// notification to one session). It adds to any drops still pending.
func (s *Server) DropUpdates(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.dropNext += max(n, 0)
}

// SetUpdateDropRate drops each updated delivery with probability p (0 ≤ p ≤ 1), using the
// random source seeded by Options.Seed.
func (s *Server) SetUpdateDropRate(p float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.dropRate = min(max(p, 0), 1)
}

// SetUpdateDelay sends each updated delivery d later, asynchronously; 0 sends at once.
// Deliveries made after the delay is lowered can overtake earlier, still delayed ones. For a
// delay that does not depend on the clock, use HoldUpdates.
func (s *Server) SetUpdateDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.delay = max(d, 0)
}

// SetUpdateDuplicates sends every updated delivery 1+extra times in a row.
func (s *Server) SetUpdateDuplicates(extra int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.duplicates = max(extra, 0)
}

// SetUpdateDuplicateSpacing sends the extra copies of SetUpdateDuplicates d apart (in the
// background) instead of back to back, so that they reach the client as separate messages
// rather than one burst; 0 sends them back to back.
func (s *Server) SetUpdateDuplicateSpacing(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.spacing = max(d, 0)
}

// ReorderUpdates buffers updated deliveries per session and, each time n of them have
// accumulated, sends that batch in reverse order. n < 2 turns reordering off and releases
// anything buffered in arrival order.
func (s *Server) ReorderUpdates(n int) {
	s.mu.Lock()
	if n < 2 {
		n = 0
	}
	s.notify.reorder = n
	s.mu.Unlock()
	if n == 0 {
		s.FlushUpdates()
	}
}

// HoldUpdates buffers every updated delivery (on) until FlushUpdates or HoldUpdates(false),
// which send them in arrival order — a deterministic, unbounded delay.
func (s *Server) HoldUpdates(on bool) {
	s.mu.Lock()
	s.notify.hold = on
	s.mu.Unlock()
	if !on {
		s.FlushUpdates()
	}
}

// FlushUpdates sends every buffered updated delivery, per session in arrival order.
func (s *Server) FlushUpdates() {
	type batch struct {
		ss    *mcp.ServerSession
		items []heldUpdate
	}
	s.mu.Lock()
	var batches []batch
	for ss, sess := range s.sessions {
		if len(sess.held) > 0 {
			batches = append(batches, batch{ss, sess.held})
			sess.held = nil
		}
	}
	s.changedLocked()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.bgCtx, notificationTimeout)
	defer cancel()
	for _, b := range batches {
		for _, h := range b.items {
			s.deliverUpdate(ctx, b.ss, h, 0)
		}
	}
}

// SetUpdateURIRewrite rewrites the URI of every updated notification with f before it is
// sent (nil: unchanged) — the "URI encoding confusion" fault. See [EncodeUnreserved],
// [UpperSchemeHost] and [LowerHexEscapes].
func (s *Server) SetUpdateURIRewrite(f func(uri string) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.rewrite = f
}

// SuppressListChanged stops (on) or resumes every notifications/resources/list_changed.
func (s *Server) SuppressListChanged(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.suppressLC = on
}

// DropListChanged drops the next n list_changed deliveries (one per session).
func (s *Server) DropListChanged(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify.dropNextLC += max(n, 0)
}

// SendUpdate sends notifications/resources/updated for uri to the live session numbered seq
// (see [SessionInfo.Seq]), whether or not it subscribed to uri, through the notification
// faults. It produces notifications for unknown URIs, or — with a client that has reconnected
// but keeps its previous session open — notifications from an old session.
func (s *Server) SendUpdate(seq int, uri string) error {
	s.mu.Lock()
	var target *mcp.ServerSession
	for ss, sess := range s.sessions {
		if sess.seq == seq {
			target = ss
		}
	}
	s.mu.Unlock()
	if target == nil {
		return fmt.Errorf("chaosmcp: no live session %d", seq)
	}
	ctx, cancel := context.WithTimeout(s.bgCtx, notificationTimeout)
	defer cancel()
	req := &mcp.ServerRequest[*mcp.ResourceUpdatedNotificationParams]{Session: target, Params: &mcp.ResourceUpdatedNotificationParams{URI: uri}}
	_, err := s.send(ctx, notifyUpdated, req)
	return err
}

// notifyUpdated asks the go-sdk to notify the sessions subscribed to exactly uri; each
// delivery passes through sendingMiddleware.
func (s *Server) notifyUpdated(uri string) {
	ctx, cancel := context.WithTimeout(s.bgCtx, notificationTimeout)
	defer cancel()
	if err := s.mcp.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: uri}); err != nil {
		s.logger.Warn("resource updated", "uri", uri, "error", err)
	}
}

// notifyListChanged sends list_changed to every legacy session that negotiated listChanged,
// and to every live subscriptions/listen stream of a 2026-07-28 session whose acknowledgement
// granted resourcesListChanged (stamped with that stream's subscription ID, as the go-sdk
// stamps its own). Every delivery passes through the list_changed faults.
func (s *Server) notifyListChanged() {
	s.mu.Lock()
	var targets []*mcp.ServerSession
	for ss, sess := range s.sessions {
		if sess.caps.ListChanged {
			targets = append(targets, ss)
		}
	}
	var streams []*modernListen
	for l := range s.listens {
		if l.listChanged {
			streams = append(streams, l)
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.bgCtx, notificationTimeout)
	defer cancel()
	for _, ss := range targets {
		req := &mcp.ServerRequest[*mcp.ResourceListChangedParams]{Session: ss, Params: &mcp.ResourceListChangedParams{}}
		if _, err := s.send(ctx, notifyListChanged, req); err != nil {
			s.logger.Debug("list_changed", "error", err)
		}
	}
	for _, l := range streams {
		params := &mcp.ResourceListChangedParams{Meta: mcp.Meta{metaKeySubscription: l.id}}
		req := &mcp.ServerRequest[*mcp.ResourceListChangedParams]{Session: l.ss, Params: params}
		if err := s.listChanged(ctx, l.ss, req); err != nil {
			s.logger.Debug("list_changed on a listen stream", "error", err)
		}
	}
}

// sendingMiddleware is the fault layer for server-to-client messages. It captures the
// go-sdk's sending handler so that the server can send notifications to one session.
func (s *Server) sendingMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	s.next = next
	s.send = func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		ss, _ := req.GetSession().(*mcp.ServerSession)
		if !s.listenSending(ctx, method, req) {
			return nil, nil
		}
		switch method {
		case notifyUpdated:
			if p, ok := req.GetParams().(*mcp.ResourceUpdatedNotificationParams); ok && ss != nil {
				s.updated(ctx, ss, p)
				return nil, nil
			}
		case notifyListChanged:
			if ss != nil {
				return nil, s.listChanged(ctx, ss, req)
			}
		}
		return next(ctx, method, req)
	}
	return s.send
}

// updated applies the notification faults to one updated delivery.
func (s *Server) updated(ctx context.Context, ss *mcp.ServerSession, p *mcp.ResourceUpdatedNotificationParams) {
	s.mu.Lock()
	nf := &s.notify
	drop := false
	switch {
	case nf.dropNext > 0:
		nf.dropNext--
		drop = true
	case nf.dropRate > 0 && s.rng.Float64() < nf.dropRate:
		drop = true
	}
	if drop {
		s.stats.UpdatesDropped++
		s.changedLocked()
		s.mu.Unlock()
		return
	}
	rewrite := nf.rewrite
	h := heldUpdate{uri: p.URI, meta: p.Meta, copies: 1 + nf.duplicates, spacing: nf.spacing}
	delay := nf.delay
	sess := s.sessions[ss]
	s.mu.Unlock()

	if rewrite != nil {
		h.uri = rewrite(h.uri)
	}

	s.mu.Lock()
	if sess != nil && (s.notify.hold || s.notify.reorder > 0) {
		sess.held = append(sess.held, h)
		var batch []heldUpdate
		if !s.notify.hold && len(sess.held) >= s.notify.reorder {
			batch = sess.held
			sess.held = nil
		}
		s.changedLocked()
		s.mu.Unlock()
		for i := len(batch) - 1; i >= 0; i-- {
			s.deliverUpdate(ctx, ss, batch[i], delay)
		}
		return
	}
	s.mu.Unlock()
	s.deliverUpdate(ctx, ss, h, delay)
}

// deliverUpdate writes h to ss (copies times), now or after delay.
func (s *Server) deliverUpdate(ctx context.Context, ss *mcp.ServerSession, h heldUpdate, delay time.Duration) {
	if delay <= 0 {
		s.writeUpdate(ctx, ss, h)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	// Started under s.mu, so that it cannot race with Close's s.bg.Wait.
	s.bg.Go(func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.bgCtx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(s.bgCtx, notificationTimeout)
		defer cancel()
		s.writeUpdate(ctx, ss, h)
	})
}

func (s *Server) writeUpdate(ctx context.Context, ss *mcp.ServerSession, h heldUpdate) {
	if h.spacing > 0 && h.copies > 1 {
		// The first copy now, the others d apart in the background.
		rest := h
		rest.copies, h.copies = h.copies-1, 1
		s.mu.Lock()
		if !s.closed {
			s.bg.Go(func() {
				for range rest.copies {
					t := time.NewTimer(rest.spacing)
					select {
					case <-t.C:
					case <-s.bgCtx.Done():
						t.Stop()
						return
					}
					ctx, cancel := context.WithTimeout(s.bgCtx, notificationTimeout)
					s.writeCopies(ctx, ss, heldUpdate{uri: rest.uri, meta: rest.meta, copies: 1}, true)
					cancel()
				}
			})
		}
		s.mu.Unlock()
	}
	s.writeCopies(ctx, ss, h, false)
}

// writeCopies writes h.copies copies of h to ss; duplicate says the first is a duplicate too.
func (s *Server) writeCopies(ctx context.Context, ss *mcp.ServerSession, h heldUpdate, duplicate bool) {
	for i := range h.copies {
		params := &mcp.ResourceUpdatedNotificationParams{URI: h.uri, Meta: h.meta}
		_, err := s.next(ctx, notifyUpdated, &mcp.ServerRequest[*mcp.ResourceUpdatedNotificationParams]{Session: ss, Params: params})
		s.mu.Lock()
		if err != nil {
			s.stats.SendErrors++
		} else {
			s.stats.UpdatesSent++
			if i > 0 || duplicate {
				s.stats.UpdatesDuplicated++
			}
		}
		s.changedLocked()
		s.mu.Unlock()
		if err != nil {
			s.logger.Debug("updated notification not sent", "uri", h.uri, "error", err)
			return
		}
	}
}

// listChanged applies the list_changed faults to one delivery.
func (s *Server) listChanged(ctx context.Context, ss *mcp.ServerSession, req mcp.Request) error {
	s.mu.Lock()
	drop := s.notify.suppressLC
	if !drop && s.notify.dropNextLC > 0 {
		s.notify.dropNextLC--
		drop = true
	}
	if drop {
		s.stats.ListChangedDropped++
		s.changedLocked()
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	_, err := s.next(ctx, notifyListChanged, req)
	s.mu.Lock()
	if err != nil {
		s.stats.SendErrors++
	} else {
		s.stats.ListChangedSent++
	}
	s.changedLocked()
	s.mu.Unlock()
	return err
}

// EncodeUnreserved percent-encodes, after the scheme, every "~", "-", "." and "_" that is not
// part of the authority's host — e.g. "demo://x/~a.b" → "demo://x/%7Ea%2Eb" — producing a
// URI that is RFC 3986-equivalent but a different string.
func EncodeUnreserved(uri string) string {
	scheme, rest, ok := strings.Cut(uri, ":")
	if !ok {
		return uri
	}
	prefix := ""
	if strings.HasPrefix(rest, "//") {
		end := strings.IndexAny(rest[2:], "/?#")
		if end < 0 {
			return uri
		}
		prefix, rest = rest[:2+end], rest[2+end:]
	}
	var b strings.Builder
	b.WriteString(scheme + ":" + prefix)
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; c {
		case '~', '-', '.', '_':
			b.WriteString("%" + strings.ToUpper(hexByte(c)))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// UpperSchemeHost upper-cases the scheme and the host, e.g. "demo://notes/1" →
// "DEMO://NOTES/1".
func UpperSchemeHost(uri string) string {
	scheme, rest, ok := strings.Cut(uri, ":")
	if !ok {
		return uri
	}
	if !strings.HasPrefix(rest, "//") {
		return strings.ToUpper(scheme) + ":" + rest
	}
	end := strings.IndexAny(rest[2:], "/?#")
	if end < 0 {
		end = len(rest) - 2
	}
	auth := rest[2 : 2+end]
	userinfo := ""
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		userinfo, auth = auth[:at+1], auth[at+1:]
	}
	return strings.ToUpper(scheme) + "://" + userinfo + strings.ToUpper(auth) + rest[2+end:]
}

// LowerHexEscapes lower-cases the hex digits of every percent-encoding, e.g. "a%2Fb" → "a%2fb".
func LowerHexEscapes(uri string) string {
	b := []byte(uri)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1] = lowerASCII(b[i+1])
			b[i+2] = lowerASCII(b[i+2])
			i += 2
		}
	}
	return string(b)
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func hexByte(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}
