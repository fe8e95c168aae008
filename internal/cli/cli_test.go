package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
)

// closedAddr returns a loopback address nothing listens on: a command that dialled Temporal
// or the ledger before rejecting its input would fail with ExitFailure there instead of
// ExitUsage.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// run runs mcpsync with args against no stack.
func run(t *testing.T, args ...string) (stdout, stderr string, code cli.ExitCode) {
	t.Helper()
	addr := closedAddr(t)
	var out, errb bytes.Buffer
	code = cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Config: config.Env{
		TemporalAddress: addr, Namespace: "default",
		DatabaseURL: "postgres://mcpsync@" + addr + "/mcpsync?sslmode=disable&connect_timeout=2",
	}}, args)
	return out.String(), errb.String(), code
}

// usageOf returns the usage line of a command, as `mcpsync help COMMAND` prints it first.
func usageOf(t *testing.T, name string) string {
	t.Helper()
	out, errOut, code := run(t, append([]string{"help"}, strings.Fields(name)...)...)
	first, _, _ := strings.Cut(out, "\n")
	usage, ok := strings.CutPrefix(first, "usage: ")
	if code != cli.ExitOK || errOut != "" || !ok {
		t.Fatalf("mcpsync help %s: exit %d, stdout %q, stderr %q", name, code, out, errOut)
	}
	return usage
}

// commandOf returns the registered command args run ("source add"), or "" if none.
func commandOf(args []string) string {
	names := cli.Commands()
	if len(args) >= 2 && slices.Contains(names, args[0]+" "+args[1]) {
		return args[0] + " " + args[1]
	}
	if len(args) >= 1 && slices.Contains(names, args[0]) {
		return args[0]
	}
	return ""
}

