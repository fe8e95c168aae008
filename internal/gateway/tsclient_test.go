package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

// tsClientDir holds the TypeScript SDK client script and its npm packages (scripts/deps.sh
// installs them with npm ci).
const tsClientDir = "../../testdata/gatewayclient"

// tsClient starts the TypeScript SDK client (node client.mjs ARGS) with token in
// MCPSYNC_GATEWAY_TOKEN; it skips the test only if node is absent and fails it if the SDK is
// not installed.
func tsClient(t *testing.T, ctx context.Context, token string, args ...string) *tsRun {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the TypeScript SDK client test needs Node.js (scripts/deps.sh installs it)")
	}
	dir, err := filepath.Abs(tsClientDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatalf("@modelcontextprotocol/sdk is not installed in %s (%v): run scripts/deps.sh (or make deps), which runs npm ci there", dir, err)
	}
	cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join(dir, "client.mjs")}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MCPSYNC_GATEWAY_TOKEN="+token)
	r := &tsRun{t: t, cmd: cmd, lines: make(chan string, 64)}
	cmd.Stderr = &r.stderr
	if r.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.stdin.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	go func() {
		defer close(r.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
	}()
	return r
}

// tsRun is a running TypeScript client: its stdout lines (one JSON step each) and stderr.
type tsRun struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
}

// tsStep is one line the client prints (the union of every step's fields).
type tsStep struct {
	Step            string         `json:"step"`
	Message         string         `json:"message"`
	Status          *int           `json:"status"`
	ProtocolVersion string         `json:"protocolVersion"`
	Resources       []tsResource   `json:"resources"`
	URI             string         `json:"uri"`
	Text            *string        `json:"text"`
	MIMEType        string         `json:"mimeType"`
	Meta            map[string]any `json:"meta"`
	Digest          string         `json:"digest"`
	DigestOK        bool           `json:"digestOK"`
	Code            *int64         `json:"code"`
	Data            map[string]any `json:"data"`
	Updates         int            `json:"updates"`
	OK              bool           `json:"ok"`
}

type tsResource struct {
	URI  string                    `json:"uri"`
	Meta map[string]map[string]any `json:"meta"`
}

// next returns the client's next step, which must be want; a fatal step, an early exit or
// no line within a minute (a bound for a hung client, not a speed requirement) fails the test.
func (r *tsRun) next(want string) tsStep {
	r.t.Helper()
	select {
	case line, ok := <-r.lines:
		if !ok {
			r.t.Fatalf("TypeScript client exited before step %q; stderr:\n%s", want, r.stderr.String())
		}
		var s tsStep
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			r.t.Fatalf("TypeScript client printed %q: %v", line, err)
		}
		if s.Step != want {
			r.t.Fatalf("TypeScript client: step %q (%s), want %q; stderr:\n%s", s.Step, line, want, r.stderr.String())
		}
		return s
	case <-time.After(2 * time.Minute):
		r.t.Fatalf("TypeScript client: no step %q within 2m; stderr:\n%s", want, r.stderr.String())
	}
	return tsStep{}
}

// command writes a command line to the client and returns its answer, which must be step want.
func (r *tsRun) command(line, want string) tsStep {
	r.t.Helper()
	if _, err := io.WriteString(r.stdin, line+"\n"); err != nil {
		r.t.Fatalf("TypeScript client: write %q: %v", line, err)
	}
	return r.next(want)
}

// wait waits for the client to exit and fails the test unless it exited 0.
func (r *tsRun) wait() {
	r.t.Helper()
	for range r.lines {
	}
	if err := r.cmd.Wait(); err != nil {
		r.t.Errorf("TypeScript client: %v; stderr:\n%s", err, r.stderr.String())
	}
}

