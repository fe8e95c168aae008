package chaosmcp_test

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// listChangedLog records the list_changed notifications a client receives, with the
// subscription ID in their _meta ("" for legacy sessions).
type listChangedLog chan string

func (l listChangedLog) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ResourceListChangedHandler: func(_ context.Context, req *mcp.ResourceListChangedRequest) {
			id := ""
			if req.Params != nil {
				id = toText(req.Params.Meta[mcp.MetaKeySubscriptionID])
			}
			l <- id
		},
	}
}

func (l listChangedLog) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-l:
		return id
	case <-time.After(wait):
		t.Fatalf("no notifications/resources/list_changed within %v", wait)
		return ""
	}
}

// TestListChangedBothEras: list_changed reaches a legacy session on its session channel and
// a 2026-07-28 session on the listen stream its go-sdk client opened at connect (filter
// resourcesListChanged), stamped with that stream's subscription ID — over in-memory
// transports, the both-era HTTP endpoint and the bare stateless handler — and the
// list_changed knobs (DropListChanged, SuppressListChanged) apply to both eras.
func TestListChangedBothEras(t *testing.T) {
	for _, tt := range []struct {
		name, transport, version, wantVersion string
	}{
		{name: "in-memory legacy", transport: "in-memory", version: chaosmcp.ProtocolVersion, wantVersion: chaosmcp.ProtocolVersion},
		{name: "in-memory 2026", transport: "in-memory", wantVersion: chaosmcp.ProtocolModern},
		{name: "http both eras legacy", transport: "http", version: chaosmcp.ProtocolVersion, wantVersion: chaosmcp.ProtocolVersion},
		{name: "http both eras 2026", transport: "http", wantVersion: chaosmcp.ProtocolModern},
		{name: "http stateless 2026", transport: "stateless", wantVersion: chaosmcp.ProtocolModern},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			s := newServer(t, chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
			s.Set("demo://a", "a1", "text/plain")
			log := make(listChangedLog, 100)
			client := mcp.NewClient(&mcp.Implementation{Name: "lc-test", Version: "0"}, log.options())
			var transport mcp.Transport
			switch tt.transport {
			case "in-memory":
				var err error
				if transport, err = s.InMemoryTransport(ctx); err != nil {
					t.Fatal(err)
				}
			case "http":
				hs, err := s.StartHTTPBothEras("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = hs.Close() })
				transport = &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}
			case "stateless":
				hs := httptest.NewServer(s.StatelessHTTPHandler())
				t.Cleanup(hs.Close)
				transport = &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}
			}
			cs, err := client.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: tt.version})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got := cs.InitializeResult().ProtocolVersion; got != tt.wantVersion {
				t.Fatalf("negotiated %s, want %s", got, tt.wantVersion)
			}
			modern := tt.wantVersion == chaosmcp.ProtocolModern
			if modern {
				// The go-sdk client's control listen is opened in the background.
				if err := s.Await(ctx, func(st chaosmcp.Stats) bool { return st.LiveListChangedListens == 1 }); err != nil {
					t.Fatal(err)
				}
			}

			s.DropListChanged(1)
			s.Set("demo://b", "b1", "text/plain") // its list_changed is dropped
			s.Set("demo://c", "c1", "text/plain")
			first := log.next(t)
			if modern && first == "" {
				t.Error("list_changed on a 2026-07-28 listen stream carries no subscription ID")
			}
			if !modern && first != "" {
				t.Errorf("legacy list_changed carries subscription ID %q", first)
			}
			s.SuppressListChanged(true)
			s.Set("demo://d", "d1", "text/plain")
			s.SuppressListChanged(false)
			s.Delete("demo://d")
			if id := log.next(t); id != first {
				t.Errorf("second list_changed has subscription ID %q, want %q (the same stream)", id, first)
			}
			st := s.Stats()
			got := map[string]int{"sent": st.ListChangedSent, "dropped": st.ListChangedDropped, "unread": len(log)}
			if diff := cmp.Diff(map[string]int{"sent": 2, "dropped": 2, "unread": 0}, got); diff != "" {
				t.Errorf("list_changed deliveries (-want +got):\n%s", diff)
			}
			if modern && st.ListensStarted == 0 {
				t.Error("ListensStarted = 0 for a 2026-07-28 client")
			}
			if !modern && st.ListensStarted != 0 {
				t.Errorf("ListensStarted = %d for a legacy client", st.ListensStarted)
			}
			// The listen stream ends with the session.
			if err := cs.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Await(ctx, func(st chaosmcp.Stats) bool { return st.LiveListens == 0 }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// stdioListChangedEnv set to "1" makes the stdio child add demo://c once a client can be told
// (a legacy session initialized, or a 2026-07-28 listen acknowledged with
// resourcesListChanged).
const stdioListChangedEnv = "CHAOSMCP_TEST_STDIO_LIST_CHANGED"

// TestStdioListChangedBothEras: over stdio, list_changed reaches a legacy client and a
// 2026-07-28 client (on its listen stream, with a subscription ID); the new resource is
// listed afterwards.
func TestStdioListChangedBothEras(t *testing.T) {
	for _, tt := range []struct{ version, want string }{
		{version: chaosmcp.ProtocolVersion, want: chaosmcp.ProtocolVersion},
		{version: "", want: chaosmcp.ProtocolModern},
	} {
		t.Run(tt.want, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), stdioChildEnv+"=1", stdioErasEnv+"=all", stdioListChangedEnv+"=1")
			cmd.Stderr = os.Stderr
			log := make(listChangedLog, 100)
			ctx := testCtx(t)
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-lc", Version: "0"}, log.options()).Connect(ctx,
				&mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: tt.version})
			if err != nil {
				t.Fatalf("connect to stdio child: %v", err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			if got := cs.InitializeResult().ProtocolVersion; got != tt.want {
				t.Fatalf("negotiated %s, want %s", got, tt.want)
			}
			id := log.next(t)
			if modern := tt.want == chaosmcp.ProtocolModern; modern != (id != "") {
				t.Errorf("subscription ID %q on a %s session", id, tt.want)
			}
			pages := listAll(t, cs, 10)
			if diff := cmp.Diff([]string{"demo://a", "demo://b", "demo://c"}, flatten(pages)); diff != "" {
				t.Errorf("listed after list_changed (-want +got):\n%s", diff)
			}
		})
	}
}
