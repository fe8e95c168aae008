package cli_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A principal without a standing grant is refused with exit 5 and one line that names the
// source as the user typed it (never the ledger's row ID), and, once revoked, the revocation.
func TestDeniedNamesTheSource(t *testing.T) {
	ctx := t.Context()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "kb", Transport: ledger.TransportStdio, Command: []string{"demo-server"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.GrantAccess(ctx, "bob", src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	rev, err := st.Revoke(ctx, ledger.RevokeRequest{Principal: "bob", SourceID: src.ID, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"subscribe", "kb", "demo://kb/1", "--principal", "alice"},
			`mcpsync subscribe: principal "alice" holds no standing grant on source "kb"`},
		{[]string{"subscribe", "kb", "demo://kb/1", "demo://kb/2", "--principal", "alice"},
			`mcpsync subscribe: principal "alice" holds no standing grant on source "kb"`},
		{[]string{"get", "kb", "demo://kb/1", "--principal", "alice"},
			`mcpsync get: principal "alice" holds no standing grant on source "kb"`},
		{[]string{"subscribe", "kb", "demo://kb/1", "--principal", "bob"},
			`mcpsync subscribe: principal "bob" holds no standing grant on source "kb" (revoked by revocation ` + strconv.FormatInt(rev.ID, 10) + `)`},
	} {
		_, errOut, code := runStore(t, st, tt.args...)
		if code != cli.ExitDenied || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, cli.ExitDenied, tt.want)
		}
	}
	// Revoking what does not stand finds nothing to revoke (exit 3), in the same words.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"revoke", "alice", "kb"}, `mcpsync revoke: principal "alice" holds no standing grant on source "kb"`},
		{[]string{"revoke", "alice"}, `mcpsync revoke: principal "alice" holds no standing grant`},
	} {
		_, errOut, code := runStore(t, st, tt.args...)
		if code != cli.ExitNotFound || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, cli.ExitNotFound, tt.want)
		}
	}
}

// What the ledger refuses or does not find is said in the user's words, on one line, without
// the ledger's prefixes: a grant on a removed source (exit 3, when it was removed and how to
// add it back), a second `source add` of a name with another definition (exit 2) and an
// unknown revocation, asked for itself or as lineage's filter (exit 3).
func TestLedgerRefusalsSayWhat(t *testing.T) {
	st := ledger.New(pgtest.NewPool(t))
	if _, _, err := st.AddSource(t.Context(), ledger.SourceSpec{Name: "kb", Transport: ledger.TransportStdio, Command: []string{"demo-server"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.AddSource(t.Context(), ledger.SourceSpec{Name: "gone", Transport: ledger.TransportStdio, Command: []string{"demo-server"}}); err != nil {
		t.Fatal(err)
	}
	gone, _, err := st.RemoveSource(t.Context(), "gone")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		code cli.ExitCode
		want string
	}{
		{[]string{"grant", "alice", "gone"}, cli.ExitNotFound,
			`mcpsync grant: source gone was removed at ` + gone.RemovedAt.UTC().Format(time.RFC3339) + ` (mcpsync source add gone ... adds it again)`},
		{[]string{"lineage", "--revocation", "999999"}, cli.ExitNotFound, `mcpsync lineage: no revocation 999999`},
		{[]string{"source", "add", "kb", "--stdio", "other-server"}, cli.ExitUsage,
			`mcpsync source add: source kb already exists with a different definition (mcpsync source show kb shows it; mcpsync source update kb changes it)`},
		{[]string{"revocation", "999999"}, cli.ExitNotFound, `mcpsync revocation: no revocation 999999`},
	} {
		_, errOut, code := runStore(t, st, tt.args...)
		if code != tt.code || errOut != tt.want+"\n" {
			t.Errorf("mcpsync %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, tt.code, tt.want)
		}
	}
}
