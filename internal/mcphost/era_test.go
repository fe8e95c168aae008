package mcphost_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

var modernOnly = []string{chaosmcp.ProtocolModern}

// TestConnectEras: what each --protocol choice negotiates with a legacy-only, a both-era and
// a modern-only server, and the clear error of a pinned revision the server does not speak.
func TestConnectEras(t *testing.T) {
	const legacy, modern = ledger.ProtocolLegacy, ledger.ProtocolModern
	servers := map[string][]string{"legacy-only": nil, "both": chaosmcp.AllProtocolVersions, "modern-only": modernOnly}
	tests := []struct {
		server, choice string
		want           string // negotiated revision; "" when the connect must fail
		wantErr        string // substring of the *EraError
	}{
		{server: "legacy-only", choice: "", want: legacy},
		{server: "legacy-only", choice: ledger.ProtocolAuto, want: legacy},
		{server: "legacy-only", choice: legacy, want: legacy},
		{server: "legacy-only", choice: modern, wantErr: "pins MCP 2026-07-28 (--protocol) but the server negotiated 2025-11-25"},
		{server: "both", choice: ledger.ProtocolAuto, want: modern},
		{server: "both", choice: "", want: modern},
		{server: "both", choice: legacy, want: legacy},
		{server: "both", choice: modern, want: modern},
		{server: "modern-only", choice: ledger.ProtocolAuto, want: modern},
		{server: "modern-only", choice: legacy, wantErr: "pins MCP 2025-11-25 (--protocol) but the server refused it"},
		{server: "modern-only", choice: modern, want: modern},
	}
	for _, tt := range tests {
		t.Run(tt.server+"/"+tt.choice, func(t *testing.T) {
			ctx := t.Context()
			s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: servers[tt.server]})
			t.Cleanup(func() { _ = s.Close() })
			client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil)
			transports := 0
			cs, _, err := mcphost.Connect(ctx, client, tt.choice, func() (mcp.Transport, error) {
				transports++
				return s.InMemoryTransport(ctx)
			})
			if tt.wantErr != "" {
				var ee *mcphost.EraError
				if !errors.As(err, &ee) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want an *EraError containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got := cs.InitializeResult().ProtocolVersion; got != tt.want {
				t.Errorf("negotiated %s, want %s", got, tt.want)
			}
			if transports != 1 {
				t.Errorf("connect used %d transports, want 1 (the go-sdk falls back from server/discover to initialize on the same connection)", transports)
			}
		})
	}
}

// modernHost runs a host whose one source is a both-era chaosmcp server reached in memory,
// with the given --protocol choice, and returns the live session.
func modernHost(t *testing.T, f *fixture, s *chaosmcp.Server, choice string) (*mcphost.Conn, ledger.Source) {
	t.Helper()
	src := f.addSource(ledger.SourceSpec{Name: "era", Transport: ledger.TransportStdio, Command: []string{"unused"},
		Connection: ledger.Connection{Protocol: choice}})
	h := f.startHost("host-era", mcphost.Options{Transport: func(ctx context.Context, _ ledger.Source) (mcp.Transport, error) {
		return s.InMemoryTransport(ctx)
	}}, newRecorder())
	return f.waitSession(h, src.ID, 0), src
}

// TestModernSessionReceipt: a session pinned to 2026-07-28 records that era and the
// server's declared capabilities in its receipt, and a subscribe there rides on a
// subscriptions/listen stream that the server acknowledges.
func TestModernSessionReceipt(t *testing.T) {
	f := newFixture(t)
	s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { _ = s.Close() })
	s.Set("demo://a", "v1", "text/plain")
	c, src := modernHost(t, f, s, ledger.ProtocolModern)
	rows := f.sessions(src.ID)
	if len(rows) != 1 {
		t.Fatalf("%d sessions, want 1", len(rows))
	}
	got := rows[0].Caps
	want := ledger.CapabilityReceipt{ProtocolVersion: ledger.ProtocolModern, Resources: true, Subscribe: true,
		ListChanged: true, ServerName: "chaosmcp", ServerVersion: "0.1.0"}
	if diff := cmp.Diff(want, got, cmpIgnoreRaw); diff != "" {
		t.Errorf("receipt (-want +got):\n%s", diff)
	}
	res, err := c.Watch(f.ctx, "demo://a", 1)
	if err != nil || res.NotAcknowledged {
		t.Fatalf("Watch on a 2026-07-28 session = %+v, %v; want acknowledged", res, err)
	}
}

var cmpIgnoreRaw = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Raw" }, cmp.Ignore())

