package main_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// binary is the mcpsync-demo-server built once for all tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "demoserver-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "mcpsync-demo-server")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const wait = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

// syncBuffer collects a child's stderr for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// client is a session to a demo server process plus the notifications it received.
type client struct {
	cs      *mcp.ClientSession
	updated chan string
}

func clientOptions(c *client) *mcp.ClientOptions {
	c.updated = make(chan string, 1000)
	return &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
		c.updated <- req.Params.URI
	}}
}

func (c *client) nextUpdate(t *testing.T) string {
	t.Helper()
	select {
	case u := <-c.updated:
		return u
	case <-time.After(wait):
		t.Fatalf("no updated notification within %v", wait)
		return ""
	}
}

// startStdio runs the demo server with args over stdio and connects to it.
func startStdio(t *testing.T, args ...string) *client {
	t.Helper()
	cmd := exec.Command(binary, args...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c := &client{}
	cl := mcp.NewClient(&mcp.Implementation{Name: "demo-test", Version: "0"}, clientOptions(c))
	cs, err := cl.Connect(testCtx(t), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
	if err != nil {
		t.Fatalf("connect: %v\nstderr:\n%s", err, stderr)
	}
	c.cs = cs
	t.Cleanup(func() {
		_ = cs.Close()
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	return c
}

func listAll(t *testing.T, cs *mcp.ClientSession) (uris []string, sizes []int, snapshotIDs []any) {
	t.Helper()
	cursor := ""
	for range 100 {
		res, err := cs.ListResources(testCtx(t), &mcp.ListResourcesParams{Cursor: cursor})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		for _, r := range res.Resources {
			uris = append(uris, r.URI)
		}
		sizes = append(sizes, len(res.Resources))
		snapshotIDs = append(snapshotIDs, res.Meta[chaosmcp.SnapshotMetaKey])
		if res.NextCursor == "" {
			return uris, sizes, snapshotIDs
		}
		cursor = res.NextCursor
	}
	t.Fatalf("more than 100 pages")
	return nil, nil, nil
}

func readText(t *testing.T, cs *mcp.ClientSession, uri string) (string, error) {
	t.Helper()
	res, err := cs.ReadResource(testCtx(t), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return "", err
	}
	return res.Contents[0].Text, nil
}

func TestStdioDemo(t *testing.T) {
	c := startStdio(t, "--interval", "20ms", "--resources", "5", "--page-size", "3", "--seed", "7")
	ctx := testCtx(t)
	init := c.cs.InitializeResult()
	if init.ServerInfo.Name != "mcpsync-demo-server" || !init.Capabilities.Resources.Subscribe || !init.Capabilities.Resources.ListChanged {
		t.Errorf("initialize result: %+v %+v", init.ServerInfo, init.Capabilities.Resources)
	}
	uris, sizes, _ := listAll(t, c.cs)
	want := []string{"demo://clock/now", "demo://items/0001", "demo://items/0002", "demo://items/0003", "demo://items/0004", "demo://items/0005", "demo://notes/1", "demo://notes/2"}
	if diff := cmp.Diff(want, uris); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{3, 3, 2}, sizes); diff != "" {
		t.Errorf("page sizes (-want +got):\n%s", diff)
	}
	var templates []string
	for rt, err := range c.cs.ResourceTemplates(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		templates = append(templates, rt.URITemplate)
	}
	if diff := cmp.Diff([]string{"demo://items/{n}", "demo://notes/{id}"}, templates); diff != "" {
		t.Errorf("templates (-want +got):\n%s", diff)
	}
	clock, err := readText(t, c.cs, "demo://clock/now")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(clock)); err != nil {
		t.Errorf("clock text %q: %v", clock, err)
	}

	before, err := readText(t, c.cs, "demo://notes/1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://notes/1"}); err != nil {
		t.Fatal(err)
	}
	if got := c.nextUpdate(t); got != "demo://notes/1" {
		t.Errorf("updated %q", got)
	}
	after, err := readText(t, c.cs, "demo://notes/1")
	if err != nil {
		t.Fatal(err)
	}
	if before == after || !strings.HasPrefix(after, "note 1, revision ") {
		t.Errorf("note did not change: before %q after %q", before, after)
	}
}

func TestHTTPDemo(t *testing.T) {
	cmd := exec.Command(binary, "--http", "127.0.0.1:0", "--interval", "20ms")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	urls := make(chan string, 1)
	var logs syncBuffer
	go func() {
		re := regexp.MustCompile(`msg=listening url=(\S+)`)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			fmt.Fprintln(&logs, sc.Text())
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("server stderr:\n%s", logs.String())
		}
	})
	var url string
	select {
	case url = <-urls:
	case err := <-exited:
		t.Fatalf("server exited before listening: %v\n%s", err, logs.String())
	case <-time.After(wait):
		t.Fatalf("no listening line within %v", wait)
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("url %q is not on loopback", url)
	}

	c := &client{}
	cl := mcp.NewClient(&mcp.Implementation{Name: "demo-http-test", Version: "0"}, clientOptions(c))
	cs, err := cl.Connect(testCtx(t), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: 1}, &mcp.ClientSessionOptions{ProtocolVersion: chaosmcp.ProtocolVersion})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	uris, _, _ := listAll(t, cs)
	if diff := cmp.Diff([]string{"demo://clock/now", "demo://notes/1", "demo://notes/2"}, uris); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	if err := cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: "demo://clock/now"}); err != nil {
		t.Fatal(err)
	}
	if got := c.nextUpdate(t); got != "demo://clock/now" {
		t.Errorf("updated %q", got)
	}
	_ = cs.Close()

	// SIGTERM stops the server cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(wait):
		t.Fatalf("server did not exit after SIGTERM")
	}
}

