package discovery_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/discovery"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// TestScanRejectedCursorByEra: a -32602 answered to a request with a cursor fails a
// 2025-11-25 round at once (CURSOR_ERROR, R8); on a 2026-07-28 session it discards the pages
// and starts the round again from the first page, at most DefaultCursorRestarts times, after
// which the round fails as CURSOR_ERROR too (issue 13 item 7). A round that got through lists
// the whole set, with digests of its last start only.
func TestScanRejectedCursorByEra(t *testing.T) {
	type outcome struct {
		Complete       bool
		FailureKind    string
		CursorRestarts int
		DiscardedPages int
		ResourcePages  int
		Resources      int
		CursorDigests  int
		CursorErrors   int
	}
	full := outcome{Complete: true, ResourcePages: 4, Resources: 7, CursorDigests: 3}
	tests := []struct {
		name       string
		version    string
		rejections int
		want       outcome
	}{
		{name: "2025-11-25 no rejection", version: chaosmcp.ProtocolVersion, want: full},
		{name: "2025-11-25 one rejection fails", version: chaosmcp.ProtocolVersion, rejections: 1,
			want: outcome{FailureKind: contract.RoundCursorError, ResourcePages: 2, Resources: 4, CursorDigests: 2, CursorErrors: 1}},
		{name: "2026-07-28 no rejection", version: chaosmcp.ProtocolModern, want: full},
		{name: "2026-07-28 one rejection restarts", version: chaosmcp.ProtocolModern, rejections: 1,
			want: outcome{Complete: true, CursorRestarts: 1, DiscardedPages: 2, ResourcePages: 4, Resources: 7, CursorDigests: 3, CursorErrors: 1}},
		{name: "2026-07-28 rejections up to the bound", version: chaosmcp.ProtocolModern, rejections: discovery.DefaultCursorRestarts,
			want: outcome{Complete: true, CursorRestarts: 3, DiscardedPages: 6, ResourcePages: 4, Resources: 7, CursorDigests: 3, CursorErrors: 3}},
		{name: "2026-07-28 rejections past the bound fail", version: chaosmcp.ProtocolModern, rejections: discovery.DefaultCursorRestarts + 1,
			want: outcome{FailureKind: contract.RoundCursorError, CursorRestarts: 3, DiscardedPages: 6, ResourcePages: 2, Resources: 4, CursorDigests: 2, CursorErrors: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := chaosmcp.New(chaosmcp.Options{PageSize: 2, ProtocolVersions: chaosmcp.AllProtocolVersions})
			t.Cleanup(func() { _ = s.Close() })
			for i := range 7 {
				s.Set("demo://r/"+string(rune('a'+i)), "x", "text/plain")
			}
			ver := tt.version
			if ver == chaosmcp.ProtocolModern {
				ver = "" // negotiate: the go-sdk client picks 2026-07-28
			}
			cs, err := s.ConnectInMemoryAt(testCtx(t), nil, ver)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			negotiated := cs.InitializeResult().ProtocolVersion
			if negotiated != tt.version {
				t.Fatalf("negotiated %s, want %s", negotiated, tt.version)
			}
			s.ExpireCursorAtPageTimes(2, tt.rejections)
			res := discovery.Scan(testCtx(t), cs, discovery.Options{CursorRestarts: discovery.CursorRestartsFor(negotiated)})
			got := outcome{res.Complete, res.FailureKind, res.CursorRestarts, res.DiscardedPages, res.ResourcePages,
				res.Resources, len(res.ResourceCursorDigests), s.Stats().CursorErrors}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("round (-want +got):\n%s\nerror: %v", diff, res.Err)
			}
			if res.Complete {
				if diff := cmp.Diff(s.URIs(), resourceURIs(res.Entries)); diff != "" {
					t.Errorf("entries (-server +round):\n%s", diff)
				}
			}
		})
	}
}

// TestScanEmptyCursor: on a 2026-07-28 session an empty nextCursor is a cursor, not the end
// of the list (MCP 2026-07-28 pagination). Through TranslateEmptyCursors the round follows
// it and lists the whole set; through the go-sdk alone it cannot (its types drop the empty
// string, so the page reads as the last one — the gap the translation closes); a 2025-11-25
// session is never sent one.
func TestScanEmptyCursor(t *testing.T) {
	type outcome struct {
		Complete      bool
		ResourcePages int
		Resources     int
		CursorDigests int
	}
	tests := []struct {
		name      string
		version   string
		http      bool
		translate bool
		want      outcome
	}{
		{name: "2026-07-28 in-memory translated", version: chaosmcp.ProtocolModern, translate: true, want: outcome{true, 4, 7, 3}},
		{name: "2026-07-28 in-memory go-sdk alone stops at the empty cursor", version: chaosmcp.ProtocolModern, want: outcome{true, 2, 4, 1}},
		{name: "2026-07-28 http translated", version: chaosmcp.ProtocolModern, http: true, translate: true, want: outcome{true, 4, 7, 3}},
		{name: "2026-07-28 http go-sdk alone stops at the empty cursor", version: chaosmcp.ProtocolModern, http: true, want: outcome{true, 2, 4, 1}},
		{name: "2025-11-25 in-memory translated", version: chaosmcp.ProtocolVersion, translate: true, want: outcome{true, 4, 7, 3}},
		{name: "2025-11-25 http translated", version: chaosmcp.ProtocolVersion, http: true, translate: true, want: outcome{true, 4, 7, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := chaosmcp.New(chaosmcp.Options{PageSize: 2, ProtocolVersions: chaosmcp.AllProtocolVersions})
			t.Cleanup(func() { _ = s.Close() })
			for i := range 7 {
				s.Set("demo://r/"+string(rune('a'+i)), "x", "text/plain")
			}
			s.SetEmptyCursorAtPage(2)
			var tr mcp.Transport
			if tt.http {
				hs, err := s.StartHTTPBothEras("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = hs.Close() })
				st := &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}
				if tt.translate {
					st.HTTPClient = discovery.TranslateEmptyCursorsHTTP(nil)
				}
				tr = st
			} else {
				var err error
				if tr, err = s.InMemoryTransport(testCtx(t)); err != nil {
					t.Fatal(err)
				}
				if tt.translate {
					tr = discovery.TranslateEmptyCursors(tr)
				}
			}
			ver := tt.version
			if ver == chaosmcp.ProtocolModern {
				ver = ""
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(testCtx(t), tr, &mcp.ClientSessionOptions{ProtocolVersion: ver})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got := cs.InitializeResult().ProtocolVersion; got != tt.version {
				t.Fatalf("negotiated %s, want %s", got, tt.version)
			}
			res := discovery.Scan(testCtx(t), cs, discovery.Options{})
			got := outcome{res.Complete, res.ResourcePages, res.Resources, len(res.ResourceCursorDigests)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("round (-want +got):\n%s\nerror: %v", diff, res.Err)
			}
			if tt.want.Resources == 7 {
				if diff := cmp.Diff(s.URIs(), resourceURIs(res.Entries)); diff != "" {
					t.Errorf("entries (-server +round):\n%s", diff)
				}
			}
		})
	}
}
