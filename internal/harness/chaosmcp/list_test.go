package chaosmcp_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

func pageSizes(pages []page) []int {
	var out []int
	for _, p := range pages {
		out = append(out, len(p.URIs))
	}
	return out
}

func TestPageSizes(t *testing.T) {
	tests := []struct {
		name  string
		setup func(s *chaosmcp.Server)
		want  []int
	}{
		{"option default", func(*chaosmcp.Server) {}, []int{3, 3, 1}},
		{"uniform", func(s *chaosmcp.Server) { s.SetPageSize(2) }, []int{2, 2, 2, 1}},
		{"varying", func(s *chaosmcp.Server) { s.SetPageSizes(1, 4, 2) }, []int{1, 4, 2}},
		{"varying last repeats", func(s *chaosmcp.Server) { s.SetPageSizes(5, 1) }, []int{5, 1, 1}},
		{"uniform clears varying", func(s *chaosmcp.Server) { s.SetPageSizes(1); s.SetPageSize(7) }, []int{7}},
		{"one page", func(s *chaosmcp.Server) { s.SetPageSize(100) }, []int{7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{PageSize: 3})
			uris := seed(s, 7)
			tt.setup(s)
			cs, _ := connect(t, s)
			pages := listAll(t, cs, 20)
			if diff := cmp.Diff(tt.want, pageSizes(pages)); diff != "" {
				t.Errorf("page sizes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(uris, flatten(pages)); diff != "" {
				t.Errorf("listed URIs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTemplatePagination(t *testing.T) {
	s := newServer(t, chaosmcp.Options{PageSize: 2})
	for _, tmpl := range []string{"demo://t/{a}", "demo://t/{b}", "demo://t/{c}"} {
		s.SetTemplate(chaosmcp.Template{URITemplate: tmpl, Name: "t"})
	}
	cs, _ := connect(t, s)
	ctx := testCtx(t)
	res, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(res.ResourceTemplates) != 2 || res.NextCursor == "" {
		t.Fatalf("first template page: %+v, %v", res, err)
	}
	res2, err := cs.ListResourceTemplates(ctx, &mcp.ListResourceTemplatesParams{Cursor: res.NextCursor})
	if err != nil || len(res2.ResourceTemplates) != 1 || res2.NextCursor != "" {
		t.Fatalf("second template page: %+v, %v", res2, err)
	}
	if got := res2.ResourceTemplates[0].URITemplate; got != "demo://t/{c}" {
		t.Errorf("second page holds %q", got)
	}
	if st := s.Stats(); st.TemplateListCalls != 2 || st.ListCalls != 0 {
		t.Errorf("stats: %d template lists, %d lists", st.TemplateListCalls, st.ListCalls)
	}
}

func TestCircularCursor(t *testing.T) {
	s := newServer(t, chaosmcp.Options{PageSize: 1})
	seed(s, 6)
	s.SetCircularCursor(3, 1)
	cs, _ := connect(t, s)
	ctx := testCtx(t)
	var cursors []string
	var uris []string
	cursor := ""
	for range 8 { // two laps of the cycle and more
		p, err := listPage(ctx, cs, cursor)
		if err != nil {
			t.Fatalf("page: %v", err)
		}
		if p.NextCursor == "" {
			t.Fatalf("the scan ended; want a cycle")
		}
		uris = append(uris, p.URIs...)
		cursors = append(cursors, p.NextCursor)
		cursor = p.NextCursor
	}
	// Page 3 answers with the cursor that led to page 1: pages 1..3 repeat.
	if cursors[3] != cursors[0] {
		t.Errorf("page 3's next cursor %q is not page 0's %q", cursors[3], cursors[0])
	}
	want := []string{"demo://r/00", "demo://r/01", "demo://r/02", "demo://r/03", "demo://r/01", "demo://r/02", "demo://r/03", "demo://r/01"}
	if diff := cmp.Diff(want, uris); diff != "" {
		t.Errorf("pages visited (-want +got):\n%s", diff)
	}
	// Turning it off ends scans normally.
	s.SetCircularCursor(0, 0)
	if got := len(flatten(listAll(t, cs, 10))); got != 6 {
		t.Errorf("after turning the cycle off: %d URIs, want 6", got)
	}
}

func TestCursorRejections(t *testing.T) {
	t.Run("garbage and wrong kind", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{PageSize: 1})
		seed(s, 3)
		s.SetTemplate(chaosmcp.Template{URITemplate: "demo://t/{a}"})
		s.SetTemplate(chaosmcp.Template{URITemplate: "demo://t/{b}"})
		cs, _ := connect(t, s)
		ctx := testCtx(t)
		for _, c := range []string{"not-a-cursor!", "eyJwIjowfQ", "bm90IGpzb24"} {
			_, err := listPage(ctx, cs, c)
			if je := rpcError(t, err); je.Code != jsonrpc.CodeInvalidParams || je.Message != "invalid cursor" {
				t.Errorf("cursor %q: %d %q", c, je.Code, je.Message)
			}
		}
		tp, err := cs.ListResourceTemplates(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = listPage(ctx, cs, tp.NextCursor)
		if je := rpcError(t, err); je.Message != "invalid cursor" {
			t.Errorf("templates cursor on resources/list: %q", je.Message)
		}
		if got := s.Stats().CursorErrors; got != 4 {
			t.Errorf("CursorErrors = %d, want 4", got)
		}
	})

	t.Run("expire all issued cursors", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{PageSize: 1})
		seed(s, 3)
		cs, _ := connect(t, s)
		ctx := testCtx(t)
		p0, err := listPage(ctx, cs, "")
		if err != nil {
			t.Fatal(err)
		}
		s.ExpireCursors()
		_, err = listPage(ctx, cs, p0.NextCursor)
		if je := rpcError(t, err); je.Code != jsonrpc.CodeInvalidParams || je.Message != "cursor expired" {
			t.Errorf("expired cursor: %d %q", je.Code, je.Message)
		}
		if got := len(flatten(listAll(t, cs, 10))); got != 3 {
			t.Errorf("a fresh scan lists %d URIs, want 3", got)
		}
	})

	t.Run("expire at page", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{PageSize: 1})
		seed(s, 4)
		s.ExpireCursorAtPage(2)
		cs, _ := connect(t, s)
		ctx := testCtx(t)
		p0, _ := listPage(ctx, cs, "")
		p1, err := listPage(ctx, cs, p0.NextCursor)
		if err != nil {
			t.Fatalf("page 1: %v", err)
		}
		_, err = listPage(ctx, cs, p1.NextCursor)
		if je := rpcError(t, err); je.Message != "cursor expired" {
			t.Errorf("page 2: %q", je.Message)
		}
	})

	t.Run("cursor from an old session", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{PageSize: 1})
		seed(s, 3)
		s.BindCursorsToSession(true)
		a, _ := connect(t, s)
		b, _ := connect(t, s)
		ctx := testCtx(t)
		pa, err := listPage(ctx, a, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := listPage(ctx, a, pa.NextCursor); err != nil {
			t.Errorf("own cursor rejected: %v", err)
		}
		_, err = listPage(ctx, b, pa.NextCursor)
		if je := rpcError(t, err); je.Code != jsonrpc.CodeInvalidParams || je.Message != "cursor from an old session" {
			t.Errorf("other session's cursor: %d %q", je.Code, je.Message)
		}
		// After a restart the new session rejects the old cursor too.
		s.Restart()
		c, _ := connect(t, s)
		_, err = listPage(ctx, c, pa.NextCursor)
		if je := rpcError(t, err); je.Message != "cursor from an old session" {
			t.Errorf("pre-restart cursor: %q", je.Message)
		}
		// Unbound (the default), the same cursor works in any session.
		s.BindCursorsToSession(false)
		if _, err := listPage(ctx, c, pa.NextCursor); err != nil {
			t.Errorf("unbound cursor rejected: %v", err)
		}
	})
}

