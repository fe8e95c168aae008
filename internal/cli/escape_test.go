package cli_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// terminalHostile are strings a hostile server can send that a terminal would act on: set the
// window title, clear the screen, return the cursor, or start a C1 control sequence.
var terminalHostile = []struct{ in, want string }{
	{"\x1b]0;pwned\x07", `\x1b]0;pwned\a`},
	{"\x1b[2J", `\x1b[2J`},
	{"\r", `\r`},
	{"\u009b31m", `\u009b31m`},
	{"a\nb\tc", `a\nb\tc`},
	{"\x00\x7f\x01", `\x00\x7f\x01`},
	{"raw C1 byte \x9b", `raw C1 byte \x9b`},
	{"\u202eevil\u2066", `\u202eevil\u2066`},
	{`stored \u0000 escape`, `stored \u0000 escape`},
	{"ünïcode ✓ and spaces", "ünïcode ✓ and spaces"},
	{"", ""},
}

func TestVisible(t *testing.T) {
	for _, tc := range terminalHostile {
		if got := cli.Visible(tc.in); got != tc.want {
			t.Errorf("Visible(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The catalog's text table neutralises every control sequence a server put into an entry.
func TestCatalogTableNeutralisesControls(t *testing.T) {
	var entries []ledger.ScanEntry
	for _, tc := range terminalHostile {
		entries = append(entries, ledger.ScanEntry{Kind: ledger.EntryResource, URI: "demo://x", ServerURI: "demo://x" + tc.in, Name: tc.in, MIMEType: "text/" + tc.in})
	}
	var out bytes.Buffer
	if err := cli.WriteCatalogEntries(&out, entries); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(entries)+1 {
		t.Errorf("%d lines for %d entries and a header:\n%s", len(lines), len(entries), out.String())
	}
	for _, r := range out.String() {
		if r != '\n' && (r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u202e' || r == '\u2066') {
			t.Fatalf("catalog table carries control %U:\n%q", r, out.String())
		}
	}
	for _, tc := range terminalHostile[:4] {
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("catalog table does not show %q as %q:\n%s", tc.in, tc.want, out.String())
		}
	}
}
