package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// The walking skeleton over streamable HTTP: source add → subscribe → the server changes
// content → the accepted digest is the SHA-256 of the server's new body → get returns its exact
// bytes → unsubscribe → CLOSED → a change after close produces no new version (while a second,
// still active subscription proves the server did change and notify).
func TestSubscribeReadAcceptUnsubscribeOverHTTP(t *testing.T) {
	s := newStack(t)
	srv := chaosmcp.New(chaosmcp.Options{Name: "chaos", Version: "1.2.3"})
	t.Cleanup(func() { srv.Close() })
	srv.Set("demo://notes/1", "first body\n", "text/plain")
	srv.Set("demo://notes/2", "other body\n", "text/plain")
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })

	s.mustCLI("source", "add", "chaos", "--url", h.URL)
	out := s.mustCLI("subscribe", "chaos", "demo://notes/1")
	if !strings.Contains(out, string(mcpsync.StateActive)) {
		t.Errorf("subscribe output %q does not say ACTIVE", out)
	}
	s.mustCLI("subscribe", "chaos", "demo://notes/2")
	// Subscribing again is idempotent: same workflow, same generation.
	again := s.mustCLI("subscribe", "chaos", "demo://notes/1")
	if again != out {
		t.Errorf("second subscribe printed %q, first %q", again, out)
	}
	s.waitDigest("chaos", "demo://notes/1", ledger.Digest([]byte("first body\n")))

	srv.Set("demo://notes/1", "second body\n", "text/plain")
	sub := s.waitDigest("chaos", "demo://notes/1", ledger.Digest([]byte("second body\n")))
	if got := s.mustCLI("get", "chaos", "demo://notes/1"); got != "second body\n" {
		t.Errorf("get = %q, want the exact accepted bytes", got)
	}
	v, err := s.st.LatestVersion(s.ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.ServerName != "chaos" || v.ServerVersion != "1.2.3" || v.AuthSubject != "default" || v.MIMEType != "text/plain" {
		t.Errorf("resourceVersion.v1 fields: %+v", v)
	}

	out = s.mustCLI("unsubscribe", "chaos", "demo://notes/1")
	if !strings.Contains(out, string(mcpsync.StateClosed)) {
		t.Errorf("unsubscribe output %q does not say CLOSED", out)
	}
	closed := s.sub("chaos", "demo://notes/1")
	if closed.State != mcpsync.StateClosed || closed.CloseOrdinal == nil {
		t.Fatalf("after unsubscribe: %s close ordinal %v", closed.State, closed.CloseOrdinal)
	}
	srv.Set("demo://notes/1", "third body\n", "text/plain")
	srv.Set("demo://notes/2", "other changed\n", "text/plain")
	s.waitDigest("chaos", "demo://notes/2", ledger.Digest([]byte("other changed\n")))
	after := s.sub("chaos", "demo://notes/1")
	if after.LastAcceptedOrdinal != closed.LastAcceptedOrdinal || after.LastIssuedOrdinal != closed.LastIssuedOrdinal {
		t.Errorf("closed subscription moved: issued %d→%d accepted %d→%d", closed.LastIssuedOrdinal, after.LastIssuedOrdinal, closed.LastAcceptedOrdinal, after.LastAcceptedOrdinal)
	}
	// Cached content survives the unsubscribe (R10).
	if got := s.mustCLI("get", "chaos", "demo://notes/1"); got != "second body\n" {
		t.Errorf("get after unsubscribe = %q", got)
	}
}

// Bad input gets one clear line and exit 2; nothing found exits 3.
func TestCLIErrors(t *testing.T) {
	s := newStack(t)
	s.mustCLI("source", "add", "demo", "--stdio", "demo-server --flag 'a b'")
	tests := []struct {
		args []string
		code cli.ExitCode
		msg  string
	}{
		{[]string{}, 2, ""},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"source", "add", "x"}, 2, "--stdio"},
		{[]string{"source", "add", "x", "--stdio", "a", "--url", "http://x"}, 2, "not both"},
		{[]string{"source", "add", "x", "--url", "ftp://x"}, 2, "http"},
		{[]string{"source", "add", "x", "--stdio", "'unterminated"}, 2, "quote"},
		{[]string{"source", "add", "demo", "--stdio", "other"}, 2, "already exists"},
		{[]string{"source", "add", "x", "--stdio", "a", "--backstop", "soon"}, 2, "invalid value"},
		{[]string{"subscribe", "nosuch", "demo://x"}, 3, "unknown source"},
		{[]string{"subscribe", "demo", "not a uri"}, 2, `uri "not a uri"`},
		{[]string{"subscribe", "demo"}, 2, "usage"},
		{[]string{"unsubscribe", "demo", "demo://never"}, 3, "no subscription"},
		{[]string{"get", "demo", "demo://never"}, 3, "no subscription"},
		{[]string{"status", "nosuch"}, 3, "unknown source"},
		{[]string{"status", "demo", "demo://never"}, 3, "no subscription"},
	}
	for _, tt := range tests {
		_, errOut, code := s.cli(tt.args...)
		if code != tt.code {
			t.Errorf("mcpsync %v: exit %d, want %d (stderr %q)", tt.args, code, tt.code, errOut)
		}
		if tt.msg != "" && (!strings.Contains(errOut, tt.msg) || strings.Count(strings.TrimSpace(errOut), "\n") != 0) {
			t.Errorf("mcpsync %v: stderr %q, want one line mentioning %q", tt.args, errOut, tt.msg)
		}
	}
	out := s.mustCLI("source", "list")
	if !strings.Contains(out, "demo-server --flag 'a b'") {
		t.Errorf("source list: %q", out)
	}
}