// TestChangeBetweenPages: the set changes while a client pages; the scan is inconsistent and
// the list_changed notification is observed, or lost when dropped.
func TestChangeBetweenPages(t *testing.T) {
	for _, drop := range []bool{false, true} {
		name := map[bool]string{false: "notified", true: "notification lost"}[drop]
		t.Run(name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{PageSize: 2})
			seed(s, 4) // r/00 r/01 | r/02 r/03
			cs, ev := connect(t, s)
			var mu sync.Mutex
			var hookPages []int
			s.OnBetweenPages(func(kind chaosmcp.ListKind, page int) {
				mu.Lock()
				hookPages = append(hookPages, page)
				mu.Unlock()
				if kind != chaosmcp.ListResources || page != 1 {
					return
				}
				if drop {
					s.DropListChanged(1)
				}
				s.Delete("demo://r/01") // already listed
				s.Set("demo://r/00a", "new", "text/plain")
			})
			pages := listAll(t, cs, 10)
			s.OnBetweenPages(nil)
			if diff := cmp.Diff([]string{"demo://r/00", "demo://r/01", "demo://r/02", "demo://r/03"}, flatten(pages)); diff != "" {
				t.Errorf("scan (-want +got):\n%s", diff)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff([]int{1}, hookPages); diff != "" {
				t.Errorf("hook pages (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"demo://r/00", "demo://r/00a", "demo://r/02", "demo://r/03"}, s.URIs()); diff != "" {
				t.Errorf("actual set (-want +got):\n%s", diff)
			}
			// Each mutation sends one list_changed unless dropped; then a sentinel change.
			s.Set("demo://sentinel", "s", "text/plain")
			want := 3
			if drop {
				want = 2
			}
			for range want {
				ev.nextListChanged(t)
			}
			if err := s.Await(testCtx(t), func(st chaosmcp.Stats) bool { return st.ListChangedSent == want }); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); drop && st.ListChangedDropped != 1 {
				t.Errorf("ListChangedDropped = %d, want 1", st.ListChangedDropped)
			}
		})
	}
}