// The TypeScript SDK client (@modelcontextprotocol/sdk on node, MCP 2025-11-25, bearer token
// in requestInit headers) against the real gateway (issue 15 item 5): it lists alice's
// resources (bob's source invisible), reads one with its version meta (digest = SHA-256 of
// the bytes), is refused bob's resource, subscribes, gets one notifications/resources/updated
// after the upstream changed and the new version was accepted, and reads the new bytes; after
// `mcpsync revoke` its read is an MCP error (reason revoked), after `mcpsync token revoke`
// HTTP 401; a client without a token gets 401.
func TestTypeScriptClient(t *testing.T) {
	s := newGWStack(t)
	const notes1, notes2 = "demo://notes/1", "demo://notes/2"
	s.Put(notes1, "version one\n")
	s.Put(notes2, "bob's text\n")
	s.MustCLI("source", "add", "private", "--url", s.UpstreamURL)
	s.Grant("alice", testSource)
	s.Grant("bob", "private")
	s.Subscribe("alice", testSource, notes1, "version one\n")
	s.Subscribe("bob", "private", notes2, "bob's text\n")
	aliceTok := s.Token("alice")
	gwURI, bobURI := GatewayURI(testSource, notes1), GatewayURI("private", notes2)

	ctx, cancel := context.WithTimeout(s.Ctx, 5*time.Minute)
	defer cancel()
	c := tsClient(t, ctx, aliceTok, "flow", s.URL, gwURI, bobURI)

	if got := c.next("connected"); got.ProtocolVersion != "2025-11-25" {
		t.Errorf("TypeScript client negotiated %q, want 2025-11-25", got.ProtocolVersion)
	}

	list := c.next("list")
	var listed []string
	var upstream map[string]any
	for _, r := range list.Resources {
		listed = append(listed, r.URI)
		if r.URI == gwURI {
			upstream = r.Meta[gateway.MetaUpstream]
		}
		if strings.HasPrefix(r.URI, "mcpsync://private/") {
			t.Errorf("alice's list shows bob's resource %s", r.URI)
		}
	}
	if d := cmp.Diff(map[string]any{"source": testSource, "uri": notes1}, upstream); d != "" {
		t.Errorf("list entry of %s (listed: %v): %s meta (-want +got):\n%s", gwURI, listed, gateway.MetaUpstream, d)
	}

	first := c.next("read")
	checkTSRead(t, first, gwURI, "version one\n")

	forbidden := c.next("forbidden")
	if forbidden.Code == nil || *forbidden.Code != -32602 || forbidden.Data["reason"] != gateway.ReasonNoGrant {
		t.Errorf("alice reading bob's %s: code %v data %v (%q); want -32602, reason %s", bobURI, forbidden.Code, forbidden.Data, forbidden.Message, gateway.ReasonNoGrant)
	}

	c.next("subscribed")
	s.Put(notes1, "version two\n")
	if got := c.next("updated"); got.URI != gwURI {
		t.Errorf("updated %q, want %q", got.URI, gwURI)
	}
	second := c.next("reread")
	checkTSRead(t, second, gwURI, "version two\n")
	if o1, o2 := first.Meta["readOrdinal"].(float64), second.Meta["readOrdinal"].(float64); o2 <= o1 {
		t.Errorf("read ordinal %v after the update, %v before", o2, o1)
	}
	// Another read on command works; once alice's grant is revoked her read is an MCP error
	// saying so; once her token is revoked, HTTP 401.
	if got := c.command("read", "attempt"); !got.OK || got.Text == nil || *got.Text != "version two\n" {
		t.Errorf("read on command: %+v", got)
	}
	s.MustCLI("revoke", "alice", testSource)
	if got := c.command("read", "attempt"); got.OK || got.Code == nil || *got.Code != -32602 || got.Data["reason"] != gateway.ReasonRevoked {
		t.Errorf("read after the grant was revoked: ok %v code %v data %v (%q); want -32602, reason %s", got.OK, got.Code, got.Data, got.Message, gateway.ReasonRevoked)
	}
	tokens, err := s.Store.Tokens(ctx)
	if err != nil || len(tokens) != 1 {
		t.Fatalf("tokens: %v %v", tokens, err)
	}
	s.MustCLI("token", "revoke", tokens[0].ID)
	if got := c.command("read", "attempt"); got.OK || got.Status == nil || *got.Status != http.StatusUnauthorized {
		t.Errorf("read after the token was revoked: ok %v status %v (%q); want HTTP 401", got.OK, got.Status, got.Message)
	}
	if _, err := io.WriteString(c.stdin, "done\n"); err != nil {
		t.Fatal(err)
	}
	if done := c.next("done"); done.Updates != 1 {
		t.Errorf("the client got %d notifications/resources/updated for one accepted change, want 1", done.Updates)
	}
	c.wait()

	// Without a token: 401 for the TypeScript client, and the challenge for plain HTTP.
	noauth := tsClient(t, ctx, "", "noauth", s.URL)
	if got := noauth.next("error"); got.Status == nil || *got.Status != http.StatusUnauthorized {
		t.Errorf("TypeScript client without a token: status %v (%q), want 401", got.Status, got.Message)
	}
	noauth.wait()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
		t.Errorf("POST without a token: %d, WWW-Authenticate %q; want 401 Bearer", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

// checkTSRead checks a read step: the bytes, and the version meta whose digest is the SHA-256
// of those bytes (computed by the client and here).
func checkTSRead(t *testing.T, got tsStep, uri, body string) {
	t.Helper()
	if got.URI != uri || got.Text == nil || *got.Text != body {
		t.Errorf("%s of %s: uri %q text %v, want %q", got.Step, uri, got.URI, got.Text, body)
	}
	if got.Meta == nil {
		t.Fatalf("%s of %s: no _meta[%q]", got.Step, uri, gateway.MetaVersion)
	}
	if !got.DigestOK || got.Digest != sha(body) || got.Meta["digest"] != sha(body) {
		t.Errorf("%s of %s: meta digest %v, client's SHA-256 %s (ok %v), want %s", got.Step, uri, got.Meta["digest"], got.Digest, got.DigestOK, sha(body))
	}
	if got.Meta["schema"] != "resourceVersion.v1" || got.Meta["source"] != testSource {
		t.Errorf("%s of %s: meta %v", got.Step, uri, got.Meta)
	}
}
