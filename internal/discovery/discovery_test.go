package discovery_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/discovery"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newServer(t *testing.T, pageSize, resources int) *chaosmcp.Server {
	t.Helper()
	s := chaosmcp.New(chaosmcp.Options{PageSize: pageSize, Capabilities: &chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: true}})
	t.Cleanup(func() { _ = s.Close() })
	var rs []chaosmcp.Resource
	for i := range resources {
		rs = append(rs, chaosmcp.Resource{URI: fmt.Sprintf("demo://r/%05d", i), Text: "x", MIMEType: "text/plain"})
	}
	s.PutMany(rs...)
	return s
}

func connect(t *testing.T, s *chaosmcp.Server) *mcp.ClientSession {
	t.Helper()
	cs, err := s.ConnectInMemory(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func resourceURIs(entries []discovery.Entry) []string {
	var out []string
	for _, e := range entries {
		if e.Kind == discovery.KindResource {
			out = append(out, e.ServerURI)
		}
	}
	return out
}

// A complete round lists both lists page by page, records one cursor digest per followed
// cursor, and digests the set so that the same set gives the same digest and any descriptor
// change gives another.
func TestScanListsBothListsAndDigestsTheSet(t *testing.T) {
	s := newServer(t, 2, 7)
	for _, tmpl := range []string{"demo://t/{a}", "demo://t/{b}", "demo://t/{c}"} {
		s.SetTemplate(chaosmcp.Template{URITemplate: tmpl, Name: "t", MIMEType: "text/plain"})
	}
	cs := connect(t, s)
	ctx := testCtx(t)
	var progress []discovery.Progress
	first := discovery.Scan(ctx, cs, discovery.Options{Progress: func(p discovery.Progress) { progress = append(progress, p) }})
	if !first.Complete || first.Err != nil {
		t.Fatalf("round failed: %s %v", first.FailureKind, first.Err)
	}
	got := struct {
		Progress                  discovery.Progress
		ResourceCursors, Template int
		Duplicates, ProgressCalls int
		URIs                      []string
	}{first.Progress, len(first.ResourceCursorDigests), len(first.TemplateCursorDigests), first.Duplicates, len(progress), resourceURIs(first.Entries)}
	want := got
	want.Progress = discovery.Progress{ResourcePages: 4, TemplatePages: 2, Resources: 7, Templates: 3}
	want.ResourceCursors, want.Template, want.Duplicates, want.ProgressCalls = 3, 1, 0, 6
	want.URIs = s.URIs()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("round (-want +got):\n%s", diff)
	}
	second := discovery.Scan(ctx, cs, discovery.Options{})
	if second.SetDigest != first.SetDigest || second.CursorChainDigest != first.CursorChainDigest {
		t.Errorf("same set, same pages: digests %s/%s vs %s/%s", first.SetDigest, first.CursorChainDigest, second.SetDigest, second.CursorChainDigest)
	}
	s.Put(chaosmcp.Resource{URI: "demo://r/00003", Name: "renamed", Text: "x", MIMEType: "text/plain"})
	third := discovery.Scan(ctx, cs, discovery.Options{})
	if third.SetDigest == first.SetDigest {
		t.Errorf("a renamed resource left the set digest at %s", third.SetDigest)
	}
	keyed := discovery.Scan(ctx, cs, discovery.Options{CursorKey: []byte("k")})
	if keyed.ResourceCursorDigests[0] == third.ResourceCursorDigests[0] {
		t.Errorf("keyed cursor digest equals the plain SHA-256")
	}
}

// switching pages its first calls on one session and the rest on another, as a client that
// kept a cursor across a reconnect would.
type switching struct {
	first, second *mcp.ClientSession
	after         int
	calls         atomic.Int32
}

func (s *switching) ListResources(ctx context.Context, p *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error) {
	if int(s.calls.Add(1)) > s.after {
		return s.second.ListResources(ctx, p)
	}
	return s.first.ListResources(ctx, p)
}

func (s *switching) ListResourceTemplates(ctx context.Context, p *mcp.ListResourceTemplatesParams) (*mcp.ListResourceTemplatesResult, error) {
	return s.first.ListResourceTemplates(ctx, p)
}

// echoing answers any request that carries a cursor with an error that quotes it.
type echoing struct {
	discovery.Lister
	seen string
}

func (e *echoing) ListResources(ctx context.Context, p *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error) {
	if p.Cursor != "" {
		e.seen = p.Cursor
		return nil, fmt.Errorf("cannot resume at %q", p.Cursor)
	}
	return e.Lister.ListResources(ctx, p)
}

// failing fails its nth resources/list call with a plain error, as a transport does when the
// session ends under a request; gone reports whether it did.
type failing struct {
	discovery.Lister
	n     int
	calls int
	gone  bool
}

func (f *failing) ListResources(ctx context.Context, p *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error) {
	if f.calls++; f.calls == f.n {
		f.gone = true
		return nil, errors.New("unexpected EOF")
	}
	return f.Lister.ListResources(ctx, p)
}

// Every way a round fails (R8): a cycle, a page-count blow-up, a rejected cursor (expired or
// from an old session), a session that ended under the round. A failed round has no entries
// and no set digest, and its error never quotes a cursor.
func TestScanFailures(t *testing.T) {
	errGone := errors.New("session replaced")
	tests := []struct {
		name      string
		setup     func(s *chaosmcp.Server)
		lister    func(t *testing.T, s *chaosmcp.Server) discovery.Lister
		opts      func(*discovery.Options)
		wantKind  string
		wantPages int
	}{
		{name: "circular cursor", setup: func(s *chaosmcp.Server) { s.SetCircularCursor(3, 1) }, wantKind: contract.RoundCursorCycle, wantPages: 4},
		{name: "cycle back to the same page", setup: func(s *chaosmcp.Server) { s.SetCircularCursor(2, 2) }, wantKind: contract.RoundCursorCycle, wantPages: 3},
		{name: "page cap", opts: func(o *discovery.Options) { o.MaxPages = 3 }, wantKind: contract.RoundPageCap, wantPages: 3},
		{name: "expired cursor", setup: func(s *chaosmcp.Server) { s.ExpireCursorAtPage(2) }, wantKind: contract.RoundCursorError, wantPages: 2},
		{
			name:  "cursor from an old session",
			setup: func(s *chaosmcp.Server) { s.BindCursorsToSession(true) },
			lister: func(t *testing.T, s *chaosmcp.Server) discovery.Lister {
				return &switching{first: connect(t, s), second: connect(t, s), after: 2}
			},
			wantKind: contract.RoundCursorError, wantPages: 2,
		},
		{
			name: "session replaced during the round",
			opts: func(o *discovery.Options) {
				calls := 0
				o.Check = func() error {
					if calls++; calls > 2 {
						return errGone
					}
					return nil
				}
			},
			wantKind: contract.RoundStaleSession, wantPages: 2,
		},
		{
			name: "a request that failed because the session ended",
			lister: func(t *testing.T, s *chaosmcp.Server) discovery.Lister {
				return &failing{Lister: connect(t, s), n: 3}
			},
			wantKind: contract.RoundStaleSession, wantPages: 2,
		},
		{
			name: "connection closed",
			lister: func(t *testing.T, s *chaosmcp.Server) discovery.Lister {
				cs := connect(t, s)
				_ = cs.Close()
				return cs
			},
			wantKind: contract.RoundStaleSession, wantPages: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, 1, 6)
			if tt.setup != nil {
				tt.setup(s)
			}
			var l discovery.Lister
			if tt.lister != nil {
				l = tt.lister(t, s)
			} else {
				l = connect(t, s)
			}
			var opts discovery.Options
			if f, ok := l.(*failing); ok {
				opts.Check = func() error {
					if f.gone {
						return errGone
					}
					return nil
				}
			}
			if tt.opts != nil {
				tt.opts(&opts)
			}
			res := discovery.Scan(testCtx(t), l, opts)
			type outcome struct {
				Complete  bool
				Kind      string
				Pages     int
				Entries   int
				SetDigest string
			}
			want := outcome{Kind: tt.wantKind, Pages: tt.wantPages}
			got := outcome{res.Complete, res.FailureKind, res.Pages(), len(res.Entries), res.SetDigest}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("round (-want +got):\n%s\nerror: %v", diff, res.Err)
			}
			if res.Err == nil {
				t.Error("failed round without error")
			}
		})
	}
	t.Run("a failed request on a live session", func(t *testing.T) {
		s := newServer(t, 1, 6)
		res := discovery.Scan(testCtx(t), &failing{Lister: connect(t, s), n: 3}, discovery.Options{Check: func() error { return nil }})
		if res.FailureKind != contract.RoundListError {
			t.Errorf("round: %s %v, want LIST_ERROR", res.FailureKind, res.Err)
		}
	})
	t.Run("echoed cursor is redacted", func(t *testing.T) {
		s := newServer(t, 2, 6)
		l := &echoing{Lister: connect(t, s)}
		res := discovery.Scan(testCtx(t), l, discovery.Options{})
		if res.FailureKind != contract.RoundListError || l.seen == "" {
			t.Fatalf("round: %s %v (cursor seen %q)", res.FailureKind, res.Err, l.seen)
		}
		if strings.Contains(res.Err.Error(), l.seen) {
			t.Errorf("failure text quotes the cursor: %v", res.Err)
		}
	})
}

