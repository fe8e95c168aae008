package gateway_test

// The shared test stack of the gateway's tests (used by the core, token and feed tests; keep
// its API stable): a real in-process mcpsync deployment (localstack: the Temporal test server,
// a fresh Postgres ledger database, one worker with its session host), one upstream MCP server
// (chaosmcp over streamable HTTP, registered as source "docs"), and the gateway on a free
// loopback port. Clients are real go-sdk clients of either protocol era.

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Protocol eras a test client speaks (connect's era argument).
const (
	era2025 = "2025-11-25" // stateful: initialize, Mcp-Session-Id, resources/subscribe, GET stream
	era2026 = "2026-07-28" // stateless: server/discover, subscriptions/listen (the go-sdk default)
)

// eras is every era, for table-driven tests.
var eras = []string{era2025, era2026}

// testSource is the name of the source the stack registers for its upstream server.
const testSource = "docs"

// gwStack is one running deployment with its gateway.
type gwStack struct {
	t   *testing.T
	Ctx context.Context
	// Stack is the deployment (Stack.Store is the ledger, Stack.Client the Temporal client).
	Stack *localstack.Stack
	Store *ledger.Store
	// Upstream is the upstream MCP server behind source "docs"; UpstreamURL its endpoint.
	Upstream    *chaosmcp.Server
	UpstreamURL string
	// Gateway is the gateway under test, listening on URL (http://127.0.0.1:PORT/mcp).
	Gateway *gateway.Gateway
	URL     string
	Log     *zap.Logger
}

// newGWStack starts a stack whose gateway has the options tune sets (Store, Temporal,
// Namespace, Logger and Addr 127.0.0.1:0 are filled in first). Everything stops when the test
// ends.
func newGWStack(t *testing.T, tune ...func(*gateway.Options)) *gwStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	st, err := localstack.Start(ctx, localstack.Options{AdminURL: pgtest.AdminURL(), Logger: log,
		Host: mcphost.Options{ClaimInterval: 200 * time.Millisecond, Lease: 3 * time.Second,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, KeepAlive: 500 * time.Millisecond}})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(st.Stop)
	up := chaosmcp.New(chaosmcp.Options{Name: "chaos", Version: "1.2.3"})
	t.Cleanup(func() { up.Close() })
	hs, err := up.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	s := &gwStack{t: t, Ctx: ctx, Stack: st, Store: st.Store, Upstream: up, UpstreamURL: hs.URL, Log: log}
	s.MustCLI("source", "add", testSource, "--url", hs.URL)

	opts := gateway.Options{Addr: "127.0.0.1:0", Store: st.Store, Temporal: st.Client, Namespace: st.Namespace, Logger: log}
	for _, f := range tune {
		f(&opts)
	}
	gw, err := gateway.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	s.Gateway, s.URL = gw, gw.URL()
	return s
}

// CLI runs an mcpsync command against the stack.
func (s *gwStack) CLI(args ...string) (stdout, stderr string, code int) {
	return s.Stack.CLI(s.Ctx, args...)
}

