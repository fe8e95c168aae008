package chaosmcp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

func TestBasicsInMemory(t *testing.T) {
	s := newServer(t, chaosmcp.Options{Name: "chaos-under-test", Version: "9.9.9", PageSize: 2})
	s.Set("demo://notes/1", "one", "text/plain")
	s.SetBlob("demo://bin/1", []byte{0, 1, 2, 255}, "application/octet-stream")
	s.SetTemplate(chaosmcp.Template{URITemplate: "demo://notes/{id}", Name: "note", MIMEType: "text/plain"})
	cs, ev := connect(t, s)
	ctx := testCtx(t)

	init := cs.InitializeResult()
	if init.ProtocolVersion != chaosmcp.ProtocolVersion {
		t.Errorf("protocol %q, want %q", init.ProtocolVersion, chaosmcp.ProtocolVersion)
	}
	if diff := cmp.Diff(&mcp.Implementation{Name: "chaos-under-test", Version: "9.9.9"}, init.ServerInfo); diff != "" {
		t.Errorf("server info (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&mcp.ResourceCapabilities{Subscribe: true, ListChanged: true}, init.Capabilities.Resources); diff != "" {
		t.Errorf("resource capabilities (-want +got):\n%s", diff)
	}
	if init.Capabilities.Experimental != nil {
		t.Errorf("experimental capabilities %v, want none", init.Capabilities.Experimental)
	}

	var listed []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatalf("Resources: %v", err)
		}
		listed = append(listed, r.URI+" "+r.Name+" "+r.MIMEType)
	}
	want := []string{"demo://bin/1 1 application/octet-stream", "demo://notes/1 1 text/plain"}
	if diff := cmp.Diff(want, listed); diff != "" {
		t.Errorf("listed resources (-want +got):\n%s", diff)
	}
	var templates []string
	for rt, err := range cs.ResourceTemplates(ctx, nil) {
		if err != nil {
			t.Fatalf("ResourceTemplates: %v", err)
		}
		templates = append(templates, rt.URITemplate)
	}
	if diff := cmp.Diff([]string{"demo://notes/{id}"}, templates); diff != "" {
		t.Errorf("templates (-want +got):\n%s", diff)
	}

	if got := readText(t, cs, "demo://notes/1"); got != "one" {
		t.Errorf("read text %q, want %q", got, "one")
	}
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://bin/1"})
	if err != nil {
		t.Fatalf("read blob: %v", err)
	}
	if diff := cmp.Diff([]byte{0, 1, 2, 255}, res.Contents[0].Blob); diff != "" || res.Contents[0].MIMEType != "application/octet-stream" {
		t.Errorf("blob (-want +got):\n%s mime %q", diff, res.Contents[0].MIMEType)
	}

	subscribe(t, cs, "demo://notes/1")
	if diff := cmp.Diff([]int{1}, s.Subscribers("demo://notes/1")); diff != "" {
		t.Errorf("subscribers (-want +got):\n%s", diff)
	}
	s.Set("demo://notes/1", "two", "text/plain")
	if got := ev.nextUpdate(t); got != "demo://notes/1" {
		t.Errorf("updated %q, want demo://notes/1", got)
	}
	if got := readText(t, cs, "demo://notes/1"); got != "two" {
		t.Errorf("read after update %q, want %q", got, "two")
	}

	// A new URI announces list_changed; deleting a subscribed one sends list_changed and updated.
	s.Set("demo://notes/2", "new", "text/plain")
	ev.nextListChanged(t)
	if !s.Delete("demo://notes/1") {
		t.Fatalf("Delete reported the resource missing")
	}
	ev.nextListChanged(t)
	if got := ev.nextUpdate(t); got != "demo://notes/1" {
		t.Errorf("updated after delete %q, want demo://notes/1", got)
	}
	_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://notes/1"})
	if je := rpcError(t, err); je.Code != chaosmcp.CodeResourceNotFound {
		t.Errorf("read deleted: code %d, want %d", je.Code, chaosmcp.CodeResourceNotFound)
	}

	if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "demo://notes/1"}); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	subscribe(t, cs, "demo://notes/2")
	s.Set("demo://notes/1", "back", "text/plain")
	s.Set("demo://notes/2", "sentinel", "text/plain")
	if diff := cmp.Diff([]string{"demo://notes/2"}, ev.updatesUntil(t, "demo://notes/2")); diff != "" {
		t.Errorf("updates after unsubscribe (-want +got):\n%s", diff)
	}

	st := s.Stats()
	checks := []struct {
		name      string
		got, want int
	}{
		{"SessionsStarted", st.SessionsStarted, 1},
		{"LiveSessions", st.LiveSessions, 1},
		{"SubscribeCalls", st.SubscribeCalls, 2},
		{"UnsubscribeCalls", st.UnsubscribeCalls, 1},
		{"UpdatesSent", st.UpdatesSent, 3},
		{"reads of notes/1", st.Reads["demo://notes/1"], 3},
		{"ListCalls", st.ListCalls, 1},
		{"TemplateListCalls", st.TemplateListCalls, 1},
		{"subscriptions on notes/2", st.Subscriptions["demo://notes/2"], 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("Stats.%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if st.ListChangedSent < 2 {
		t.Errorf("Stats.ListChangedSent = %d, want ≥ 2", st.ListChangedSent)
	}
	sessions := s.Sessions()
	if len(sessions) != 1 || sessions[0].Seq != 1 || sessions[0].Epoch != 0 || sessions[0].ProtocolVersion != chaosmcp.ProtocolVersion {
		t.Errorf("Sessions() = %+v", sessions)
	}
}

func TestResourceSetAPI(t *testing.T) {
	s := newServer(t, chaosmcp.Options{})
	s.PutMany(
		chaosmcp.Resource{URI: "demo://b", Text: "b"},
		chaosmcp.Resource{URI: "demo://a/x.txt", Name: "custom", Text: "a", MIMEType: "text/plain"},
		chaosmcp.Resource{URI: ""},
	)
	if diff := cmp.Diff([]string{"demo://a/x.txt", "demo://b"}, s.URIs()); diff != "" {
		t.Errorf("URIs (-want +got):\n%s", diff)
	}
	got, ok := s.Get("demo://a/x.txt")
	if diff := cmp.Diff(chaosmcp.Resource{URI: "demo://a/x.txt", Name: "custom", Text: "a", MIMEType: "text/plain"}, got); !ok || diff != "" {
		t.Errorf("Get (-want +got):\n%s", diff)
	}
	if got, _ := s.Get("demo://b"); got.Name != "b" {
		t.Errorf("default name %q, want %q", got.Name, "b")
	}
	if s.Delete("demo://missing") {
		t.Errorf("Delete of a missing URI reported true")
	}
	s.SetTemplate(chaosmcp.Template{URITemplate: "demo://t/{x}", Name: "t"})
	if !s.DeleteTemplate("demo://t/{x}") || s.DeleteTemplate("demo://t/{x}") {
		t.Errorf("DeleteTemplate results wrong")
	}
	if len(s.Templates()) != 0 {
		t.Errorf("Templates() = %v after delete", s.Templates())
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Await(ctx, func(st chaosmcp.Stats) bool { return st.SessionsStarted > 0 }); !errors.Is(err, context.Canceled) {
		t.Errorf("Await on a cancelled context = %v, want context.Canceled", err)
	}
}

func TestCapabilityKnobs(t *testing.T) {
	tests := []struct {
		name string
		caps chaosmcp.Capabilities
	}{
		{"everything", chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: true}},
		{"no subscribe", chaosmcp.Capabilities{ListChanged: true}},
		{"no listChanged", chaosmcp.Capabilities{Subscribe: true}},
		{"nothing", chaosmcp.Capabilities{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{})
			s.Set("demo://a", "a", "text/plain")
			s.SetCapabilities(tt.caps)
			s.SetServerInfo("renamed", "2.0.0")
			cs, ev := connect(t, s)
			ctx := testCtx(t)
			init := cs.InitializeResult()
			if diff := cmp.Diff(&mcp.ResourceCapabilities{Subscribe: tt.caps.Subscribe, ListChanged: tt.caps.ListChanged}, init.Capabilities.Resources); diff != "" {
				t.Errorf("resources capability (-want +got):\n%s", diff)
			}
			_, advertised := init.Capabilities.Experimental[chaosmcp.SnapshotCapability]
			if advertised != tt.caps.Snapshot {
				t.Errorf("snapshot capability advertised = %v, want %v", advertised, tt.caps.Snapshot)
			}
			if init.ServerInfo.Name != "renamed" || init.ServerInfo.Version != "2.0.0" {
				t.Errorf("server info %+v", init.ServerInfo)
			}

			err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://a"})
			if tt.caps.Subscribe {
				if err != nil {
					t.Fatalf("subscribe: %v", err)
				}
			} else if je := rpcError(t, err); je.Code != jsonrpc.CodeMethodNotFound {
				t.Errorf("subscribe without capability: code %d, want %d", je.Code, jsonrpc.CodeMethodNotFound)
			}

			// Add a resource (list_changed, if negotiated), then prove by a barrier that
			// nothing else arrived: a read round trip after the Set.
			s.Set("demo://b", "b", "text/plain")
			readText(t, cs, "demo://b")
			if tt.caps.ListChanged {
				ev.nextListChanged(t)
			} else if st := s.Stats(); st.ListChangedSent != 0 || ev.pendingListChanged() != 0 {
				t.Errorf("list_changed sent without the capability: stats %d, client %d", st.ListChangedSent, ev.pendingListChanged())
			}
		})
	}
}