// Every command rejects bad input with ExitUsage and exactly one line on stderr naming the
// problem, without a stack: nothing is dialled before the input is validated.
func TestBadInput(t *testing.T) {
	var sourceSubs, outboxSubs []string
	for _, name := range cli.Commands() {
		if sub, ok := strings.CutPrefix(name, "source "); ok {
			sourceSubs = append(sourceSubs, sub)
		}
		if sub, ok := strings.CutPrefix(name, "outbox "); ok {
			outboxSubs = append(outboxSubs, sub)
		}
	}
	tests := []struct {
		args []string
		// want is the whole stderr line; "{usage}" stands for "(usage: …)" of the command.
		// With contains set, want need only appear in the line.
		want     string
		contains bool
	}{
		// The dispatcher.
		{args: []string{}, want: "mcpsync: missing command (see mcpsync help)"},
		{args: []string{"frobnicate"}, want: `mcpsync: unknown command "frobnicate" (see mcpsync help)`},
		{args: []string{"source"}, want: "mcpsync source: missing subcommand (" + strings.Join(sourceSubs, ", ") + "; see mcpsync help)"},
		{args: []string{"source", "--json"}, want: "mcpsync source: missing subcommand (" + strings.Join(sourceSubs, ", ") + "; see mcpsync help)"},
		{args: []string{"source", "rename", "x"}, want: `mcpsync: unknown command "source rename" (see mcpsync help)`},
		{args: []string{"outbox"}, want: "mcpsync outbox: missing subcommand (" + strings.Join(outboxSubs, ", ") + "; see mcpsync help)"},
		{args: []string{"help", "frobnicate"}, want: `mcpsync: unknown command "frobnicate" (see mcpsync help)`},

		// source add
		{args: []string{"source", "add"}, want: "mcpsync source add: missing NAME {usage}"},
		{args: []string{"source", "add", "a", "b", "--stdio", "x"}, want: `mcpsync source add: unexpected argument "b" {usage}`},
		{args: []string{"source", "add", "a", "--bogus"}, want: "mcpsync source add: flag provided but not defined: -bogus {usage}"},
		{args: []string{"source", "add", "a"}, want: `mcpsync source add: give --stdio "CMD ARGS" or --url URL {usage}`},
		{args: []string{"source", "add", "a", "--stdio", "x", "--url", "http://h"}, want: "mcpsync source add: give either --stdio or --url, not both"},
		{args: []string{"source", "add", "a", "--stdio", ""}, want: "mcpsync source add: --stdio must not be empty"},
		{args: []string{"source", "add", "a", "--stdio", "   "}, want: "mcpsync source add: --stdio: empty command"},
		{args: []string{"source", "add", "a", "--stdio", "'unterminated"}, want: `mcpsync source add: --stdio: unterminated single quote in "'unterminated"`},
		{args: []string{"source", "add", "a", "--url", ""}, want: "mcpsync source add: --url must not be empty"},
		{args: []string{"source", "add", "a", "--url", "ftp://h"}, want: `mcpsync source add: --url "ftp://h" is not an http:// or https:// URL with a host`},
		{args: []string{"source", "add", "a", "--url", "http://"}, want: `mcpsync source add: --url "http://" is not an http:// or https:// URL with a host`},
		{args: []string{"source", "add", "a", "--url", "http://[::1"}, want: `mcpsync source add: --url "http://[::1" is not an http:// or https:// URL with a host`},
		{args: []string{"source", "add", "a b", "--stdio", "x"}, want: `mcpsync source add: source name "a b" must be non-empty without spaces or '/'`},
		{args: []string{"source", "add", "a", "--stdio", "x", "--env", "DB=env:DATABASE_URL"}, want: `mcpsync source add: source "a": --env DB=env:DATABASE_URL: a stdio child may not receive the worker's configuration variables (DATABASE_URL, TEMPORAL_*, MCPSYNC_*, PG*)`},
		{args: []string{"source", "add", "a", "--url", "https://u:pw@h/mcp"}, want: `mcpsync source add: http source "a": the URL https://u:***@h/mcp carries credentials (userinfo or a secret-looking query parameter); give them with --bearer-env, --header-env or OAuth so that only a reference is stored`},
		{args: []string{"source", "add", "a", "--url", "https://h/mcp", "--header", "Authorization: Bearer abc"}, want: `mcpsync source add: source "a": header "Authorization" carries a secret: give it with --header-env Authorization=VAR so that only the variable name is stored`},
		{args: []string{"source", "add", "a", "--stdio", "x", "--backstop", "1500ms"}, want: "mcpsync source add: --backstop must be a whole number of seconds, at least 1s, got 1.5s"},
		{args: []string{"source", "add", "a", "--stdio", "x", "--backstop", "-1s"}, want: "mcpsync source add: --backstop must be a whole number of seconds, at least 1s, got -1s"},
		{args: []string{"source", "add", "a", "--stdio", "x", "--poll", "0s"}, want: "mcpsync source add: --poll must be a whole number of seconds, at least 1s, got 0s"},
		{args: []string{"source", "add", "a", "--stdio", "x", "--backstop", "soon"}, want: `mcpsync source add: invalid value "soon" for flag -backstop: parse error {usage}`},
		{args: []string{"source", "add", "a", "--stdio", "x", "--json=yes"}, want: `mcpsync source add: invalid boolean value "yes" for -json: parse error {usage}`},
		// issue 14 item 7: an int4 overflow, names too long or not printable.
		{args: []string{"source", "add", "a", "--stdio", "x", "--backstop", "1000000h"}, want: "mcpsync source add: --backstop must be at most 168h0m0s, got 1000000h0m0s"},
		{args: []string{"source", "add", "a", "--stdio", "x", "--poll", "1000000h"}, want: "mcpsync source add: --poll must be at most 168h0m0s, got 1000000h0m0s"},
		{args: []string{"source", "add", "a", "--stdio", "x", "--backstop", "9000000h"}, want: `mcpsync source add: invalid value "9000000h" for flag -backstop: parse error {usage}`},
		{args: []string{"source", "add", strings.Repeat("n", 201), "--stdio", "x"}, want: "mcpsync source add: source name of 201 bytes is longer than 200"},
		{args: []string{"source", "add", strings.Repeat("é", 101), "--stdio", "x"}, want: "mcpsync source add: source name of 202 bytes is longer than 200"},
		{args: []string{"source", "add", "a\x01b", "--stdio", "x"}, want: `mcpsync source add: source name "a\x01b" must be printable UTF-8`},
		{args: []string{"source", "add", "a\xffb", "--stdio", "x"}, want: `mcpsync source add: source name "a\xffb" must be printable UTF-8`},
		{args: []string{"source", "add", "", "--stdio", "x"}, want: `mcpsync source add: source name "" must be non-empty without spaces or '/'`},
		{args: []string{"source", "add", "a/b", "--stdio", "x"}, want: `mcpsync source add: source name "a/b" must be non-empty without spaces or '/'`},

		// source update (issue 14 item 5): every given flag is checked before anything is contacted.
		{args: []string{"source", "update"}, want: "mcpsync source update: missing NAME {usage}"},
		{args: []string{"source", "update", "a"}, want: "mcpsync source update: nothing to update: give at least one flag of source add {usage}"},
		{args: []string{"source", "update", "a", "--json"}, want: "mcpsync source update: nothing to update: give at least one flag of source add {usage}"},
		{args: []string{"source", "update", "a", "b", "--poll", "5s"}, want: `mcpsync source update: unexpected argument "b" {usage}`},
		{args: []string{"source", "update", "a", "--bogus"}, want: "mcpsync source update: flag provided but not defined: -bogus {usage}"},
		{args: []string{"source", "update", "a b", "--poll", "5s"}, want: `mcpsync source update: source name "a b" must be non-empty without spaces or '/'`},
		{args: []string{"source", "update", strings.Repeat("n", 201), "--poll", "5s"}, want: "mcpsync source update: source name of 201 bytes is longer than 200"},
		{args: []string{"source", "update", "a", "--backstop", "1500ms"}, want: "mcpsync source update: --backstop must be a whole number of seconds, at least 1s, got 1.5s"},
		{args: []string{"source", "update", "a", "--backstop", "1000000h"}, want: "mcpsync source update: --backstop must be at most 168h0m0s, got 1000000h0m0s"},
		{args: []string{"source", "update", "a", "--poll", "0s"}, want: "mcpsync source update: --poll must be a whole number of seconds, at least 1s, got 0s"},
		{args: []string{"source", "update", "a", "--max-bytes", "0"}, want: "mcpsync source update: --max-bytes must be between 1 and 1073741824, got 0"},
		{args: []string{"source", "update", "a", "--stdio", "x", "--url", "http://h"}, want: "mcpsync source update: give either --stdio or --url, not both"},
		{args: []string{"source", "update", "a", "--stdio", ""}, want: "mcpsync source update: --stdio must not be empty"},
		{args: []string{"source", "update", "a", "--url", "ftp://h"}, want: `mcpsync source update: --url "ftp://h" is not an http:// or https:// URL with a host`},
		{args: []string{"source", "update", "a", "--header", "nocolon"}, want: `mcpsync source update: --header "nocolon" must be 'Name: value'`},
		{args: []string{"source", "update", "a", "--env", "=x"}, want: `mcpsync source update: --env "=x" must be K=V or K=env:VAR`},
		{args: []string{"source", "update", "a", "--oauth-client-id", "c"}, want: "mcpsync source update: --oauth-* flags need --oauth client_credentials or --oauth authorization_code"},
		{args: []string{"source", "update", "a", "--json=yes"}, want: `mcpsync source update: invalid boolean value "yes" for -json: parse error {usage}`},

		// source remove
		{args: []string{"source", "remove"}, want: "mcpsync source remove: missing NAME {usage}"},
		{args: []string{"source", "remove", "a", "b"}, want: `mcpsync source remove: unexpected argument "b" {usage}`},
		{args: []string{"source", "remove", " "}, want: "mcpsync source remove: NAME must not be empty"},
		{args: []string{"source", "remove", "a", "--wait", "-1s"}, want: "mcpsync source remove: --wait must not be negative, got -1s"},
		{args: []string{"source", "remove", "a", "--wait", "soon"}, want: `mcpsync source remove: invalid value "soon" for flag -wait: parse error {usage}`},
		{args: []string{"source", "remove", "a", "--purge=maybe"}, want: `mcpsync source remove: invalid boolean value "maybe" for -purge: parse error {usage}`},
		{args: []string{"source", "remove", "a", "--bogus"}, want: "mcpsync source remove: flag provided but not defined: -bogus {usage}"},

		// source check (its own rows are its author's; this one keeps every command covered)
		{args: []string{"source", "check", "--bogus"}, want: "mcpsync source check: flag provided but not defined: -bogus {usage}"},

		// source login (its other rows are in login_test.go; these keep every command covered)
		{args: []string{"source", "login"}, want: "mcpsync source login: missing NAME {usage}"},
		{args: []string{"source", "login", "a", "--bogus"}, want: "mcpsync source login: flag provided but not defined: -bogus {usage}"},

		// source show (its own rows are its author's; this one keeps every command covered)
		{args: []string{"source", "show", "--bogus"}, want: "mcpsync source show: flag provided but not defined: -bogus {usage}"},

		// source list
		{args: []string{"source", "list", "extra"}, want: `mcpsync source list: unexpected argument "extra" {usage}`},
		{args: []string{"source", "list", "--json", "true"}, want: `mcpsync source list: unexpected argument "true" {usage}`},
		{args: []string{"source", "list", "--bogus"}, want: "mcpsync source list: flag provided but not defined: -bogus {usage}"},

		// subscribe
		{args: []string{"subscribe"}, want: "mcpsync subscribe: missing SOURCE URI {usage}"},
		{args: []string{"subscribe", "demo"}, want: "mcpsync subscribe: missing URI {usage}"},
		// Many URIs: a malformed one refuses the whole list before anything is contacted.
		{args: []string{"subscribe", "demo", "demo://x", "more"}, want: `mcpsync subscribe: 1 of 2 URIs are malformed, nothing was subscribed: argument 3: uri "more": no scheme`},
		{args: []string{"subscribe", "demo", "a", "demo://x", "b", "c", "d", "e", "f"}, want: `mcpsync subscribe: 6 of 7 URIs are malformed, nothing was subscribed: argument 2: uri "a": no scheme; argument 4: uri "b": no scheme; argument 5: uri "c": no scheme; argument 6: uri "d": no scheme; argument 7: uri "e": no scheme; and 1 more`},
		{args: []string{"subscribe", "demo", "--uris-file", "/nonexistent/uris.txt"}, want: `mcpsync subscribe: --uris-file: open /nonexistent/uris.txt: no such file or directory`},
		{args: []string{"subscribe", "demo", "--uris-file", ""}, want: `mcpsync subscribe: --uris-file must not be empty`},
		{args: []string{"subscribe", "demo", "demo://x", "demo://y", "--parallel", "0"}, want: `mcpsync subscribe: --parallel must be at least 1, got 0`},
		{args: []string{"subscribe", "demo", "demo://x", "demo://y", "--window", "-1"}, want: `mcpsync subscribe: --window must not be negative, got -1`},
		{args: []string{"subscribe", "demo", "demo://x", "--bogus"}, want: "mcpsync subscribe: flag provided but not defined: -bogus {usage}"},
		{args: []string{"subscribe", "demo", "demo://x", "--wait", "-1s"}, want: "mcpsync subscribe: --wait must not be negative, got -1s"},
		{args: []string{"subscribe", "demo", "demo://x", "--wait", "abc"}, want: `mcpsync subscribe: invalid value "abc" for flag -wait: parse error {usage}`},
		{args: []string{"subscribe", "demo", "demo://x", "--principal", ""}, want: "mcpsync subscribe: --principal must not be empty"},
		{args: []string{"subscribe", "demo", "not a uri"}, want: `mcpsync subscribe: uri "not a uri": `, contains: true},
		{args: []string{"subscribe", "demo", ""}, want: `mcpsync subscribe: uri "": `, contains: true},
		{args: []string{"subscribe", "demo", "demo://x/%zz"}, want: `mcpsync subscribe: uri "demo://x/%zz": `, contains: true},
		{args: []string{"subscribe", "demo", "demo://x", "--json=1x"}, want: `mcpsync subscribe: invalid boolean value "1x" for -json: parse error {usage}`},
		// URIs that do not fit Temporal's 2 KiB search-attribute value (issue 14 item 7).
		{args: []string{"subscribe", "demo", "demo://x/" + strings.Repeat("a", 3000)}, want: `mcpsync subscribe: uri "demo://x/aaaaaaaaaaaaaaaaaaaaaaa"... of 3009 bytes is too long: at most 2048 bytes (Temporal's search-attribute limit)`},
		{args: []string{"subscribe", "demo", "demo://x/" + strings.Repeat("a", 2039)}, want: `mcpsync subscribe: uri "demo://x/aaaaaaaaaaaaaaaaaaaaaaa"... is too long: 2050 bytes once encoded for Temporal's search attribute, at most 2048`},
		{args: []string{"subscribe", "demo", "demo://x/" + strings.Repeat("<", 400)}, want: `mcpsync subscribe: uri "demo://x/<<<<<<<<<<<<<<<<<<<<<<<"... is too long: 2411 bytes once encoded for Temporal's search attribute, at most 2048`},
		{args: []string{"unsubscribe", "demo", "demo://x/" + strings.Repeat("a", 3000)}, want: `mcpsync unsubscribe: uri "demo://x/aaaaaaaaaaaaaaaaaaaaaaa"... of 3009 bytes is too long: at most 2048 bytes (Temporal's search-attribute limit)`},

		// unsubscribe
		{args: []string{"unsubscribe", "demo"}, want: "mcpsync unsubscribe: missing URI {usage}"},
		{args: []string{"unsubscribe", "demo", "demo://x", "extra"}, want: `mcpsync unsubscribe: unexpected argument "extra" {usage}`},
		{args: []string{"unsubscribe", "demo", "demo://x", "--wait", "-5ms"}, want: "mcpsync unsubscribe: --wait must not be negative, got -5ms"},
		{args: []string{"unsubscribe", "demo", "demo://x", "--principal", " "}, want: "mcpsync unsubscribe: --principal must not be empty"},
		{args: []string{"unsubscribe", "demo", "no-scheme"}, want: `mcpsync unsubscribe: uri "no-scheme": `, contains: true},

		// status
		{args: []string{"status", "demo", "demo://x", "extra"}, want: `mcpsync status: unexpected argument "extra" {usage}`},
		{args: []string{"status", "demo", "not a uri"}, want: `mcpsync status: uri "not a uri": `, contains: true},
		{args: []string{"status", "--bogus"}, want: "mcpsync status: flag provided but not defined: -bogus {usage}"},

		// get
		{args: []string{"get", "demo"}, want: "mcpsync get: missing URI {usage}"},
		{args: []string{"get", "demo", "demo://x", "extra"}, want: `mcpsync get: unexpected argument "extra" {usage}`},
		{args: []string{"get", "demo", "demo://x", "--principal", ""}, want: "mcpsync get: --principal must not be empty"},
		{args: []string{"get", "demo", ""}, want: `mcpsync get: uri "": `, contains: true},
		{args: []string{"get", "demo", "demo://x", "--json=yes"}, want: `mcpsync get: invalid boolean value "yes" for -json: parse error {usage}`},

		// grant, grants
		{args: []string{"grant", "alice"}, want: "mcpsync grant: missing SOURCE {usage}"},
		{args: []string{"grant", "alice", "demo", "extra"}, want: `mcpsync grant: unexpected argument "extra" {usage}`},
		{args: []string{"grant", "", "demo"}, want: "mcpsync grant: PRINCIPAL must not be empty"},
		{args: []string{"grant", "alice", "demo", "--bogus"}, want: "mcpsync grant: flag provided but not defined: -bogus {usage}"},
		{args: []string{"grants", "alice", "bob"}, want: `mcpsync grants: unexpected argument "bob" {usage}`},
		{args: []string{"grants", "--bogus"}, want: "mcpsync grants: flag provided but not defined: -bogus {usage}"},

		// token create, token list, token revoke (their other rows are in token_test.go)
		{args: []string{"token", "create"}, want: "mcpsync token create: missing PRINCIPAL {usage}"},
		{args: []string{"token", "list", "x"}, want: `mcpsync token list: unexpected argument "x" {usage}`},
		{args: []string{"token", "revoke", "x"}, want: `mcpsync token revoke: "x" is not a token ID (tok_ and 12 hex digits; see mcpsync token list)`},

		// revoke, revocation
		{args: []string{"revoke"}, want: "mcpsync revoke: missing PRINCIPAL {usage}"},
		{args: []string{"revoke", "alice", "demo", "extra"}, want: `mcpsync revoke: unexpected argument "extra" {usage}`},
		{args: []string{"revoke", " ", "demo"}, want: "mcpsync revoke: PRINCIPAL must not be empty"},
		{args: []string{"revoke", "alice", "--wait", "-1s"}, want: "mcpsync revoke: --wait must not be negative, got -1s"},
		{args: []string{"revoke", "alice", "demo", "--wait", "-1s"}, want: "mcpsync revoke: --wait must not be negative, got -1s"},
		{args: []string{"revoke", "--wait=-1s", "alice", "demo"}, want: "mcpsync revoke: --wait must not be negative, got -1s"},
		{args: []string{"revoke", "alice", "--wait", "abc"}, want: `mcpsync revoke: invalid value "abc" for flag -wait: parse error {usage}`},
		{args: []string{"revocation"}, want: "mcpsync revocation: missing ID {usage}"},
		{args: []string{"revocation", "x"}, want: `mcpsync revocation: revocation ID "x" is not a number above 0 {usage}`},
		{args: []string{"revocation", "0"}, want: `mcpsync revocation: revocation ID "0" is not a number above 0 {usage}`},
		{args: []string{"revocation", "1", "2"}, want: `mcpsync revocation: unexpected argument "2" {usage}`},

		// lineage
		{args: []string{"lineage", "extra"}, want: `mcpsync lineage: unexpected argument "extra" {usage}`},
		{args: []string{"lineage", "--revocation", "-1"}, want: "mcpsync lineage: --revocation must be a revocation ID above 0, got -1"},
		{args: []string{"lineage", "--revocation", "x"}, want: `mcpsync lineage: invalid value "x" for flag -revocation: parse error {usage}`},
		{args: []string{"lineage", "--live", "--revocation", "3"}, want: "mcpsync lineage: --live and --revocation exclude each other: a revocation's entries are not live"},

		// outbox tail, outbox consumers
		{args: []string{"outbox", "tail"}, want: "mcpsync outbox tail: --consumer NAME is required {usage}"},
		{args: []string{"outbox", "tail", "--consumer", "c", "extra"}, want: `mcpsync outbox tail: unexpected argument "extra" {usage}`},
		{args: []string{"outbox", "tail", "--consumer", "c", "--batch", "0"}, want: "mcpsync outbox tail: --batch must be positive, got 0"},
		{args: []string{"outbox", "tail", "--consumer", "c", "--limit", "-1"}, want: "mcpsync outbox tail: --limit must not be negative, got -1"},
		{args: []string{"outbox", "tail", "--consumer", "c", "--poll", "1s"}, want: "mcpsync outbox tail: --poll applies only with --follow"},
		{args: []string{"outbox", "tail", "--consumer", "c", "--follow", "--poll", "0s"}, want: "mcpsync outbox tail: --poll must be positive, got 0s"},
		{args: []string{"outbox", "tail", "--consumer", "c", "--follow", "--poll", "-1s"}, want: "mcpsync outbox tail: --poll must be positive, got -1s"},
		{args: []string{"outbox", "tail", "--consumer", "c", "--follow", "--poll", "soon"}, want: `mcpsync outbox tail: invalid value "soon" for flag -poll: parse error {usage}`},
		{args: []string{"outbox", "consumers", "extra"}, want: `mcpsync outbox consumers: unexpected argument "extra" {usage}`},
		{args: []string{"outbox", "consumers", "--json=maybe"}, want: `mcpsync outbox consumers: invalid boolean value "maybe" for -json: parse error {usage}`},

		// reconcile
		{args: []string{"reconcile"}, want: "mcpsync reconcile: missing SOURCE {usage}"},
		{args: []string{"reconcile", "demo", "demo://x", "extra"}, want: `mcpsync reconcile: unexpected argument "extra" {usage}`},
		{args: []string{"reconcile", "demo", "not a uri"}, want: `mcpsync reconcile: uri "not a uri": `, contains: true},

		// rollout
		// prune (more rows in prune_test.go)
		{args: []string{"prune", "--older-than", "-1h"}, want: "mcpsync prune: --older-than must not be negative, got -1h0m0s"},

		{args: []string{"rollout"}, want: "mcpsync rollout: missing ACTION {usage}"},
		{args: []string{"rollout", "sideways"}, want: `mcpsync rollout: unknown rollout action "sideways": want status, shadow, live or rollback {usage}`},
		{args: []string{"rollout", "live", "now"}, want: `mcpsync rollout: unexpected argument "now" {usage}`},
		{args: []string{"rollout", "live", "--percent", "101"}, want: `mcpsync rollout: --percent must be a whole number from 0 to 100, got "101"`},
		{args: []string{"rollout", "live", "--percent", "5.5"}, want: `mcpsync rollout: --percent must be a whole number from 0 to 100, got "5.5"`},
		{args: []string{"rollout", "shadow", "--percent", "50"}, want: "mcpsync rollout: --percent applies only to rollout live"},
		{args: []string{"rollout", "status", "--reason", "why"}, want: "mcpsync rollout: --reason applies only to a change (shadow, live, rollback), not to status"},

		// scan
		{args: []string{"scan"}, want: "mcpsync scan: missing SOURCE {usage}"},
		{args: []string{"scan", "demo", "extra"}, want: `mcpsync scan: unexpected argument "extra" {usage}`},
		{args: []string{"scan", "demo", "--timeout", "1m"}, want: "mcpsync scan: --timeout applies only with --wait"},
		{args: []string{"scan", "demo", "--wait", "--timeout", "0s"}, want: "mcpsync scan: --timeout must be positive, got 0s"},
		{args: []string{"scan", "demo", "--wait", "--timeout", "-1m"}, want: "mcpsync scan: --timeout must be positive, got -1m0s"},
		{args: []string{"scan", "demo", "--wait=sure"}, want: `mcpsync scan: invalid boolean value "sure" for -wait: parse error {usage}`},

		// catalog
		{args: []string{"catalog"}, want: "mcpsync catalog: missing SOURCE {usage}"},
		{args: []string{"catalog", "demo", "extra"}, want: `mcpsync catalog: unexpected argument "extra" {usage}`},
		{args: []string{"catalog", "demo", "--purpose", "audit"}, want: `mcpsync catalog: --purpose must be display or integrity, not "audit"`},
		{args: []string{"catalog", "demo", "--consumer", ""}, want: "mcpsync catalog: --consumer must not be empty"},

		// watch
		{args: []string{"watch", "demo", "extra"}, want: `mcpsync watch: unexpected argument "extra" {usage}`},
		{args: []string{"watch", "--bogus"}, want: "mcpsync watch: flag provided but not defined: -bogus {usage}"},
		{args: []string{"watch", "--from-start=maybe"}, want: `mcpsync watch: invalid boolean value "maybe" for -from-start: parse error {usage}`},

		// gate (checked before mcpsync-gate starts a whole deployment)
		{args: []string{"gate", "extra"}, want: `mcpsync gate: unexpected argument "extra" {usage}`},
		{args: []string{"gate", "--bogus"}, want: "mcpsync gate: flag provided but not defined: -bogus {usage}"},
		{args: []string{"gate", "--shuffles", "-1"}, want: "mcpsync gate: --shuffles must not be negative, got -1"},
		{args: []string{"gate", "--resources", "0"}, want: "mcpsync gate: --resources must be positive, got 0"},
		{args: []string{"gate", "--revocations", "0"}, want: "mcpsync gate: --revocations must be positive, got 0"},
		{args: []string{"gate", "--storm-resources", "0"}, want: "mcpsync gate: --storm-resources must be positive, got 0"},
		{args: []string{"gate", "--storm-rounds", "0"}, want: "mcpsync gate: --storm-rounds must be positive, got 0"},
		{args: []string{"gate", "--json=yes"}, want: `mcpsync gate: invalid boolean value "yes" for -json: parse error {usage}`},

		// explain (its other rows are in explain_test.go; this one keeps every command covered)
		{args: []string{"explain", "demo"}, want: "mcpsync explain: missing URI {usage}"},
	}
	covered := map[string]int{}
	for _, tt := range tests {
		name := commandOf(tt.args)
		covered[name]++
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			want := tt.want
			if strings.Contains(want, "{usage}") {
				want = strings.ReplaceAll(want, "{usage}", "(usage: "+usageOf(t, name)+")")
			}
			_, errOut, code := run(t, tt.args...)
			if code != cli.ExitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, cli.ExitUsage, errOut)
			}
			line, ok := strings.CutSuffix(errOut, "\n")
			if !ok || strings.Contains(line, "\n") {
				t.Errorf("stderr %q is not exactly one line", errOut)
			}
			if tt.contains {
				if !strings.HasPrefix(line, want) {
					t.Errorf("stderr %q does not start with %q", line, want)
				}
				return
			}
			if diff := cmp.Diff(want, line); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}
	for _, name := range cli.Commands() {
		if covered[name] == 0 {
			t.Errorf("command %q has no bad-input row: add one", name)
		}
	}
	t.Logf("%d rows over %d commands", len(tests), len(cli.Commands()))
}