func TestChaosFlags(t *testing.T) {
	t.Run("capabilities, forged snapshots, not-found style", func(t *testing.T) {
		c := startStdio(t, "--no-subscribe", "--no-list-changed", "--advertise-snapshot", "--snapshot", "forged",
			"--page-size", "2", "--not-found-style", "message", "--name", "chaos", "--version", "1.2.3")
		init := c.cs.InitializeResult()
		if diff := cmp.Diff(&mcp.ResourceCapabilities{}, init.Capabilities.Resources); diff != "" {
			t.Errorf("resources capability (-want +got):\n%s", diff)
		}
		if _, ok := init.Capabilities.Experimental[chaosmcp.SnapshotCapability]; !ok {
			t.Errorf("snapshot capability not advertised: %v", init.Capabilities.Experimental)
		}
		if init.ServerInfo.Name != "chaos" || init.ServerInfo.Version != "1.2.3" {
			t.Errorf("server info %+v", init.ServerInfo)
		}
		err := c.cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: "demo://notes/1"})
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != jsonrpc.CodeMethodNotFound {
			t.Errorf("subscribe without capability: %v", err)
		}
		_, sizes, ids := listAll(t, c.cs)
		if len(sizes) != 2 || ids[0] == nil || ids[0] != ids[1] {
			t.Errorf("pages %v with snapshot IDs %v, want 2 pages with one ID", sizes, ids)
		}
		_, err = readText(t, c.cs, "demo://nope")
		if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams || je.Message != "Resource demo://nope not found" {
			t.Errorf("unknown resource: %v", err)
		}
	})

	t.Run("page sizes and circular cursor", func(t *testing.T) {
		c := startStdio(t, "--resources", "4", "--page-sizes", "1,2")
		_, sizes, _ := listAll(t, c.cs)
		if diff := cmp.Diff([]int{1, 2, 2, 2}, sizes); diff != "" {
			t.Errorf("page sizes (-want +got):\n%s", diff)
		}
		c2 := startStdio(t, "--resources", "4", "--page-size", "1", "--circular-cursor", "2:1")
		var next []string
		cursor := ""
		for range 3 {
			res, err := c2.cs.ListResources(testCtx(t), &mcp.ListResourcesParams{Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			next = append(next, res.NextCursor)
			cursor = res.NextCursor
		}
		if next[2] != next[0] {
			t.Errorf("page 2 did not cycle back: %q vs %q", next[2], next[0])
		}
	})

	t.Run("rewritten notification URIs", func(t *testing.T) {
		c := startStdio(t, "--interval", "20ms", "--rewrite", "upper-scheme-host")
		if err := c.cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: "demo://notes/1"}); err != nil {
			t.Fatal(err)
		}
		if got := c.nextUpdate(t); got != "DEMO://NOTES/1" {
			t.Errorf("updated %q, want DEMO://NOTES/1", got)
		}
	})

	t.Run("transient read errors", func(t *testing.T) {
		c := startStdio(t, "--transient-every", "2")
		var got []string
		for range 4 {
			_, err := readText(t, c.cs, "demo://notes/2")
			var je *jsonrpc.Error
			switch {
			case err == nil:
				got = append(got, "ok")
			case errors.As(err, &je):
				got = append(got, fmt.Sprint(je.Code))
			default:
				t.Fatal(err)
			}
		}
		if diff := cmp.Diff([]string{"ok", "-32603", "ok", "-32603"}, got); diff != "" {
			t.Errorf("reads (-want +got):\n%s", diff)
		}
	})

	t.Run("slow reads and lost unsubscribe answers", func(t *testing.T) {
		c := startStdio(t, "--read-delay", "1h", "--unsubscribe", "hang")
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel()
		if _, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://notes/1"}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("delayed read: %v", err)
		}
		if err := c.cs.Subscribe(testCtx(t), &mcp.SubscribeParams{URI: "demo://notes/1"}); err != nil {
			t.Fatal(err)
		}
		ctx2, cancel2 := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel2()
		if err := c.cs.Unsubscribe(ctx2, &mcp.UnsubscribeParams{URI: "demo://notes/1"}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("unsubscribe: %v, want no answer", err)
		}
	})
}