// The walking skeleton with the demo server over stdio: the server changes its content every
// second; the accepted digest catches up with the SHA-256 of what the server serves (read
// independently on the same session), and after unsubscribe → CLOSED the server's further
// changes produce no new version.
func TestDemoServerOverStdio(t *testing.T) {
	s := newStack(t)
	s.mustCLI("source", "add", "demo", "--stdio", binary(t, "mcpsync-demo-server")+" --interval 1s")
	s.mustCLI("subscribe", "demo", "demo://notes/1")
	src, err := s.st.SourceByName(s.ctx, "demo")
	if err != nil {
		t.Fatal(err)
	}
	serverDigest := func() string {
		c, ok := s.workers[0].Host.Current(src.ID)
		if !ok {
			return ""
		}
		res, err := c.Session().ReadResource(s.ctx, &mcp.ReadResourceParams{URI: "demo://notes/1"})
		if err != nil || len(res.Contents) != 1 {
			return ""
		}
		return ledger.Digest([]byte(res.Contents[0].Text))
	}
	var first string
	eventually(t, 30*time.Second, "accepted digest equals the server's changed body", func() (bool, string) {
		sub := s.sub("demo", "demo://notes/1")
		if first == "" {
			first = sub.LastAcceptedDigest
		}
		d := serverDigest()
		return sub.LastAcceptedDigest != first && d == sub.LastAcceptedDigest,
			fmt.Sprintf("accepted %s (ordinal %d), server %s", sub.LastAcceptedDigest, sub.LastAcceptedOrdinal, d)
	})
	s.mustCLI("unsubscribe", "demo", "demo://notes/1")
	closed := s.sub("demo", "demo://notes/1")
	if closed.State != mcpsync.StateClosed {
		t.Fatalf("state %s after unsubscribe", closed.State)
	}
	versions, err := s.st.Versions(s.ctx, closed.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Two server changes after the close.
	for i := 0; i < 2; i++ {
		before := serverDigest()
		eventually(t, 10*time.Second, "the server changed after the close", func() (bool, string) {
			return serverDigest() != before, before
		})
	}
	after, err := s.st.Versions(s.ctx, closed.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(versions) {
		t.Errorf("%d versions after close, %d before", len(after), len(versions))
	}
	s.checkInvariants()
}

// The CLI works only on a ledger at exactly its own schema version: it says what to do when
// the schema is missing or older (start the worker, which migrates) or newer (upgrade).
func TestCLISchemaVersion(t *testing.T) {
	run := func(dbURL string) (string, cli.ExitCode) {
		var out, errb strings.Builder
		code := cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb,
			Config: config.Env{DatabaseURL: dbURL, TemporalAddress: "127.0.0.1:1", Namespace: "default"}}, []string{"source", "list"})
		return errb.String(), code
	}
	if errOut, code := run(pgtest.NewEmptyDB(t)); code != 1 || !strings.Contains(errOut, "no mcpsync schema") {
		t.Errorf("empty database: exit %d %q", code, errOut)
	}
	current := pgtest.NewDB(t)
	if errOut, code := run(current); code != 0 {
		t.Errorf("current schema: exit %d %q", code, errOut)
	}
	pool, err := pgxpool.New(context.Background(), current)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `INSERT INTO schema_migrations (version, name) VALUES (9999, 'from a newer build')`); err != nil {
		t.Fatal(err)
	}
	if errOut, code := run(current); code != 1 || !strings.Contains(errOut, "newer than this mcpsync") {
		t.Errorf("newer schema: exit %d %q", code, errOut)
	}
	if _, err := pool.Exec(context.Background(), `DELETE FROM schema_migrations WHERE version >= (SELECT max(version) FROM schema_migrations WHERE version < 9999)`); err != nil {
		t.Fatal(err)
	}
	if errOut, code := run(current); code != 1 || !strings.Contains(errOut, "start mcpsync-worker to apply migrations") {
		t.Errorf("older schema: exit %d %q", code, errOut)
	}
}
