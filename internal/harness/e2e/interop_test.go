package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// interopPackage is the third-party server the interop tests run, pinned in
// testdata/interop/package.json and installed by scripts/deps.sh (npm ci).
const interopPackage = "@modelcontextprotocol/server-everything"

// everything returns the absolute path of server-everything's entry point and its docs
// directory. Missing packages fail the test with the command that installs them.
func everything(t *testing.T) (bin, docs string) {
	t.Helper()
	root, err := filepath.Abs("../../../testdata/interop")
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(root, "node_modules", ".bin", "mcp-server-everything")
	docs = filepath.Join(root, "node_modules", interopPackage, "dist", "docs")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("interop server %s is not installed (%v): run scripts/deps.sh (or make deps), which runs npm ci in testdata/interop", interopPackage, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed (%v): run scripts/deps.sh (or make deps)", err)
	}
	return bin, docs
}

// Interop with a server nobody here wrote: @modelcontextprotocol/server-everything over
// stdio. mcpsync connects with a capability receipt, lists its static documents, subscribes
// to two of them and accepts their exact bytes, receives the updates the server sends once
// its toggle-subscriber-updates tool is called (reads with reason notification), unsubscribes
// one (the server honours it: no further notification for it), and after the server process
// is killed reconnects under a new generation on which the other subscription re-subscribes
// (read reason session_change) and again receives updates.
func TestInteropServerEverythingOverStdio(t *testing.T) {
	bin, docs := everything(t)
	s := newStack(t)
	s.mustCLI("source", "add", "everything", "--stdio", "node "+bin+" stdio", "--backstop", "1h")
	src := s.source("everything")
	w := s.worker()
	c := s.liveSession(w, src.ID, 0)
	caps := c.Caps()
	if caps.ProtocolVersion != mcphost.ProtocolVersion || !caps.Resources || !caps.Subscribe || !caps.ListChanged ||
		caps.ServerName != "mcp-servers/everything" || caps.ServerVersion == "" {
		t.Errorf("capability receipt: %+v", caps)
	}
	if stored, err := s.st.CurrentSession(s.ctx, src.ID); err != nil || stored.Generation != c.Generation() || stored.Caps.ServerName != caps.ServerName {
		t.Errorf("stored session %+v, %v", stored, err)
	}

	// List: every file of the package's docs directory is a static document resource.
	entries, err := os.ReadDir(docs)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	for r, err := range c.Session().Resources(ctx, nil) {
		if err != nil {
			t.Fatalf("resources/list: %v", err)
		}
		listed[r.URI] = true
	}
	var docURIs []string
	for _, e := range entries {
		u := "demo://resource/static/document/" + e.Name()
		docURIs = append(docURIs, u)
		if !listed[u] {
			t.Errorf("%s not listed (listed: %v)", u, listed)
		}
	}
	if len(docURIs) < 2 {
		t.Fatalf("want at least two static documents, have %v", docURIs)
	}

	kept, dropped := docURIs[0], docURIs[1]
	subs := map[string]ledger.Subscription{}
	for _, u := range []string{kept, dropped} {
		s.mustCLI("subscribe", "everything", u)
		want, err := os.ReadFile(filepath.Join(docs, strings.TrimPrefix(u, "demo://resource/static/document/")))
		if err != nil {
			t.Fatal(err)
		}
		subs[u] = s.waitDigest("everything", u, ledger.Digest(want))
		if got := s.mustCLI("get", "everything", u); got != string(want) {
			t.Errorf("get %s: %d bytes differ from the %d bytes of the file", u, len(got), len(want))
		}
	}

	// Updates: one at once for each subscribed URI, then every 5 s.
	toggle(t, s, c)
	// Reads caused by notifications on session generation gen or a later one: a reconnect in
	// between (the host re-opens a session that died) must not hide that updates go on.
	notificationReads := func(subID, gen int64) int {
		n := 0
		for _, d := range s.dispatches(subID) {
			if d.Reason == string(mcpsync.ReasonNotification) && d.SessionGeneration >= gen {
				n++
			}
		}
		return n
	}
	eventually(t, 30*time.Second, "reads caused by notifications", func() (bool, string) {
		k, d := notificationReads(subs[kept].ID, c.Generation()), notificationReads(subs[dropped].ID, c.Generation())
		return k >= 2 && d >= 1, fmt.Sprintf("%d and %d notification reads", k, d)
	})
	for _, u := range []string{kept, dropped} {
		sub := s.sub("everything", u)
		if sub.LastNotificationGen != c.Generation() || sub.LastNotificationSeq == 0 {
			t.Errorf("%s: last notification %d/%d", u, sub.LastNotificationGen, sub.LastNotificationSeq)
		}
		// The content did not change: revalidated, no new version.
		if vs, err := s.st.Versions(s.ctx, sub.ID); err != nil || len(vs) != 1 {
			t.Errorf("%s: versions %+v, %v", u, vs, err)
		}
	}

	out := s.mustCLI("unsubscribe", "everything", dropped)
	if !strings.Contains(out, string(mcpsync.StateClosed)) {
		t.Fatalf("unsubscribe: %s", out)
	}
	closedReads := len(s.dispatches(subs[dropped].ID))
	// Two more update rounds for the kept subscription; none reaches the dropped one.
	base := notificationReads(subs[kept].ID, c.Generation())
	eventually(t, 30*time.Second, "updates continue for the kept subscription", func() (bool, string) {
		n := notificationReads(subs[kept].ID, c.Generation())
		return n >= base+2, fmt.Sprintf("%d notification reads", n)
	})
	if n := len(s.dispatches(subs[dropped].ID)); n != closedReads {
		t.Errorf("closed subscription read %d times after close", n-closedReads)
	}
	if n, err := s.st.AuditCount(s.ctx, src.ID, mcpsync.ReceiptNotificationClosed); err != nil || n != 0 {
		t.Errorf("server kept notifying the unsubscribed URI: %d after-close audits, %v", n, err)
	}

	// Kill the server process: a new generation, on which the kept subscription re-subscribes.
	kill(t, childPID(t, bin))
	c2 := s.liveSession(w, src.ID, c.Generation())
	if c2.Generation() != c.Generation()+1 {
		t.Errorf("generation %d after %d", c2.Generation(), c.Generation())
	}
	eventually(t, 30*time.Second, "re-subscribed on the new session", func() (bool, string) {
		sub := s.sub("everything", kept)
		ds := s.dispatches(sub.ID)
		last := ds[len(ds)-1]
		return sub.State == mcpsync.StateActive && sub.SessionGeneration == c2.Generation() &&
				last.SessionGeneration == c2.Generation() && last.Reason == string(mcpsync.ReasonSessionChange) && last.Outcome != "",
			fmt.Sprintf("%s on generation %d; last read %+v", sub.State, sub.SessionGeneration, last)
	})
	// The new server process only notifies URIs subscribed on its session.
	toggle(t, s, c2)
	eventually(t, 30*time.Second, "updates on the new session", func() (bool, string) {
		n := notificationReads(subs[kept].ID, c2.Generation())
		return n >= 1, fmt.Sprintf("%d notification reads on generation %d", n, c2.Generation())
	})
	if got := s.sub("everything", dropped); got.State != mcpsync.StateClosed ||
		slices.ContainsFunc(s.dispatches(got.ID), func(d dispatch) bool { return d.SessionGeneration == c2.Generation() }) {
		t.Errorf("closed subscription after reconnect: %s, reads %+v", got.State, s.dispatches(got.ID))
	}
}

// toggle calls server-everything's toggle-subscriber-updates tool on the live session, which
// starts its simulated updated notifications for the session's subscriptions.
func toggle(t *testing.T, s *stack, c *mcphost.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	res, err := c.Session().CallTool(ctx, &mcp.CallToolParams{Name: "toggle-subscriber-updates", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("toggle-subscriber-updates: %v", err)
	}
	if res.IsError || len(res.Content) == 0 {
		t.Fatalf("toggle-subscriber-updates: %+v", res)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, "Started") {
		t.Fatalf("toggle-subscriber-updates did not start updates: %+v", res.Content[0])
	}
}