func TestBadFlags(t *testing.T) {
	tests := [][]string{
		{"--snapshot", "bogus"},
		{"--interval", "0s"},
		{"--page-size", "0"},
		{"--drop-rate", "2"},
		{"--circular-cursor", "1:2"},
		{"--page-sizes", "1,x"},
		{"--rewrite", "rot13"},
		{"--not-found-style", "teapot"},
		{"--unsubscribe", "maybe"},
		{"--log-level", "loud"},
		{"--eras", "modern"},
		{"--no-such-flag"},
		{"extra-argument"},
		{"--control-file", "url.txt"},
		{"--control", "0.0.0.0:0"},
		{"--control", "10.1.2.3:80"},
		{"--control", "no-port"},
	}
	for _, args := range tests {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cmd := exec.Command(binary, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2", err)
			}
			if !strings.Contains(stderr.String(), "mcpsync-demo-server: ") {
				t.Errorf("stderr %q lacks a clear message", stderr.String())
			}
		})
	}
}

// TestControl changes a resource through the --control endpoint: the subscribed session is
// notified and reads the new text; malformed requests are refused and change nothing.
func TestControl(t *testing.T) {
	file := filepath.Join(t.TempDir(), "control.url")
	c := startStdio(t, "--interval", "1h", "--resources", "3", "--control", "127.0.0.1:0", "--control-file", file)
	ctx := testCtx(t)
	var endpoint string
	for deadline := time.Now().Add(wait); endpoint == ""; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(file); err == nil {
			endpoint = strings.TrimSpace(string(b))
		} else if time.Now().After(deadline) {
			t.Fatalf("no control URL in %s: %v", file, err)
		}
	}
	if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://items/0002"}); err != nil {
		t.Fatal(err)
	}
	before, err := readText(t, c.cs, "demo://items/0002")
	if err != nil {
		t.Fatal(err)
	}
	post := func(form url.Values) int {
		t.Helper()
		resp, err := http.PostForm(endpoint+"/resources", form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, bad := range []url.Values{{"uri": {"demo://items/0002"}}, {"text": {"x"}}} {
		if code := post(bad); code != http.StatusBadRequest {
			t.Errorf("POST %v: status %d, want 400", bad, code)
		}
	}
	if resp, err := http.Get(endpoint + "/resources"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", resp.StatusCode)
	}
	if got, _ := readText(t, c.cs, "demo://items/0002"); got != before {
		t.Fatalf("refused requests changed the resource: %q, was %q", got, before)
	}
	if code := post(url.Values{"uri": {"demo://items/0002"}, "text": {"changed by the test"}}); code != http.StatusNoContent {
		t.Fatalf("POST: status %d, want 204", code)
	}
	if u := c.nextUpdate(t); u != "demo://items/0002" {
		t.Errorf("updated %q, want demo://items/0002", u)
	}
	if got, err := readText(t, c.cs, "demo://items/0002"); err != nil || got != "changed by the test" {
		t.Errorf("read after the change: %q, %v", got, err)
	}
}
