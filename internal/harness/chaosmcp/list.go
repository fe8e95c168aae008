package chaosmcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ListKind names the two paginated list methods.
type ListKind int

const (
	// ListResources is resources/list.
	ListResources ListKind = iota
	// ListTemplates is resources/templates/list.
	ListTemplates
)

// String returns the method name.
func (k ListKind) String() string {
	if k == ListTemplates {
		return methodListTemplates
	}
	return methodListResources
}

// SnapshotMode selects the snapshot ID put in each list result's _meta[SnapshotMetaKey].
type SnapshotMode int

const (
	// SnapshotOff puts no snapshot ID in list results.
	SnapshotOff SnapshotMode = iota
	// SnapshotHonest puts the catalog version the page was served from: pages of one scan
	// carry the same ID exactly when no resource or template was added, removed or
	// re-described in between.
	SnapshotHonest
	// SnapshotForged gives every page of a scan the ID of its first page, even when the set
	// changed between pages (a lying server).
	SnapshotForged
	// SnapshotPerPage gives every page a fresh, different ID.
	SnapshotPerPage
)

// listFaults are the pagination knobs; guarded by Server.mu.
type listFaults struct {
	pageSize     int
	pageSizes    []int
	cycleFrom    int
	cycleTo      int
	expireAtPage int
	expireTimes  int // > 0: expireAtPage rejects that many more requests, then turns off
	cursorGen    int
	bindSession  bool
	betweenPages func(kind ListKind, page int)
	snapshot     SnapshotMode
	snapshotSeq  int
	// emptyAt (SetEmptyCursorAtPage) and, per list kind, the real cursor the last empty
	// cursor handed out stands for.
	emptyAt     int
	emptyTarget map[ListKind]string
}

// scanState remembers, per session and list kind, the cursors issued in the current scan
// (a scan starts with a request without cursor).
type scanState struct {
	issued []string // issued[p] is the cursor that leads to page p; issued[0] == ""
	forged string   // the first page's snapshot ID, for SnapshotForged
}

// cursor is the decoded form of the server's opaque cursors: a keyset cursor (the last key
// served) stamped with the page number, the session and epoch it was issued in, and the
// cursor generation (see ExpireCursors).
type cursor struct {
	Kind    ListKind `json:"k"`
	Session int      `json:"s"`
	Epoch   int      `json:"e"`
	Gen     int      `json:"g"`
	Page    int      `json:"p"`
	After   string   `json:"a"`
}

func (c cursor) encode() string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("chaosmcp: marshal cursor: %v", err)) // cannot happen: plain struct
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, fmt.Errorf("not base64url: %w", err)
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil {
		return cursor{}, fmt.Errorf("bad payload: %w", err)
	}
	if c.Page < 1 {
		return cursor{}, fmt.Errorf("bad page %d", c.Page)
	}
	return c, nil
}

// SetPageSize sets the number of items per list page (values < 1 mean 1) and clears any
// per-page sizes.
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.pageSize = max(n, 1)
	s.list.pageSizes = nil
}

// SetPageSizes varies the page size per page: page i (0-based) of a scan holds
// sizes[min(i, len(sizes)-1)] items (values < 1 mean 1). No sizes restores the uniform
// page size.
func (s *Server) SetPageSizes(sizes ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.pageSizes = slices.Clone(sizes)
}

// SetCircularCursor makes page fromPage (0-based) of every scan answer with the very cursor
// that earlier led to page toPage (1 ≤ toPage ≤ fromPage), so a client that follows
// nextCursor loops forever: pages toPage … fromPage repeat. fromPage ≤ 0 turns it off.
func (s *Server) SetCircularCursor(fromPage, toPage int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fromPage <= 0 || toPage < 1 || toPage > fromPage {
		s.list.cycleFrom, s.list.cycleTo = 0, 0
		return
	}
	s.list.cycleFrom, s.list.cycleTo = fromPage, toPage
}

// ExpireCursorAtPage answers the request for page n (n ≥ 1) of every scan with -32602
// "cursor expired", although the cursor is one the server issued. n ≤ 0 turns it off.
func (s *Server) ExpireCursorAtPage(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.expireAtPage, s.list.expireTimes = max(n, 0), 0
}

// ExpireCursorAtPageTimes is ExpireCursorAtPage for the next times requests for page n only
// (of any list kind, in any session); then it turns itself off. A client that starts its walk
// again after the rejection (MCP 2026-07-28: a bad cursor means start again) gets through on
// start times+1. times ≤ 0 or n ≤ 0 turns it off.
func (s *Server) ExpireCursorAtPageTimes(n, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n <= 0 || times <= 0 {
		s.list.expireAtPage, s.list.expireTimes = 0, 0
		return
	}
	s.list.expireAtPage, s.list.expireTimes = n, times
}

// ExpireCursors invalidates every cursor issued so far: presenting one is answered with
// -32602 "cursor expired". Cursors issued afterwards are valid.
func (s *Server) ExpireCursors() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.cursorGen++
}

// BindCursorsToSession makes cursors valid only in the session (and epoch) that issued them:
// a cursor presented in another session is answered with -32602 "cursor from an old session".
// Off (the default), cursors are keyset cursors valid in any session, as the go-sdk's are.
func (s *Server) BindCursorsToSession(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.bindSession = on
}

// OnBetweenPages installs a hook called when the request for page ≥ 1 of a scan arrives,
// before that page is computed — that is, between pages page-1 and page. The hook runs
// without server locks held and may change the resource set (Set, Delete, …); combine it with
// DropListChanged or SuppressListChanged to lose the list_changed notification. nil removes
// the hook.
func (s *Server) OnBetweenPages(hook func(kind ListKind, page int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.betweenPages = hook
}

// SetSnapshotMode selects the snapshot IDs put in list results (see [SnapshotMode]). Whether
// the extension is advertised is [Capabilities.Snapshot].
func (s *Server) SetSnapshotMode(m SnapshotMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list.snapshot = m
}

func invalidCursor(msg string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}
}