func TestReadFaults(t *testing.T) {
	t.Run("not-found styles", func(t *testing.T) {
		tests := []struct {
			style    chaosmcp.NotFoundStyle
			wantCode int64
			wantMsg  string
			wantData string
		}{
			{chaosmcp.NotFoundMCP, -32002, "Resource not found", `{"uri":"demo://nope"}`},
			{chaosmcp.NotFoundInvalidParams, -32602, "Resource not found", `{"uri":"demo://nope"}`},
			{chaosmcp.NotFoundMessage, -32602, "Resource demo://nope not found", ""},
		}
		s := newServer(t, chaosmcp.Options{})
		cs, _ := connect(t, s)
		for _, tt := range tests {
			s.SetNotFoundStyle(tt.style)
			_, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: "demo://nope"})
			je := rpcError(t, err)
			if je.Code != tt.wantCode || je.Message != tt.wantMsg || string(je.Data) != tt.wantData {
				t.Errorf("style %d: got code %d message %q data %s", tt.style, je.Code, je.Message, je.Data)
			}
		}
	})

	t.Run("nth and every nth read fail", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{})
		s.Set("demo://a", "a", "text/plain")
		s.Set("demo://b", "b", "text/plain")
		s.SetNotFoundStyle(chaosmcp.NotFoundInvalidParams)
		s.AddReadFault(chaosmcp.ReadFault{URI: "demo://a", Nth: 2, Fail: chaosmcp.ReadNotFound})
		s.AddReadFault(chaosmcp.ReadFault{URI: "demo://b", Nth: 1, Fail: chaosmcp.ReadTransient})
		s.AddReadFault(chaosmcp.ReadFault{URI: "demo://c", Every: 2, Fail: chaosmcp.ReadTransient})
		s.Set("demo://c", "c", "text/plain")
		cs, _ := connect(t, s)
		ctx := testCtx(t)
		var got []string
		for _, u := range []string{"demo://a", "demo://b", "demo://a", "demo://b", "demo://a", "demo://c", "demo://c", "demo://c", "demo://c"} {
			res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: u})
			if err != nil {
				je := rpcError(t, err)
				got = append(got, u+" error "+je.Message)
				continue
			}
			got = append(got, u+" "+res.Contents[0].Text)
		}
		want := []string{
			"demo://a a",
			"demo://b error " + chaosmcp.TransientMessage,
			"demo://a error Resource not found",
			"demo://b b",
			"demo://a a",
			"demo://c c",
			"demo://c error " + chaosmcp.TransientMessage,
			"demo://c c",
			"demo://c error " + chaosmcp.TransientMessage,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("reads (-want +got):\n%s", diff)
		}
	})

	t.Run("removed fault no longer applies", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{})
		s.Set("demo://a", "a", "text/plain")
		remove := s.AddReadFault(chaosmcp.ReadFault{Fail: chaosmcp.ReadTransient})
		cs, _ := connect(t, s)
		if _, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: "demo://a"}); rpcError(t, err).Code != jsonrpc.CodeInternalError {
			t.Errorf("fault did not apply")
		}
		remove()
		if got := readText(t, cs, "demo://a"); got != "a" {
			t.Errorf("read after remove = %q", got)
		}
	})

	// Read A is held at a gate with the content current at its arrival; read B overtakes it
	// with newer content; releasing the gate delivers A's stale content last.
	for _, fresh := range []bool{false, true} {
		name := map[bool]string{false: "read A slower than read B", true: "fresh content after the gate"}[fresh]
		t.Run(name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{})
			s.Set("demo://doc", "v1", "text/plain")
			gate := chaosmcp.NewGate()
			s.AddReadFault(chaosmcp.ReadFault{URI: "demo://doc", Nth: 1, Gate: gate, Fresh: fresh})
			cs, _ := connect(t, s)
			ctx := testCtx(t)
			type result struct {
				text string
				err  error
			}
			a := make(chan result, 1)
			go func() {
				res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://doc"})
				if err != nil {
					a <- result{err: err}
					return
				}
				a <- result{text: res.Contents[0].Text}
			}()
			<-gate.Arrived()
			s.Set("demo://doc", "v2", "text/plain")
			if got := readText(t, cs, "demo://doc"); got != "v2" {
				t.Fatalf("read B = %q, want v2", got)
			}
			select {
			case r := <-a:
				t.Fatalf("read A answered before the gate opened: %+v", r)
			default:
			}
			gate.Release()
			r := <-a
			want := map[bool]string{false: "v1", true: "v2"}[fresh]
			if r.err != nil || r.text != want {
				t.Errorf("read A = %q, %v; want %q", r.text, r.err, want)
			}
		})
	}

	t.Run("delayed read outlasts the client deadline", func(t *testing.T) {
		s := newServer(t, chaosmcp.Options{})
		s.Set("demo://slow", "x", "text/plain")
		s.AddReadFault(chaosmcp.ReadFault{URI: "demo://slow", Delay: 10 * wait})
		cs, _ := connect(t, s)
		ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
		defer cancel()
		_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://slow"})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("delayed read: %v, want context.DeadlineExceeded", err)
		}
		s.Set("demo://fast", "f", "text/plain")
		if got := readText(t, cs, "demo://fast"); got != "f" {
			t.Errorf("read of another resource = %q, want f", got)
		}
	})
}

func TestProtocolVersions(t *testing.T) {
	tests := []struct {
		name     string
		versions []string
		pin      string
		want     string
	}{
		{"unpinned client falls back to the legacy protocol", nil, "", mcpsync.ProtocolVersion20251125},
		{"pinned", nil, mcpsync.ProtocolVersion20251125, mcpsync.ProtocolVersion20251125},
		{"older pinned", nil, mcpsync.ProtocolVersion20250618, mcpsync.ProtocolVersion20250618},
		{"server restricted", []string{mcpsync.ProtocolVersion20250618}, mcpsync.ProtocolVersion20251125, mcpsync.ProtocolVersion20250618},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, chaosmcp.Options{ProtocolVersions: tt.versions})
			st, ct := mcp.NewInMemoryTransports()
			ctx := testCtx(t)
			if _, err := s.MCPServer().Connect(ctx, st, nil); err != nil {
				t.Fatal(err)
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "v", Version: "0"}, nil).Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: tt.pin})
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != tt.want {
				t.Errorf("negotiated %q, want %q", got, tt.want)
			}
			if sessions := s.Sessions(); len(sessions) != 1 || sessions[0].ProtocolVersion != tt.want {
				t.Errorf("Sessions() = %+v", sessions)
			}
		})
	}
}