// The snapshot IDs each page carried are collected: one ID on every page is a candidate proof,
// anything else is not (R5).
func TestScanSnapshotIDs(t *testing.T) {
	tests := []struct {
		name     string
		mode     chaosmcp.SnapshotMode
		mutate   bool
		wantIDs  int
		wantOne  bool
		wantWith int
	}{
		{name: "off", mode: chaosmcp.SnapshotOff, wantIDs: 0, wantWith: 0},
		{name: "honest", mode: chaosmcp.SnapshotHonest, wantIDs: 1, wantOne: true, wantWith: 4},
		{name: "honest, set changed between pages", mode: chaosmcp.SnapshotHonest, mutate: true, wantIDs: 2, wantWith: 4},
		// The forger repeats the first page's ID over the resource pages; the template list
		// starts afresh with the new ID.
		{name: "forged, set changed between pages", mode: chaosmcp.SnapshotForged, mutate: true, wantIDs: 2, wantWith: 4},
		{name: "varying per page", mode: chaosmcp.SnapshotPerPage, wantIDs: 4, wantWith: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, 2, 5) // 3 resource pages, 1 (empty) template page
			s.SetSnapshotMode(tt.mode)
			if tt.mutate {
				var once atomic.Bool
				s.OnBetweenPages(func(kind chaosmcp.ListKind, page int) {
					if kind == chaosmcp.ListResources && page == 2 && once.CompareAndSwap(false, true) {
						s.Set("demo://r/99999", "late", "text/plain")
					}
				})
			}
			res := discovery.Scan(testCtx(t), connect(t, s), discovery.Options{})
			if !res.Complete {
				t.Fatalf("round failed: %s %v", res.FailureKind, res.Err)
			}
			got := []any{len(res.SnapshotIDs), res.SnapshotID != "", res.SnapshotPages}
			if diff := cmp.Diff([]any{tt.wantIDs, tt.wantOne, tt.wantWith}, got); diff != "" {
				t.Errorf("distinct IDs, uniform, pages with ID (-want +got):\n%s\nIDs %v", diff, res.SnapshotIDs)
			}
		})
	}
}