// MustCLI runs an mcpsync command and fails the test unless it exits 0.
func (s *gwStack) MustCLI(args ...string) string {
	s.t.Helper()
	out, errOut, code := s.CLI(args...)
	if code != 0 {
		s.t.Fatalf("mcpsync %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// Token creates a bearer token for principal (no expiry) and returns its plaintext.
func (s *gwStack) Token(principal string) string {
	s.t.Helper()
	_, plain, err := s.Store.CreateToken(s.Ctx, principal, 0)
	if err != nil {
		s.t.Fatalf("create token for %s: %v", principal, err)
	}
	return plain
}

// Grant lets principal read source (mcpsync grant).
func (s *gwStack) Grant(principal, source string) {
	s.t.Helper()
	s.MustCLI("grant", principal, source)
}

// Put sets an upstream resource's text (the upstream notifies its subscribers).
func (s *gwStack) Put(upstreamURI, body string) { s.Upstream.Set(upstreamURI, body, "text/plain") }

// Subscribe subscribes principal to an upstream resource of source through the CLI (waiting
// until ACTIVE) and then until a version of body is accepted.
func (s *gwStack) Subscribe(principal, source, upstreamURI, body string) ledger.Subscription {
	s.t.Helper()
	s.MustCLI("subscribe", source, upstreamURI, "--principal", principal)
	return s.WaitBody(principal, source, upstreamURI, body)
}

// WaitBody waits until principal's subscription's newest accepted version is body.
func (s *gwStack) WaitBody(principal, source, upstreamURI, body string) ledger.Subscription {
	s.t.Helper()
	want := ledger.Digest([]byte(body))
	var sub ledger.Subscription
	eventually(s.t, 30*time.Second, "version of "+upstreamURI+" accepted", func() (bool, string) {
		var err error
		sub, err = s.Store.SubscriptionByKey(s.Ctx, principal, source, upstreamURI)
		if err != nil {
			return false, err.Error()
		}
		return sub.LastAcceptedDigest == want, "state " + string(sub.State) + ", digest " + sub.LastAcceptedDigest
	})
	return sub
}

// GatewayURI is the gateway URI of an upstream resource of source.
func GatewayURI(source, upstreamURI string) string {
	return gateway.URI{Source: source, Upstream: upstreamURI}.String()
}

// Client is a go-sdk client session to the gateway with what its HTTP layer saw.
type Client struct {
	*mcp.ClientSession
	// Versions are the Mcp-Protocol-Version headers the client sent, in order (deduplicated).
	Versions func() []string
}

// Connect opens a go-sdk client session to the gateway in era (era2025 or era2026) with
// token as its bearer token (none if empty); copts may set notification handlers. The
// session is closed when the test ends.
func (s *gwStack) Connect(token, era string, copts *mcp.ClientOptions) (*Client, error) {
	rt := &recordingTransport{token: token, base: http.DefaultTransport}
	tr := &mcp.StreamableClientTransport{Endpoint: s.URL, HTTPClient: &http.Client{Transport: rt}, MaxRetries: 1}
	cl := mcp.NewClient(&mcp.Implementation{Name: "gateway-test", Version: "1"}, copts)
	var so *mcp.ClientSessionOptions
	if era == era2025 {
		so = &mcp.ClientSessionOptions{ProtocolVersion: era2025}
	}
	ctx, cancel := context.WithTimeout(s.Ctx, 20*time.Second)
	defer cancel()
	cs, err := cl.Connect(ctx, tr, so)
	if err != nil {
		return nil, err
	}
	s.t.Cleanup(func() { cs.Close() })
	return &Client{ClientSession: cs, Versions: rt.versions}, nil
}

// MustConnect is Connect that fails the test on error and checks that the session speaks era
// (by the protocol version headers its requests carried). (Ping is not used to check the
// session: the go-sdk v1.8.0 client sends a 2026-07-28 ping without the _meta protocol
// version, which the server rejects.)
func (s *gwStack) MustConnect(token, era string, copts *mcp.ClientOptions) *Client {
	s.t.Helper()
	c, err := s.Connect(token, era, copts)
	if err != nil {
		s.t.Fatalf("connect (%s): %v", era, err)
	}
	if v := c.Versions(); !slices.Contains(v, era) || (era == era2025 && slices.Contains(v, era2026)) {
		s.t.Fatalf("session meant to speak %s sent protocol versions %v", era, v)
	}
	return c
}

// recordingTransport adds the bearer token and records the protocol versions sent.
type recordingTransport struct {
	token string
	base  http.RoundTripper
	mu    sync.Mutex
	seen  []string
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" {
		rt.mu.Lock()
		if !slices.Contains(rt.seen, v) {
			rt.seen = append(rt.seen, v)
		}
		rt.mu.Unlock()
	}
	if rt.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+rt.token)
	}
	return rt.base.RoundTrip(r)
}

func (rt *recordingTransport) versions() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.seen)
}

// VersionMeta decodes _meta["mcpsync/version"] of a read result.
func VersionMeta(t *testing.T, m mcp.Meta) gateway.ResourceVersion {
	t.Helper()
	var rv gateway.ResourceVersion
	remarshal(t, m[gateway.MetaVersion], &rv)
	return rv
}

// remarshal decodes a _meta value (a map after JSON) into out.
func remarshal(t *testing.T, v any, out any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// eventually polls cond until it holds or the timeout passes; the message of the last
// attempt explains a failure.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not reached within %s: %s", what, timeout, last)
}
