package chaosmcp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

const stdioChildEnv = "CHAOSMCP_TEST_STDIO_CHILD"

// stdioErasEnv set to "all" makes the stdio child speak 2026-07-28 too.
const stdioErasEnv = "CHAOSMCP_TEST_STDIO_ERAS"

// runStdioChild serves a chaos server over stdin/stdout (the test binary re-executed by
// TestStdio). After the first subscribe it changes demo://a, so the parent can observe an
// updated notification from another process without any timing.
func runStdioChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := chaosmcp.Options{Name: "stdio-child", PageSize: 1}
	if os.Getenv(stdioErasEnv) == "all" {
		opts.ProtocolVersions = chaosmcp.AllProtocolVersions
	}
	s := chaosmcp.New(opts)
	defer s.Close()
	s.Set("demo://a", "a1", "text/plain")
	s.Set("demo://b", "b1", "text/plain")
	go func() {
		if s.Await(ctx, func(st chaosmcp.Stats) bool { return st.SubscribeCalls >= 1 }) == nil {
			s.Set("demo://a", "a2", "text/plain")
		}
	}()
	if os.Getenv(stdioListChangedEnv) == "1" {
		go func() {
			if s.Await(ctx, func(st chaosmcp.Stats) bool { return st.LiveSessions >= 1 || st.LiveListChangedListens >= 1 }) == nil {
				s.Set("demo://c", "c1", "text/plain")
			}
		}()
	}
	if err := s.ServeStdio(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "stdio child:", err)
		return 1
	}
	return 0
}

func TestStdio(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stdioChildEnv+"=1")
	cmd.Stderr = os.Stderr
	e, opts := newEvents()
	client := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "0"}, opts)
	ctx := testCtx(t)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
	if err != nil {
		t.Fatalf("connect to stdio child: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if got := cs.InitializeResult().ServerInfo.Name; got != "stdio-child" {
		t.Errorf("server name %q", got)
	}
	pages := listAll(t, cs, 10)
	if diff := cmp.Diff([]string{"demo://a", "demo://b"}, flatten(pages)); diff != "" || len(pages) != 2 {
		t.Errorf("listed %d pages (-want +got):\n%s", len(pages), diff)
	}
	if got := readText(t, cs, "demo://a"); got != "a1" {
		t.Errorf("read %q, want a1", got)
	}
	subscribe(t, cs, "demo://a")
	if got := e.nextUpdate(t); got != "demo://a" {
		t.Errorf("updated %q", got)
	}
	if got := readText(t, cs, "demo://a"); got != "a2" {
		t.Errorf("read after update %q, want a2", got)
	}

	// Killing the server process ends the client session.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cs.Wait() }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("client session did not end after the server process was killed")
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://a"}); err == nil {
		t.Errorf("read on a dead stdio session succeeded")
	}
}

func TestStreamableHTTP(t *testing.T) {
	s := newServer(t, chaosmcp.Options{PageSize: 1})
	s.Set("demo://a", "a1", "text/plain")
	s.Set("demo://b", "b1", "text/plain")
	hs := startHTTP(t, s)

	dial := func() (*mcp.ClientSession, *events) {
		e, opts := newEvents()
		client := mcp.NewClient(&mcp.Implementation{Name: "http-test", Version: "0"}, opts)
		cs, err := client.Connect(testCtx(t), &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: 1},
			&mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
		if err != nil {
			t.Fatalf("connect over HTTP: %v", err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs, e
	}
	cs, ev := dial()
	ctx := testCtx(t)
	if cs.ID() == "" {
		t.Errorf("no Mcp-Session-Id: the HTTP session is not stateful")
	}
	if diff := cmp.Diff([]string{"demo://a", "demo://b"}, flatten(listAll(t, cs, 10))); diff != "" {
		t.Errorf("listed (-want +got):\n%s", diff)
	}
	subscribe(t, cs, "demo://b")
	s.Set("demo://b", "b2", "text/plain")
	if got := ev.nextUpdate(t); got != "demo://b" {
		t.Errorf("updated %q", got)
	}
	if got := readText(t, cs, "demo://b"); got != "b2" {
		t.Errorf("read %q, want b2", got)
	}
	sessions := s.Sessions()
	if len(sessions) != 1 || sessions[0].ID != cs.ID() {
		t.Errorf("Sessions() = %+v, want the client's session %q", sessions, cs.ID())
	}

	// Restart: the old session ID is gone; a new connection gets a new session and epoch.
	if epoch := s.Restart(); epoch != 1 {
		t.Errorf("Restart() = %d, want 1", epoch)
	}
	_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://a"})
	if !errors.Is(err, mcp.ErrSessionMissing) && !errors.Is(err, mcp.ErrConnectionClosed) {
		t.Errorf("read on the old session after restart: %v, want ErrSessionMissing or ErrConnectionClosed", err)
	}
	cs2, _ := dial()
	if got := readText(t, cs2, "demo://a"); got != "a1" {
		t.Errorf("read on the new session %q", got)
	}
	sessions = s.Sessions()
	if len(sessions) != 1 || sessions[0].Seq != 2 || sessions[0].Epoch != 1 || sessions[0].ID == cs.ID() {
		t.Errorf("Sessions() after restart = %+v", sessions)
	}

	// Killing the endpoint ends its sessions.
	if err := hs.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Await(ctx, func(st chaosmcp.Stats) bool { return st.LiveSessions == 0 }); err != nil {
		t.Fatal(err)
	}
	if _, err := cs2.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://a"}); err == nil {
		t.Errorf("read succeeded after the HTTP server was closed")
	}
}

func TestHTTPHandler(t *testing.T) {
	// HTTPHandler can be mounted by the caller, here on an httptest loopback server.
	s := newServer(t, chaosmcp.Options{})
	s.Set("demo://a", "a", "text/plain")
	hts := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(hts.Close)
	srv := hts.URL
	client := mcp.NewClient(&mcp.Implementation{Name: "handler-test", Version: "0"}, nil)
	cs, err := client.Connect(testCtx(t), &mcp.StreamableClientTransport{Endpoint: srv, MaxRetries: 1},
		&mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if got := readText(t, cs, "demo://a"); got != "a" {
		t.Errorf("read %q", got)
	}
}