// TestPinnedEraNotSpoken: a source pinned to 2026-07-28 on a server that speaks only the
// legacy era is FAILED, and its health says why.
func TestPinnedEraNotSpoken(t *testing.T) {
	f := newFixture(t)
	s := chaosmcp.New(chaosmcp.Options{})
	t.Cleanup(func() { _ = s.Close() })
	src := f.addSource(ledger.SourceSpec{Name: "pinned", Transport: ledger.TransportStdio, Command: []string{"unused"},
		Connection: ledger.Connection{Protocol: ledger.ProtocolModern}})
	f.startHost("host-pinned", mcphost.Options{Transport: func(ctx context.Context, _ ledger.Source) (mcp.Transport, error) {
		return s.InMemoryTransport(ctx)
	}}, newRecorder())
	h := f.waitHealth(src.ID, "FAILED", func(h ledger.SourceHealth) bool { return h.State == ledger.HealthFailed })
	if want := "protocol: the source pins MCP 2026-07-28 (--protocol) but the server negotiated 2025-11-25"; !strings.Contains(h.LastError, want) {
		t.Errorf("health error %q, want it to contain %q", h.LastError, want)
	}
}

// TestTTLNeverServesFromCache: a 2026-07-28 server answers ttlMs 60000; a change made
// without a notification is still seen by the next read of the live session (what a backstop
// or poll read does), because every read reaches the server.
func TestTTLNeverServesFromCache(t *testing.T) {
	f := newFixture(t)
	s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { _ = s.Close() })
	s.Set("demo://a", "v1", "text/plain")
	s.SetResultCache(60000, "private")
	c, _ := modernHost(t, f, s, ledger.ProtocolModern)
	read := func() string {
		t.Helper()
		res, err := c.Session().ReadResource(f.ctx, &mcp.ReadResourceParams{URI: "demo://a"})
		if err != nil {
			t.Fatal(err)
		}
		return res.Contents[0].Text
	}
	if got := read(); got != "v1" {
		t.Fatalf("first read %q", got)
	}
	s.DropUpdates(1)
	s.Set("demo://a", "v2", "text/plain") // no notification reaches anyone
	if got := read(); got != "v2" {
		t.Errorf("backstop read %q, want v2 (served from the TTL cache?)", got)
	}
	if got := s.Stats().Reads["demo://a"]; got != 2 {
		t.Errorf("the server saw %d reads, want 2", got)
	}
	if _, err := c.Session().ListResources(f.ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Session().ListResources(f.ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().ListCalls; got != 2 {
		t.Errorf("the server saw %d resources/list calls, want 2", got)
	}
}

// TestGuardClientTTL is the unit form: a guarded client's second read reaches the server,
// an unguarded one's does not (the go-sdk serves it from its cache).
func TestGuardClientTTL(t *testing.T) {
	for _, tt := range []struct {
		guarded   bool
		wantReads int
	}{{guarded: true, wantReads: 2}, {guarded: false, wantReads: 1}} {
		t.Run(map[bool]string{true: "guarded", false: "plain"}[tt.guarded], func(t *testing.T) {
			s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
			t.Cleanup(func() { _ = s.Close() })
			s.Set("demo://a", "v1", "text/plain")
			s.SetResultCache(60000, "public")
			client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil)
			if tt.guarded {
				mcphost.GuardClient(client, mcphost.Guard{})
			}
			cs, err := s.ConnectClientInMemory(t.Context(), client, ledger.ProtocolModern)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			for range 2 {
				if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "demo://a"}); err != nil {
					t.Fatal(err)
				}
			}
			if got := s.Stats().Reads["demo://a"]; got != tt.wantReads {
				t.Errorf("the server saw %d reads, want %d", got, tt.wantReads)
			}
		})
	}
}