// A resource created between two pages, behind the cursor, is missed by the round that was
// paging and seen by the next: the two set digests differ (R6).
func TestScanMutationBetweenPagesChangesTheDigest(t *testing.T) {
	s := newServer(t, 2, 6)
	s.SuppressListChanged(true)
	var once atomic.Bool
	s.OnBetweenPages(func(kind chaosmcp.ListKind, page int) {
		if kind == chaosmcp.ListResources && page == 2 && once.CompareAndSwap(false, true) {
			s.Set("demo://r/00000a", "new", "text/plain")
		}
	})
	cs := connect(t, s)
	ctx := testCtx(t)
	a := discovery.Scan(ctx, cs, discovery.Options{})
	b := discovery.Scan(ctx, cs, discovery.Options{})
	if !a.Complete || !b.Complete {
		t.Fatalf("rounds failed: %v %v", a.Err, b.Err)
	}
	if a.SetDigest == b.SetDigest {
		t.Fatalf("round A missed a resource and still has round B's digest %s", a.SetDigest)
	}
	if diff := cmp.Diff(s.URIs(), resourceURIs(b.Entries)); diff != "" {
		t.Errorf("round B (-server +round):\n%s", diff)
	}
	if got := len(resourceURIs(a.Entries)); got != 6 {
		t.Errorf("round A listed %d resources, want the 6 it could see", got)
	}
}

