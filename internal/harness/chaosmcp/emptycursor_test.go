package chaosmcp_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// wireTap records, per list response, whether the raw result carried nextCursor and its value.
type wireTap struct {
	mcp.Transport
	mu    sync.Mutex
	pages []*string // nil: no nextCursor in the result
}

func (w *wireTap) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := w.Transport.Connect(ctx)
	return &wireConn{Connection: c, w: w}, err
}

type wireConn struct {
	mcp.Connection
	w *wireTap
}

func (c *wireConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if resp, ok := msg.(*jsonrpc.Response); ok && err == nil && resp.Error == nil {
		var r struct {
			Resources  []json.RawMessage `json:"resources"`
			NextCursor *string           `json:"nextCursor"`
		}
		if json.Unmarshal(resp.Result, &r) == nil && r.Resources != nil {
			c.w.mu.Lock()
			c.w.pages = append(c.w.pages, r.NextCursor)
			c.w.mu.Unlock()
		}
	}
	return msg, err
}

// TestEmptyCursorOnTheWire: with SetEmptyCursorAtPage(1), a 2026-07-28 client's first page
// answers "nextCursor": "" on the wire (the go-sdk alone would omit it), while a legacy
// client's first page carries a real cursor; ExpireCursorAtPageTimes rejects that many
// requests for the page and then lets the next one through.
func TestEmptyCursorOnTheWire(t *testing.T) {
	for _, tt := range []struct {
		name    string
		version string
		want    []bool // per page: nextCursor present and empty
	}{
		{name: "2026-07-28", version: "", want: []bool{true}},
		{name: "2025-11-25", version: chaosmcp.ProtocolVersion, want: []bool{false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{PageSize: 2, ProtocolVersions: chaosmcp.AllProtocolVersions})
			seed(s, 5)
			s.SetEmptyCursorAtPage(1)
			ct, err := s.InMemoryTransport(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			tap := &wireTap{Transport: ct}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "wire", Version: "0"}, nil).Connect(testCtx(t), tap, &mcp.ClientSessionOptions{ProtocolVersion: tt.version})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			res, err := cs.ListResources(testCtx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.NextCursor != "" && tt.want[0] {
				t.Errorf("the go-sdk read nextCursor %q, want \"\"", res.NextCursor)
			}
			tap.mu.Lock()
			var got []bool
			for _, p := range tap.pages {
				got = append(got, p != nil && *p == "")
			}
			tap.mu.Unlock()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("nextCursor present and empty, per page (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("rejections", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{PageSize: 2})
		seed(s, 5)
		cs, _ := connect(t, s)
		s.ExpireCursorAtPageTimes(1, 2)
		var codes []int64
		for range 3 {
			first, err := cs.ListResources(testCtx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cs.ListResources(testCtx(t), &mcp.ListResourcesParams{Cursor: first.NextCursor})
			code := int64(0)
			if err != nil {
				code = rpcError(t, err).Code
			}
			codes = append(codes, code)
		}
		if diff := cmp.Diff([]int64{-32602, -32602, 0}, codes); diff != "" {
			t.Errorf("page 1 answers (-want +got):\n%s", diff)
		}
	})
}