func TestSuppressListChanged(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	cs, ev := connect(t, s)
	s.SuppressListChanged(true)
	s.Set("demo://a", "a", "text/plain")
	s.Delete("demo://a")
	s.SetTemplate(chaosmcp.Template{URITemplate: "demo://{x}"})
	s.SuppressListChanged(false)
	s.Set("demo://b", "b", "text/plain")
	ev.nextListChanged(t)
	readText(t, cs, "demo://b")
	if st := s.Stats(); st.ListChangedDropped != 3 || st.ListChangedSent != 1 {
		t.Errorf("list_changed dropped %d sent %d, want 3 and 1", st.ListChangedDropped, st.ListChangedSent)
	}
}

func TestSnapshotIDs(t *testing.T) {
	tests := []struct {
		name      string
		mode      chaosmcp.SnapshotMode
		advertise bool
		mutate    bool
		// want describes the IDs of the three pages: "none", "same" or "distinct".
		want string
	}{
		{"off", chaosmcp.SnapshotOff, true, false, "none"},
		{"honest stable set", chaosmcp.SnapshotHonest, true, false, "same"},
		{"honest changing set", chaosmcp.SnapshotHonest, true, true, "distinct"},
		{"forged changing set", chaosmcp.SnapshotForged, true, true, "same"},
		{"per page", chaosmcp.SnapshotPerPage, true, false, "distinct"},
		{"not negotiated", chaosmcp.SnapshotHonest, false, false, "same"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{PageSize: 2})
			seed(s, 6)
			s.SetCapabilities(chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: tt.advertise})
			s.SetSnapshotMode(tt.mode)
			if tt.mutate {
				s.OnBetweenPages(func(_ chaosmcp.ListKind, page int) {
					s.Set("demo://r/x"+strings.Repeat("x", page), "added", "text/plain")
				})
			}
			cs, _ := connect(t, s)
			ext, advertised := cs.InitializeResult().Capabilities.Experimental[chaosmcp.SnapshotCapability]
			if advertised != tt.advertise {
				t.Fatalf("advertised = %v, want %v", advertised, tt.advertise)
			}
			if advertised {
				if diff := cmp.Diff(map[string]any{"version": float64(1), "metaKey": chaosmcp.SnapshotMetaKey}, ext); diff != "" {
					t.Errorf("capability value (-want +got):\n%s", diff)
				}
			}
			pages := listAll(t, cs, 10)
			if len(pages) < 3 {
				t.Fatalf("%d pages", len(pages))
			}
			ids := map[any]bool{}
			for _, p := range pages {
				ids[p.SnapshotID] = true
			}
			got := "distinct"
			switch {
			case len(ids) == 1 && ids[nil]:
				got = "none"
			case len(ids) == 1:
				got = "same"
			case len(ids) != len(pages):
				got = "mixed"
			}
			if ids[nil] && got != "none" {
				got = "some missing"
			}
			if got != tt.want {
				t.Errorf("snapshot IDs %v: %s, want %s", ids, got, tt.want)
			}
			if tt.mode == chaosmcp.SnapshotForged && len(s.URIs()) == 6 {
				t.Errorf("the forged case did not change the set")
			}
		})
	}
}