// TestReadOutcomesByEra: how a guarded session's read answers are classified, per era: the
// not-found codes, and empty contents (a protocol error, audited, on 2026-07-28 only). The
// activities' own classification (activities.IsNotFound, activities.Classify) needs no change.
func TestReadOutcomesByEra(t *testing.T) {
	type outcome struct {
		NotFound     bool
		Class        string
		Protocol     bool
		ProtocolAuds int
	}
	tests := []struct {
		name   string
		choice string
		style  chaosmcp.NotFoundStyle
		empty  bool
		want   outcome
	}{
		{name: "2026 bare -32602", choice: ledger.ProtocolModern, style: chaosmcp.NotFoundBare, want: outcome{NotFound: true, Class: "not-found"}},
		{name: "2026 -32002", choice: ledger.ProtocolModern, style: chaosmcp.NotFoundMCP, want: outcome{NotFound: true, Class: "not-found"}},
		{name: "2026 -32602 with uri", choice: ledger.ProtocolModern, style: chaosmcp.NotFoundInvalidParams, want: outcome{NotFound: true, Class: "not-found"}},
		{name: "2025 -32002", choice: ledger.ProtocolLegacy, style: chaosmcp.NotFoundMCP, want: outcome{NotFound: true, Class: "not-found"}},
		{name: "2025 -32602 message", choice: ledger.ProtocolLegacy, style: chaosmcp.NotFoundMessage, want: outcome{NotFound: true, Class: "not-found"}},
		// Under 2025-11-25 a bare -32602 may be malformed params: not assumed to be not-found.
		{name: "2025 bare -32602", choice: ledger.ProtocolLegacy, style: chaosmcp.NotFoundBare, want: outcome{Class: "permanent"}},
		{name: "2026 empty contents", choice: ledger.ProtocolModern, empty: true, want: outcome{Class: "permanent", Protocol: true, ProtocolAuds: 1}},
		// Under 2025-11-25 empty contents is an empty resource, as before.
		{name: "2025 empty contents", choice: ledger.ProtocolLegacy, empty: true, want: outcome{Class: "ok"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
			t.Cleanup(func() { _ = s.Close() })
			s.Set("demo://a", "v1", "text/plain")
			s.SetNotFoundStyle(tt.style)
			target := "demo://missing"
			if tt.empty {
				s.AddReadFault(chaosmcp.ReadFault{URI: "demo://a", Fail: chaosmcp.ReadEmpty})
				target = "demo://a"
			}
			c, src := modernHost(t, f, s, tt.choice)
			_, err := c.Session().ReadResource(f.ctx, &mcp.ReadResourceParams{URI: target})
			var got outcome
			got.Class = "ok"
			if err != nil {
				got.NotFound = activities.IsNotFound(err)
				got.Class = activities.Classify(err).String()
				_, got.Protocol = errors.AsType[*mcphost.ProtocolError](err)
				if got.NotFound != mcphost.IsNotFound(err) {
					t.Errorf("mcphost.IsNotFound = %v, activities.IsNotFound = %v", mcphost.IsNotFound(err), got.NotFound)
				}
			}
			n, aerr := f.store.AuditCount(f.ctx, src.ID, ledger.ReceiptProtocolError)
			if aerr != nil {
				t.Fatal(aerr)
			}
			got.ProtocolAuds = n
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s\nerr: %v", diff, err)
			}
		})
	}
}

// TestModernSessionOverHTTP: a source pinned to 2026-07-28 over streamable HTTP (the
// stateless handler of a both-era endpoint) opens a session of that era, reads through it,
// and notices the server's death by keep-alive: the session ends and the source backs off.
func TestModernSessionOverHTTP(t *testing.T) {
	f := newFixture(t)
	s := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { _ = s.Close() })
	s.Set("demo://a", "v1", "text/plain")
	hs, err := s.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hs.Close() })
	src := f.addSource(ledger.SourceSpec{Name: "modern-http", Transport: ledger.TransportHTTP, URL: hs.URL,
		Connection: ledger.Connection{Protocol: ledger.ProtocolModern}})
	h := f.startHost("host-modern-http", mcphost.Options{KeepAlive: 200 * time.Millisecond}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
	if got := c.Caps().ProtocolVersion; got != ledger.ProtocolModern {
		t.Fatalf("era %s, want %s", got, ledger.ProtocolModern)
	}
	res, err := c.Session().ReadResource(f.ctx, &mcp.ReadResourceParams{URI: "demo://a"})
	if err != nil || res.Contents[0].Text != "v1" {
		t.Fatalf("read: %v %v", res, err)
	}
	health := f.waitHealth(src.ID, "LIVE at 2026-07-28", func(h ledger.SourceHealth) bool {
		return h.State == ledger.HealthLive && h.Session != nil && h.Session.Caps.ProtocolVersion == ledger.ProtocolModern
	})
	if health.Generation != c.Generation() {
		t.Errorf("health generation %d, session %d", health.Generation, c.Generation())
	}
	_ = hs.Close()
	f.waitHealth(src.ID, "the end noticed", func(h ledger.SourceHealth) bool { return h.State != ledger.HealthLive })
	rows := f.sessions(src.ID)
	if len(rows) == 0 || !rows[0].Ended {
		t.Errorf("sessions %+v: want the 2026-07-28 session ended", rows)
	}
}
