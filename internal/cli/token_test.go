package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Bad input to the token commands exits 2 with one line on stderr, before the ledger is
// contacted (cli_test.go's TestBadInput keeps one row per command for its coverage check).
func TestTokenBadInput(t *testing.T) {
	const (
		createUsage = "(usage: mcpsync token create PRINCIPAL [--ttl 720h] [--json])"
		listUsage   = "(usage: mcpsync token list [--json])"
		revokeUsage = "(usage: mcpsync token revoke ID [--json])"
	)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"token"}, "mcpsync token: missing subcommand (create, list, revoke; see mcpsync help)"},
		{[]string{"token", "mint"}, `mcpsync: unknown command "token mint" (see mcpsync help)`},
		{[]string{"token", "create"}, "mcpsync token create: missing PRINCIPAL " + createUsage},
		{[]string{"token", "create", "alice", "bob"}, `mcpsync token create: unexpected argument "bob" ` + createUsage},
		{[]string{"token", "create", ""}, "mcpsync token create: PRINCIPAL must not be empty"},
		{[]string{"token", "create", "   "}, "mcpsync token create: PRINCIPAL must not be empty"},
		{[]string{"token", "create", " alice"}, `mcpsync token create: principal " alice" has leading or trailing white space`},
		{[]string{"token", "create", "al\x07ice"}, `mcpsync token create: principal "al\aice" contains a control character`},
		{[]string{"token", "create", strings.Repeat("a", 300)}, `mcpsync token create: principal "` + strings.Repeat("a", 64) + `..." is too long: 300 bytes, at most 256`},
		{[]string{"token", "create", "alice", "--ttl", "-1h"}, "mcpsync token create: --ttl must not be negative, got -1h0m0s"},
		{[]string{"token", "create", "alice", "--ttl", "30"}, `mcpsync token create: invalid value "30" for flag -ttl: parse error ` + createUsage},
		{[]string{"token", "create", "alice", "--ttl", "forever"}, `mcpsync token create: invalid value "forever" for flag -ttl: parse error ` + createUsage},
		{[]string{"token", "create", "alice", "--json=maybe"}, `mcpsync token create: invalid boolean value "maybe" for -json: parse error ` + createUsage},
		{[]string{"token", "create", "alice", "--bogus"}, "mcpsync token create: flag provided but not defined: -bogus " + createUsage},
		{[]string{"token", "list", "alice"}, `mcpsync token list: unexpected argument "alice" ` + listUsage},
		{[]string{"token", "list", "--bogus"}, "mcpsync token list: flag provided but not defined: -bogus " + listUsage},
		{[]string{"token", "revoke"}, "mcpsync token revoke: missing ID " + revokeUsage},
		{[]string{"token", "revoke", "tok_0123456789ab", "x"}, `mcpsync token revoke: unexpected argument "x" ` + revokeUsage},
		{[]string{"token", "revoke", "alice"}, `mcpsync token revoke: "alice" is not a token ID (tok_ and 12 hex digits; see mcpsync token list)`},
		{[]string{"token", "revoke", "tok_0123456789AB"}, `mcpsync token revoke: "tok_0123456789AB" is not a token ID (tok_ and 12 hex digits; see mcpsync token list)`},
		{[]string{"token", "revoke", "--bogus", "tok_0123456789ab"}, "mcpsync token revoke: flag provided but not defined: -bogus " + revokeUsage},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, errOut, code := run(t, tt.args...)
			if code != cli.ExitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, cli.ExitUsage, errOut)
			}
			if out != "" && !strings.HasPrefix(out, "usage:") {
				t.Errorf("stdout %q, want nothing", out)
			}
			if diff := cmp.Diff(tt.want+"\n", errOut); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}
}

// tokenEnv runs mcpsync against st.
func tokenEnv(t *testing.T, st *ledger.Store) func(args ...string) (stdout, stderr string, code cli.ExitCode) {
	return func(args ...string) (string, string, cli.ExitCode) {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Store: st, Config: config.Env{DatabaseURL: "unused"}}, args)
		return out.String(), errb.String(), code
	}
}