// handleList answers resources/list and resources/templates/list from the server's own state.
func (s *Server) handleList(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
	kind := ListResources
	if method == methodListTemplates {
		kind = ListTemplates
	}
	var raw string
	switch p := req.GetParams().(type) {
	case *mcp.ListResourcesParams:
		if p != nil {
			raw = p.Cursor
		}
	case *mcp.ListResourceTemplatesParams:
		if p != nil {
			raw = p.Cursor
		}
	}
	ss, _ := req.GetSession().(*mcp.ServerSession)

	s.mu.Lock()
	if kind == ListTemplates {
		s.stats.TemplateListCalls++
	} else {
		s.stats.ListCalls++
	}
	s.changedLocked()
	sess := s.sessions[ss]
	page, after := 0, ""
	if raw == emptyCursorToken {
		// An empty cursor on the wire (emptycursor.go): the real cursor it was issued for, or
		// the first page, as the go-sdk reads "".
		raw = s.list.emptyTarget[kind]
	}
	if raw != "" {
		c, err := decodeCursor(raw)
		var rejection error
		switch {
		case err != nil || c.Kind != kind:
			rejection = invalidCursor("invalid cursor")
		case c.Gen != s.list.cursorGen:
			rejection = invalidCursor("cursor expired")
		case s.list.bindSession && (sess == nil || c.Session != sess.seq || c.Epoch != sess.epoch):
			rejection = invalidCursor("cursor from an old session")
		case s.list.expireAtPage > 0 && c.Page == s.list.expireAtPage:
			rejection = invalidCursor("cursor expired")
			if s.list.expireTimes > 0 {
				if s.list.expireTimes--; s.list.expireTimes == 0 {
					s.list.expireAtPage = 0
				}
			}
		}
		if rejection != nil {
			s.stats.CursorErrors++
			s.mu.Unlock()
			return nil, rejection
		}
		page, after = c.Page, c.After
	}
	hook := s.list.betweenPages
	s.mu.Unlock()

	if page > 0 && hook != nil {
		hook(kind, page)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	keys := s.sortedLocked(kind)
	start := sort.SearchStrings(keys, after)
	if page > 0 && start < len(keys) && keys[start] == after {
		start++
	}
	size := s.list.pageSize
	if n := len(s.list.pageSizes); n > 0 {
		size = s.list.pageSizes[min(page, n-1)]
	}
	size = max(size, 1)
	end := min(start+size, len(keys))
	items := keys[start:end]

	var scan *scanState
	if sess != nil {
		if page == 0 || sess.scans[kind] == nil {
			sess.scans[kind] = &scanState{issued: []string{""}}
		}
		scan = sess.scans[kind]
	}
	next := ""
	if end < len(keys) {
		c := cursor{Kind: kind, Gen: s.list.cursorGen, Page: page + 1, After: keys[end-1]}
		if sess != nil {
			c.Session, c.Epoch = sess.seq, sess.epoch
		}
		next = c.encode()
	}
	if next != "" && s.list.emptyAt > 0 && page+1 == s.list.emptyAt && isModern(req) {
		if s.list.emptyTarget == nil {
			s.list.emptyTarget = map[ListKind]string{}
		}
		s.list.emptyTarget[kind] = next
		next = emptyCursorToken
	}
	if scan != nil && next != "" {
		for len(scan.issued) <= page+1 {
			scan.issued = append(scan.issued, "")
		}
		scan.issued[page+1] = next
	}
	if from, to := s.list.cycleFrom, s.list.cycleTo; from > 0 && page == from && scan != nil && to < len(scan.issued) && scan.issued[to] != "" {
		next = scan.issued[to]
	}

	var meta mcp.Meta
	if id := s.snapshotIDLocked(page, scan); id != "" {
		meta = mcp.Meta{SnapshotMetaKey: id}
	}
	if kind == ListTemplates {
		res := &mcp.ListResourceTemplatesResult{Meta: meta, NextCursor: next, ResourceTemplates: []*mcp.ResourceTemplate{}}
		res.CacheScope = "public"
		for _, k := range items {
			t := s.templates[k]
			res.ResourceTemplates = append(res.ResourceTemplates, &mcp.ResourceTemplate{URITemplate: t.URITemplate, Name: t.Name, MIMEType: t.MIMEType})
		}
		return res, nil
	}
	res := &mcp.ListResourcesResult{Meta: meta, NextCursor: next, Resources: []*mcp.Resource{}}
	res.CacheScope = "public"
	for _, k := range items {
		r := s.resources[k]
		res.Resources = append(res.Resources, &mcp.Resource{URI: r.URI, Name: r.Name, MIMEType: r.MIMEType})
	}
	return res, nil
}

// snapshotIDLocked returns the snapshot ID for a page, or "" when IDs are off.
func (s *Server) snapshotIDLocked(page int, scan *scanState) string {
	honest := fmt.Sprintf("catalog-%d", s.catalogVersion)
	switch s.list.snapshot {
	case SnapshotHonest:
		return honest
	case SnapshotForged:
		if scan == nil {
			return honest
		}
		if page == 0 || scan.forged == "" {
			scan.forged = honest
		}
		return scan.forged
	case SnapshotPerPage:
		s.list.snapshotSeq++
		return fmt.Sprintf("page-%d", s.list.snapshotSeq)
	default:
		return ""
	}
}