// A catalog of 10,000 resources is listed completely, in 100 pages.
func TestScan10000Resources(t *testing.T) {
	s := newServer(t, 100, 10000)
	res := discovery.Scan(testCtx(t), connect(t, s), discovery.Options{})
	if !res.Complete {
		t.Fatalf("round failed: %s %v", res.FailureKind, res.Err)
	}
	if diff := cmp.Diff(discovery.Progress{ResourcePages: 100, TemplatePages: 1, Resources: 10000}, res.Progress); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(s.URIs(), resourceURIs(res.Entries)); diff != "" {
		t.Errorf("entries (-server +round):\n%s", diff)
	}
}

func TestSnapshotMetaKeyOf(t *testing.T) {
	tests := []struct {
		name, caps, want string
	}{
		{"no capabilities", ``, discovery.DefaultSnapshotMetaKey},
		{"not negotiated", `{"resources":{}}`, discovery.DefaultSnapshotMetaKey},
		{"named key", `{"experimental":{"mcpsync/snapshot":{"version":1,"metaKey":"x/snap"}}}`, "x/snap"},
		{"no key named", `{"experimental":{"mcpsync/snapshot":{"version":1}}}`, discovery.DefaultSnapshotMetaKey},
		{"malformed", `{"experimental":[]}`, discovery.DefaultSnapshotMetaKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := discovery.SnapshotMetaKeyOf([]byte(tt.caps)); got != tt.want {
				t.Errorf("SnapshotMetaKeyOf(%s) = %q, want %q", tt.caps, got, tt.want)
			}
		})
	}
}

// BenchmarkRound compares one round with one raw go-sdk listing of the same in-memory server
// (10,000 resources, 100 per page).
func BenchmarkRound(b *testing.B) {
	s := chaosmcp.New(chaosmcp.Options{PageSize: 100})
	b.Cleanup(func() { _ = s.Close() })
	var rs []chaosmcp.Resource
	for i := range 10000 {
		rs = append(rs, chaosmcp.Resource{URI: fmt.Sprintf("demo://r/%05d", i), Text: "x", MIMEType: "text/plain"})
	}
	s.PutMany(rs...)
	ctx := context.Background()
	cs, err := s.ConnectInMemory(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cs.Close() })
	b.Run("raw", func(b *testing.B) {
		for b.Loop() {
			n := 0
			for _, err := range cs.Resources(ctx, nil) {
				if err != nil {
					b.Fatal(err)
				}
				n++
			}
			for _, err := range cs.ResourceTemplates(ctx, nil) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("round", func(b *testing.B) {
		for b.Loop() {
			if res := discovery.Scan(ctx, cs, discovery.Options{CursorKey: []byte("k"), Check: func() error { return nil }, Progress: func(discovery.Progress) {}}); !res.Complete {
				b.Fatal(res.Err)
			}
		}
	})
}