// Every command prints its usage and flags on stdout for --help and exits ExitOK, without a
// stack; `mcpsync help COMMAND` does the same.
func TestHelp(t *testing.T) {
	for _, name := range cli.Commands() {
		for _, args := range [][]string{append(strings.Fields(name), "--help"), append([]string{"help"}, strings.Fields(name)...)} {
			out, errOut, code := run(t, args...)
			if code != cli.ExitOK || errOut != "" || !strings.HasPrefix(out, "usage: mcpsync "+name) {
				t.Errorf("mcpsync %s: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", strings.Join(args, " "), code, out, errOut)
			}
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"help", "source"}, {"source", "--help"}, {"outbox", "-h"}} {
		out, errOut, code := run(t, args...)
		if code != cli.ExitOK || errOut != "" {
			t.Errorf("mcpsync %s: exit %d, stderr %q; want exit 0", strings.Join(args, " "), code, errOut)
		}
		for _, name := range cli.Commands() {
			if !strings.Contains(out, "  "+name+"  ") {
				t.Errorf("mcpsync %s does not list %q:\n%s", strings.Join(args, " "), name, out)
			}
		}
	}
}

// The exit-code table names each constant with its value (as exit.go declares them), and
// README.md's "Exit codes" table is the same table.
func TestExitCodeTable(t *testing.T) {
	type row struct {
		Code cli.ExitCode
		Name string
	}
	var table []row
	for _, r := range cli.ExitCodeTable() {
		table = append(table, row{r.Code, r.Name})
	}

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "exit.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []row
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "ExitCode" || len(vs.Values) != 1 {
				continue
			}
			lit, ok := vs.Values[0].(*ast.BasicLit)
			if !ok {
				t.Fatalf("%s: exit code %s is not a literal", fset.Position(vs.Pos()), vs.Names[0])
			}
			v, _ := constant.Int64Val(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
			declared = append(declared, row{cli.ExitCode(v), vs.Names[0].Name})
		}
	}
	if diff := cmp.Diff(declared, table); diff != "" {
		t.Errorf("exit-code table against exit.go's constants (-declared +table):\n%s", diff)
	}

	readme, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer readme.Close()
	re := regexp.MustCompile("^\\| *(\\d+) *\\| *`(Exit\\w+)` *\\|")
	var documented []row
	sc := bufio.NewScanner(readme)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[1])
			documented = append(documented, row{cli.ExitCode(n), m[2]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(table, documented); diff != "" {
		t.Errorf("README.md exit codes against the code's table (-code +README):\n%s", diff)
	}
}
