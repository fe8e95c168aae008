package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// runStore runs mcpsync with args against the ledger st and no Temporal.
func runStore(t *testing.T, st *ledger.Store, args ...string) (stdout, stderr string, code cli.ExitCode) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Store: st,
		Config: config.Env{TemporalAddress: closedAddr(t), Namespace: "default", DatabaseURL: "postgres://unused"}}, args)
	return out.String(), errb.String(), code
}

// authChallenge is what the host stores for a 401 (mcphost.AuthError), with an ESC sequence
// a hostile server put in its error_description.
const authChallenge = `authentication failed: HTTP 401: Bearer error="invalid_token", error_description="The access token expired` + "\x1b[31m" + `"`

// healthFixture is a ledger with two sources held by host-a: "locked", an HTTP source whose
// server refused the token (AUTH_FAILED, never connected), and "fine", a stdio source with a
// live session.
func healthFixture(t *testing.T) *ledger.Store {
	t.Helper()
	ctx := t.Context()
	st := ledger.New(pgtest.NewPool(t))
	for _, spec := range []ledger.SourceSpec{
		{Name: "locked", Transport: ledger.TransportHTTP, URL: "https://mcp.example/mcp?page=2", Connection: ledger.Connection{
			BearerEnv: "LOCKED_TOKEN", Headers: []ledger.Header{{Name: "X-Tenant", Value: "acme"}},
			HeaderEnv: []ledger.HeaderRef{{Name: "X-Api-Key", Env: "API_KEY_VAR"}}}},
		{Name: "fine", Transport: ledger.TransportStdio, Command: []string{"demo-server", "--flag"}, Connection: ledger.Connection{
			Env: []ledger.EnvVar{{Name: "MODE", Value: "fast"}, {Name: "SECRET_PASS", Value: "p4ssw0rd"}, {Name: "HOME", FromEnv: "HOME"}}}},
	} {
		if _, _, err := st.AddSource(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.ClaimSources(ctx, "host-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	locked, err := st.SourceByName(ctx, "locked")
	if err != nil {
		t.Fatal(err)
	}
	fine, err := st.SourceByName(ctx, "fine")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, r := range []ledger.HealthReport{
		{State: ledger.HealthConnecting, At: now.Add(-5 * time.Second)},
		{State: ledger.HealthAuthFailed, At: now.Add(-4 * time.Second), Err: authChallenge, NextAttempt: now.Add(26 * time.Second)},
	} {
		if err := st.SetSourceHealth(ctx, locked.ID, "host-a", r); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := st.OpenSession(ctx, fine.ID, "host-a", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125,
		Resources: true, Subscribe: true, ServerName: "demo", ServerVersion: "1.0.0", Raw: json.RawMessage(`{"resources":{"subscribe":true}}`)}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSourceHealth(ctx, fine.ID, "host-a", ledger.HealthReport{State: ledger.HealthLive, Reconnects: 2}); err != nil {
		t.Fatal(err)
	}
	return st
}

// `source list` shows every source's state, generation, era, reconnects and last error
// (shortened, with its age, escaped) in the table, and the whole health in --json (issue 14,
// item 2).
func TestSourceListShowsHealth(t *testing.T) {
	st := healthFixture(t)
	out, errOut, code := runStore(t, st, "source", "list")
	if code != cli.ExitOK {
		t.Fatalf("source list: exit %d: %s", code, errOut)
	}
	t.Logf("source list:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("source list: want a header and 2 rows:\n%s", out)
	}
	cols := regexp.MustCompile(`\s{2,}`)
	if diff := cmp.Diff([]string{"NAME", "TRANSPORT", "TARGET", "SUBJECT", "STATE", "GEN", "ERA", "RECONNECTS", "HOST", "LAST ERROR"}, cols.Split(lines[0], -1)); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	fine, locked := cols.Split(lines[1], -1), cols.Split(lines[2], -1)
	if diff := cmp.Diff([]string{"fine", "stdio", "demo-server --flag", "default", "LIVE", "1", "2025-11-25", "2", "host-a", "-"}, fine); diff != "" {
		t.Errorf("row of fine (-want +got):\n%s", diff)
	}
	if len(locked) != 10 {
		t.Fatalf("row of locked: %q", locked)
	}
	if diff := cmp.Diff([]string{"locked", "http", "https://mcp.example/mcp?page=2", "default", "AUTH_FAILED", "0", "-", "0", "host-a"}, locked[:9]); diff != "" {
		t.Errorf("row of locked (-want +got):\n%s", diff)
	}
	if !regexp.MustCompile(`^\d+s ago: authentication failed: HTTP 401: Bearer error="invalid_token", error_d.*…$`).MatchString(locked[9]) {
		t.Errorf("last error of locked: %q; want its age and the challenge, shortened", locked[9])
	}

	out, errOut, code = runStore(t, st, "source", "list", "--json")
	if code != cli.ExitOK {
		t.Fatalf("source list --json: exit %d: %s", code, errOut)
	}
	var list []struct {
		Name   string
		Health struct {
			State       string
			Current     bool
			Generation  int64
			Era         string
			Reconnects  int64
			LastError   string
			LastErrorAt *time.Time
			ReportedBy  string
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(list) != 2 {
		t.Fatalf("source list --json: %+v", list)
	}
	if h := list[0].Health; list[0].Name != "fine" || h.State != "LIVE" || !h.Current || h.Generation != 1 || h.Era != mcpsync.ProtocolVersion20251125 || h.Reconnects != 2 {
		t.Errorf("health of fine: %+v", list[0])
	}
	if h := list[1].Health; list[1].Name != "locked" || h.State != "AUTH_FAILED" || h.LastError != authChallenge || h.LastErrorAt == nil || h.ReportedBy != "host-a" {
		t.Errorf("health of locked: %+v", list[1])
	}

	// Once host-a no longer holds the lease, what it reported is marked stale.
	if _, err := st.Pool().Exec(t.Context(), `UPDATE sources SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	out, _, _ = runStore(t, st, "source", "list")
	if !regexp.MustCompile(`(?m)^locked\s.*\sAUTH_FAILED \(stale\)\s+0\s+-\s+0\s+-\s+\d+s ago: authentication`).MatchString(out) {
		t.Errorf("source list after host-a's lease expired: want AUTH_FAILED (stale) and no host:\n%s", out)
	}

	// A removed source is listed as REMOVED, not as what its last host saw before.
	if _, _, err := st.RemoveSource(t.Context(), "locked"); err != nil {
		t.Fatal(err)
	}
	out, _, _ = runStore(t, st, "source", "list")
	if !regexp.MustCompile(`(?m)^locked\s.*\sREMOVED\s+0\s+-\s+0\s+-\s+\d+s ago: authentication`).MatchString(out) {
		t.Errorf("source list after locked was removed: want REMOVED:\n%s", out)
	}
}

// `source show` prints a source's definition with its secrets as references only (variable
// names, never values; literal values only under names that do not look secret), its health
// with the whole last error (escaped), its session's era and capabilities, and the lease
// holder; --json gives the same.
func TestSourceShow(t *testing.T) {
	st := healthFixture(t)
	t.Setenv("LOCKED_TOKEN", "tok-SHOULD-NOT-SHOW")
	out, errOut, code := runStore(t, st, "source", "show", "locked")
	if code != cli.ExitOK {
		t.Fatalf("source show locked: exit %d: %s", code, errOut)
	}
	t.Logf("source show locked:\n%s", out)
	for _, re := range []string{
		`(?m)^name:\s+locked$`,
		`(?m)^url:\s+https://mcp\.example/mcp\?page=2$`,
		`(?m)^header:\s+X-Tenant: acme$`,
		`(?m)^header:\s+X-Api-Key: from environment variable API_KEY_VAR$`,
		`(?m)^bearer token:\s+from environment variable LOCKED_TOKEN$`,
		`(?m)^state:\s+AUTH_FAILED since \S+Z \(\d+s ago\), reported by host-a$`,
		`(?m)^next attempt:\s+\S+Z \(in \d+s\)$`,
		`(?m)^reconnects:\s+0$`,
		`(?m)^last error:\s+\S+Z \(\d+s ago\): authentication failed: HTTP 401: Bearer error="invalid_token", error_description="The access token expired\\x1b\[31m"$`,
		`(?m)^generation:\s+0$`,
		`(?m)^session:\s+- \(never connected\)$`,
		`(?m)^lease:\s+host-a until \S+Z$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("source show locked: no line matching %s", re)
		}
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, "tok-SHOULD-NOT-SHOW") {
		t.Errorf("source show locked prints a raw escape or the token:\n%q", out)
	}

	out, errOut, code = runStore(t, st, "source", "show", "fine")
	if code != cli.ExitOK {
		t.Fatalf("source show fine: exit %d: %s", code, errOut)
	}
	for _, re := range []string{
		`(?m)^command:\s+demo-server --flag$`,
		`(?m)^env:\s+MODE=fast$`,
		`(?m)^env:\s+SECRET_PASS=\*\*\*$`,
		`(?m)^env:\s+HOME from environment variable HOME$`,
		`(?m)^state:\s+LIVE since `,
		`(?m)^era:\s+2025-11-25$`,
		`(?m)^session:\s+live since \S+Z on host-a$`,
		`(?m)^server:\s+demo 1\.0\.0$`,
		`(?m)^capabilities:\s+resources, subscribe$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("source show fine: no line matching %s:\n%s", re, out)
		}
	}
	out, errOut, code = runStore(t, st, "source", "show", "fine", "--json")
	if code != cli.ExitOK {
		t.Fatalf("source show fine --json: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "p4ssw0rd") {
		t.Errorf("source show --json prints a secret-named value:\n%s", out)
	}
	var j struct {
		Name       string
		Connection struct{ Env []ledger.EnvVar }
		Health     struct{ State, Era string }
		Session    struct {
			Generation   int64
			Era          string
			Live         bool
			Capabilities struct{ Resources, Subscribe, ListChanged bool }
		}
		Lease struct{ Holder string }
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if diff := cmp.Diff([]ledger.EnvVar{{Name: "MODE", Value: "fast"}, {Name: "SECRET_PASS", Value: "***"}, {Name: "HOME", FromEnv: "HOME"}}, j.Connection.Env); diff != "" {
		t.Errorf("env in JSON (-want +got):\n%s", diff)
	}
	if j.Name != "fine" || j.Health.State != "LIVE" || j.Session.Generation != 1 || j.Session.Era != mcpsync.ProtocolVersion20251125 ||
		!j.Session.Live || !j.Session.Capabilities.Subscribe || j.Session.Capabilities.ListChanged || j.Lease.Holder != "host-a" {
		t.Errorf("source show fine --json: %+v", j)
	}
}

// `status` starts with one health line per source it shows, and its JSON rows carry the
// source's health.
func TestStatusShowsSourceHealth(t *testing.T) {
	st := healthFixture(t)
	out, errOut, code := runStore(t, st, "status", "locked")
	if code != cli.ExitOK {
		t.Fatalf("status locked: exit %d: %s", code, errOut)
	}
	t.Logf("status locked:\n%s", out)
	re := `(?m)^source locked: AUTH_FAILED for \d+s on host-a, generation 0, era -, 0 reconnects, next attempt in \d+s, last error \d+s ago: authentication failed: HTTP 401: .*\\x1b\[31m"$`
	if !regexp.MustCompile(re).MatchString(out) {
		t.Errorf("status locked: no line matching %s:\n%s", re, out)
	}

	// A removed source's line says so, with how to bring it back, instead of its last health.
	src, _, err := st.RemoveSource(t.Context(), "locked")
	if err != nil {
		t.Fatal(err)
	}
	out, _, _ = runStore(t, st, "status", "locked")
	want := "source locked: REMOVED at " + src.RemovedAt.UTC().Format(time.RFC3339) + " (mcpsync source add locked ... adds it again)\n"
	if !strings.HasPrefix(out, want) {
		t.Errorf("status of a removed source:\n%s\nwant it to start %q", out, want)
	}
}

// source show rejects bad input with one line: a missing or extra NAME, an empty one, an
// unknown flag exit 2 before anything is contacted; an unknown source exits 3.
func TestSourceShowBadInput(t *testing.T) {
	const usage = "(usage: mcpsync source show NAME [--json])"
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"source", "show"}, "mcpsync source show: missing NAME " + usage},
		{[]string{"source", "show", "a", "b"}, `mcpsync source show: unexpected argument "b" ` + usage},
		{[]string{"source", "show", "a", "--bogus"}, "mcpsync source show: flag provided but not defined: -bogus " + usage},
		{[]string{"source", "show", "a", "--json=maybe"}, `mcpsync source show: invalid boolean value "maybe" for -json: parse error ` + usage},
		{[]string{"source", "show", ""}, "mcpsync source show: NAME must not be empty " + usage},
	} {
		_, errOut, code := run(t, tt.args...)
		if code != cli.ExitUsage || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, cli.ExitUsage, tt.want)
		}
	}
	st := ledger.New(pgtest.NewPool(t))
	_, errOut, code := runStore(t, st, "source", "show", "nosuch")
	if want := "mcpsync source show: unknown source \"nosuch\" (see mcpsync source list)\n"; code != cli.ExitNotFound || errOut != want {
		t.Errorf("source show nosuch: exit %d, stderr %q; want exit %d and %q", code, errOut, cli.ExitNotFound, want)
	}
}
