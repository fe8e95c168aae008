package chaosmcp_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// TestMain doubles as a stdio MCP server when re-executed by TestStdio.
func TestMain(m *testing.M) {
	if os.Getenv(stdioChildEnv) == "1" {
		os.Exit(runStdioChild())
	}
	os.Exit(m.Run())
}

// wait is the upper bound for any single expected event; tests never sleep for it.
const wait = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

func newServer(t *testing.T, opts chaosmcp.Options) *chaosmcp.Server {
	t.Helper()
	s := chaosmcp.New(opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// events records what a client session observes, in arrival order.
type events struct {
	updated     chan string
	listChanged chan struct{}
}

func newEvents() (*events, *mcp.ClientOptions) {
	e := &events{updated: make(chan string, 1000), listChanged: make(chan struct{}, 1000)}
	return e, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			e.updated <- req.Params.URI
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			e.listChanged <- struct{}{}
		},
	}
}

// nextUpdate returns the URI of the next updated notification the client received.
func (e *events) nextUpdate(t *testing.T) string {
	t.Helper()
	select {
	case u := <-e.updated:
		return u
	case <-time.After(wait):
		t.Fatalf("no notifications/resources/updated within %v", wait)
		return ""
	}
}

// updatesUntil collects updated URIs up to and including the first one equal to sentinel.
func (e *events) updatesUntil(t *testing.T, sentinel string) []string {
	t.Helper()
	var got []string
	for {
		u := e.nextUpdate(t)
		got = append(got, u)
		if u == sentinel {
			return got
		}
	}
}

func (e *events) nextListChanged(t *testing.T) {
	t.Helper()
	select {
	case <-e.listChanged:
	case <-time.After(wait):
		t.Fatalf("no notifications/resources/list_changed within %v", wait)
	}
}

// pendingListChanged returns how many list_changed notifications arrived and were not consumed.
func (e *events) pendingListChanged() int { return len(e.listChanged) }

// connect opens an in-memory client session with event recording.
func connect(t *testing.T, s *chaosmcp.Server) (*mcp.ClientSession, *events) {
	t.Helper()
	e, opts := newEvents()
	cs, err := s.ConnectInMemory(testCtx(t), opts)
	if err != nil {
		t.Fatalf("ConnectInMemory: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, e
}

// rpcCode returns the JSON-RPC error code and error of err, failing the test if err is not one.
func rpcError(t *testing.T, err error) *jsonrpc.Error {
	t.Helper()
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		t.Fatalf("error %v (%T) is not a *jsonrpc.Error", err, err)
	}
	return je
}

// page is one page of resources/list as the client saw it.
type page struct {
	URIs       []string
	NextCursor string
	SnapshotID any
}

func listPage(ctx context.Context, cs *mcp.ClientSession, cursor string) (page, error) {
	res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
	if err != nil {
		return page{}, err
	}
	p := page{NextCursor: res.NextCursor, URIs: []string{}}
	for _, r := range res.Resources {
		p.URIs = append(p.URIs, r.URI)
	}
	if res.Meta != nil {
		p.SnapshotID = res.Meta[chaosmcp.SnapshotMetaKey]
	}
	return p, nil
}

// listAll pages through resources/list, failing on a repeated cursor or more than maxPages.
func listAll(t *testing.T, cs *mcp.ClientSession, maxPages int) []page {
	t.Helper()
	ctx := testCtx(t)
	var pages []page
	seen := map[string]bool{}
	cursor := ""
	for {
		p, err := listPage(ctx, cs, cursor)
		if err != nil {
			t.Fatalf("list page %d: %v", len(pages), err)
		}
		pages = append(pages, p)
		if p.NextCursor == "" {
			return pages
		}
		if seen[p.NextCursor] || len(pages) >= maxPages {
			t.Fatalf("cursor cycle or page blow-up after %d pages", len(pages))
		}
		seen[p.NextCursor] = true
		cursor = p.NextCursor
	}
}

func flatten(pages []page) []string {
	out := []string{}
	for _, p := range pages {
		out = append(out, p.URIs...)
	}
	return out
}

func readText(t *testing.T, cs *mcp.ClientSession, uri string) string {
	t.Helper()
	res, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatalf("read %s: %v", uri, err)
	}
	if len(res.Contents) != 1 {
		t.Fatalf("read %s: %d contents", uri, len(res.Contents))
	}
	return res.Contents[0].Text
}

func subscribe(t *testing.T, cs *mcp.ClientSession, uris ...string) {
	t.Helper()
	for _, u := range uris {
		if err := cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: u}); err != nil {
			t.Fatalf("subscribe %s: %v", u, err)
		}
	}
}

// seed fills the server with n text resources demo://r/00 … and returns their URIs.
func seed(s *chaosmcp.Server, n int) []string {
	var uris []string
	var rs []chaosmcp.Resource
	for i := range n {
		u := fmt.Sprintf("demo://r/%02d", i)
		uris = append(uris, u)
		rs = append(rs, chaosmcp.Resource{URI: u, Text: fmt.Sprintf("body %d", i), MIMEType: "text/plain"})
	}
	s.PutMany(rs...)
	return uris
}

// startHTTP starts s on a free loopback port, stopped when the test ends.
func startHTTP(t *testing.T, s *chaosmcp.Server) *chaosmcp.HTTPServer {
	t.Helper()
	hs, err := s.StartHTTP("")
	if err != nil {
		t.Fatalf("StartHTTP: %v", err)
	}
	t.Cleanup(func() { _ = hs.Close() })
	return hs
}

// dialHTTP connects a client to hs (pinging every keepAlive when positive), closed when the
// test ends.
func dialHTTP(t *testing.T, hs *chaosmcp.HTTPServer, keepAlive time.Duration) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "live-test", Version: "0"}, &mcp.ClientOptions{KeepAlive: keepAlive})
	cs, err := client.Connect(testCtx(t), &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: 1},
		&mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}
