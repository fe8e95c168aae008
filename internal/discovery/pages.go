package discovery

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/uri"
)

// pageBacklog is how many listed pages may wait for their entries to be built before the
// next request waits for them.
const pageBacklog = 256

// sink builds a round's entries beside its paging (issue 16 item 5): the next request goes out
// as soon as a page's cursor is known, while the pages before it are normalized and digested
// on another goroutine, so that a round costs little more than the listing itself. Pages
// arrive in listing order. While their entries arrive in set order (kind, server URI, name,
// MIME type: how servers commonly page), the set digest is taken as they come and the round's
// end sorts nothing; once one arrives out of order, the end sorts and digests them all, as
// setDigest does. Both give the same digest for the same multiset.
//
// With a size hint (Options.EntriesHint, with headroom: entriesCapacity) the entries are built
// in one slice of that capacity, allocated by the sink's goroutine when the first page arrives,
// so the round's end hands that slice over as it is; without one, each page's entries are a slice of their own and the end
// joins them (for 100,000 entries the join took ≈ 23 ms, after the last response and before
// the round could end).
type sink struct {
	pages chan sinkPage
	done  chan struct{}
	hint  int

	// Written by run only; read after done is closed.
	entries   [][]Entry // per-page slices (no hint)
	all       []Entry   // every entry so far (with a hint)
	n         int
	malformed int
	inOrder   bool // every entry so far arrived in set order
	last      Entry
	have      bool
	dups      int
	h         hash.Hash
	buf       bytes.Buffer
}

// sinkPage is one listed page, as the go-sdk decoded it.
type sinkPage struct {
	resources []*mcp.Resource
	templates []*mcp.ResourceTemplate
}

// newSink starts a sink; hint, if positive, is the capacity of the one slice the entries are
// built in.
func newSink(hint int) *sink {
	s := &sink{pages: make(chan sinkPage, pageBacklog), done: make(chan struct{}), inOrder: true, h: sha256.New(), hint: hint}
	go s.run()
	return s
}

// add hands a listed page to the sink.
func (s *sink) add(p sinkPage) { s.pages <- p }

func (s *sink) run() {
	defer close(s.done)
	for p := range s.pages {
		var page []Entry
		switch {
		case s.hint > 0 && s.all == nil:
			s.all = make([]Entry, 0, max(s.hint, len(p.resources)+len(p.templates)))
			page = s.all
		case s.all != nil:
			page = s.all[len(s.all):]
		default:
			page = make([]Entry, 0, len(p.resources)+len(p.templates))
		}
		for _, x := range p.resources {
			if x == nil {
				continue
			}
			norm, err := uri.Normalize(x.URI)
			switch {
			case err != nil:
				norm = x.URI
				s.malformed++
			case norm == x.URI:
				norm = x.URI // share the string: a round may hold 100,000 of them
			}
			page = append(page, Entry{Kind: KindResource, URI: norm, ServerURI: x.URI, Name: x.Name, MIMEType: x.MIMEType})
		}
		for _, x := range p.templates {
			if x == nil {
				continue
			}
			page = append(page, Entry{Kind: KindTemplate, URI: x.URITemplate, ServerURI: x.URITemplate, Name: x.Name, MIMEType: x.MIMEType})
		}
		if s.all != nil {
			if n := len(s.all); len(page) <= cap(s.all)-n {
				s.all = s.all[:n+len(page)] // built in place, after the entries before it
			} else {
				s.all = append(s.all, page...) // past the hint: the page grew into an array of its own
			}
			page = s.all[len(s.all)-len(page):]
		} else {
			s.entries = append(s.entries, page)
		}
		s.n += len(page)
		for i := 0; i < len(page) && s.inOrder; i++ {
			s.digest(&page[i])
		}
	}
}

// digest adds e to the running set digest if it keeps the set order.
func (s *sink) digest(e *Entry) {
	if s.have {
		if compareEntries(s.last, *e) > 0 {
			s.inOrder = false
			return
		}
		if s.last.Kind == e.Kind && s.last.ServerURI == e.ServerURI {
			s.dups++
		}
	}
	s.last, s.have = *e, true
	writeEntry(s.h, &s.buf, e)
}

// finish waits for the pages handed over and returns the entries in set order, the set digest
// and the count of entries listed twice (keep false: the round failed, and only the count of
// malformed URIs is returned).
func (s *sink) finish(keep bool) (entries []Entry, digest string, dups, malformed int) {
	close(s.pages)
	<-s.done
	if !keep {
		return nil, "", 0, s.malformed
	}
	if s.all != nil {
		entries, s.all = s.all, nil
		if cap(entries) > 2*len(entries)+pageBacklog {
			// The set shrank well below the hint: keep only what the entries need.
			entries = slices.Clip(slices.Clone(entries))
		}
	} else {
		// One allocation of the exact size, instead of growing one slice page by page.
		entries = make([]Entry, 0, s.n)
		for _, p := range s.entries {
			entries = append(entries, p...)
		}
		s.entries = nil
	}
	if s.inOrder {
		return entries, "sha256:" + hex.EncodeToString(s.h.Sum(nil)), s.dups, s.malformed
	}
	digest, dups = setDigest(entries)
	return entries, digest, dups, s.malformed
}