// token create prints the token alone on one line (or JSON with it), the token authenticates
// as the principal; token list shows every token's state but never a token; token revoke
// ends it, and an unknown ID is exit 3.
func TestTokenCommands(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	mcpsync := tokenEnv(t, st)

	out, errOut, code := mcpsync("token", "create", "alice")
	if code != cli.ExitOK {
		t.Fatalf("token create: exit %d, stderr %q", code, errOut)
	}
	plain, ok := strings.CutSuffix(out, "\n")
	if !ok || strings.ContainsAny(plain, "\n \t") || !strings.HasPrefix(plain, "mcps_") {
		t.Fatalf("token create printed %q; want the token alone on one line", out)
	}
	if strings.Contains(errOut, plain) {
		t.Errorf("stderr repeats the token: %q", errOut)
	}
	alice, err := st.AuthenticateToken(ctx, plain)
	if err != nil {
		t.Fatalf("the printed token does not authenticate: %v", err)
	}
	if alice.Principal != "alice" || alice.ExpiresAt == nil || alice.ExpiresAt.Sub(alice.CreatedAt) != 720*time.Hour {
		t.Errorf("token create alice: %+v; want principal alice, expiring after the default 720h", alice)
	}
	if !strings.Contains(errOut, alice.ID) {
		t.Errorf("stderr %q does not name the token's ID %s", errOut, alice.ID)
	}

	type created struct {
		ID        string     `json:"id"`
		Principal string     `json:"principal"`
		Token     string     `json:"token"`
		ExpiresAt *time.Time `json:"expiresAt"`
	}
	out, errOut, code = mcpsync("token", "create", "bob", "--ttl", "0", "--json")
	if code != cli.ExitOK || errOut != "" {
		t.Fatalf("token create --json: exit %d, stderr %q", code, errOut)
	}
	var bob created
	if err := json.Unmarshal([]byte(out), &bob); err != nil {
		t.Fatalf("token create --json: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"expiresAt": null`) {
		t.Errorf("--ttl 0: want expiresAt null:\n%s", out)
	}
	got, err := st.AuthenticateToken(ctx, bob.Token)
	if err != nil || got.ID != bob.ID || got.Principal != "bob" || bob.Principal != "bob" || got.ExpiresAt != nil {
		t.Errorf("token create --json printed %+v; it authenticates as %+v, %v", bob, got, err)
	}

	out, errOut, code = mcpsync("token", "create", "carol", "--ttl", "1h", "--json")
	var carol created
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &carol) != nil || carol.ExpiresAt == nil {
		t.Fatalf("token create carol --ttl 1h: exit %d, %q, %q", code, out, errOut)
	}

	out, errOut, code = mcpsync("token", "revoke", bob.ID)
	if code != cli.ExitOK || !regexp.MustCompile(`^token `+bob.ID+` of bob revoked at \S+Z\n$`).MatchString(out) {
		t.Fatalf("token revoke: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, err := st.AuthenticateToken(ctx, bob.Token); !errors.Is(err, ledger.ErrTokenInvalid) {
		t.Errorf("revoked token authenticates: %v", err)
	}
	out, _, code = mcpsync("token", "revoke", bob.ID, "--json")
	var rev struct {
		ID, Status string
		RevokedAt  *time.Time `json:"revokedAt"`
	}
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &rev) != nil || rev.Status != "revoked" || rev.RevokedAt == nil {
		t.Errorf("token revoke again --json: exit %d, %q; want it revoked, exit 0", code, out)
	}
	out, errOut, code = mcpsync("token", "revoke", "tok_000000000000")
	if code != cli.ExitNotFound || out != "" || errOut != "mcpsync token revoke: no token tok_000000000000 (see mcpsync token list)\n" {
		t.Errorf("revoke unknown: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	out, errOut, code = mcpsync("token", "list", "--json")
	if code != cli.ExitOK {
		t.Fatalf("token list --json: exit %d, stderr %q", code, errOut)
	}
	type listed struct {
		ID, Principal, Status string
	}
	var list []listed
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("token list --json: %v\n%s", err, out)
	}
	want := []listed{{alice.ID, "alice", "active"}, {bob.ID, "bob", "revoked"}, {carol.ID, "carol", "active"}}
	if diff := cmp.Diff(want, list); diff != "" {
		t.Errorf("token list --json (-want +got):\n%s", diff)
	}
	text, _, code := mcpsync("token", "list")
	if code != cli.ExitOK {
		t.Fatalf("token list: exit %d", code)
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[2], bob.ID) || !strings.Contains(lines[2], "revoked") {
		t.Errorf("token list:\n%s", text)
	}
	for _, secret := range []string{plain, bob.Token, carol.Token, strings.TrimPrefix(plain, "mcps_")[:12]} {
		if strings.Contains(text+out, secret) {
			t.Errorf("token list shows a token")
		}
	}
}
