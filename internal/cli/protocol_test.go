package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// TestSourceCheckProtocol: `source check --protocol` (issue 13 item 1) negotiates as a worker
// would: auto speaks the newest era both sides speak (2026-07-28 with a server of both eras,
// 2025-11-25 with a legacy one), a pin is honoured, a pin the server does not speak is one clear line and exit 1, and a bad value is a usage error.
func TestSourceCheckProtocol(t *testing.T) {
	both := chaosmcp.New(chaosmcp.Options{ProtocolVersions: chaosmcp.AllProtocolVersions})
	t.Cleanup(func() { _ = both.Close() })
	both.Set("demo://a", "a", "text/plain")
	bothHTTP, err := both.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bothHTTP.Close() })
	legacy := chaosmcp.New(chaosmcp.Options{})
	t.Cleanup(func() { _ = legacy.Close() })
	legacy.Set("demo://a", "a", "text/plain")
	legacyHTTP, err := legacy.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = legacyHTTP.Close() })

	for _, tc := range []struct {
		name      string
		args      []string
		wantCode  cli.ExitCode
		wantEra   string // the negotiated protocolVersion on success
		wantError string // a substring of the one error line otherwise
	}{
		{"default is auto", []string{"--url", bothHTTP.URL}, cli.ExitOK, "2026-07-28", ""},
		{"auto", []string{"--url", bothHTTP.URL, "--protocol", "auto"}, cli.ExitOK, "2026-07-28", ""},
		{"auto with a legacy-only server", []string{"--url", legacyHTTP.URL}, cli.ExitOK, "2025-11-25", ""},
		{"pinned 2026-07-28", []string{"--url", bothHTTP.URL, "--protocol", "2026-07-28"}, cli.ExitOK, "2026-07-28", ""},
		{"pinned 2025-11-25", []string{"--url", bothHTTP.URL, "--protocol", "2025-11-25"}, cli.ExitOK, "2025-11-25", ""},
		{"pin not spoken", []string{"--url", legacyHTTP.URL, "--protocol", "2026-07-28"}, cli.ExitFailure, "",
			"the source pins MCP 2026-07-28 (--protocol) but the server negotiated 2025-11-25: it does not speak 2026-07-28"},
		{"bad value", []string{"--url", legacyHTTP.URL, "--protocol", "2024"}, cli.ExitUsage, "",
			`mcpsync source check: --protocol must be auto, 2025-11-25 or 2026-07-28, got "2024"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := checkRun(t, append(tc.args, "--json")...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.wantCode, errOut)
			}
			if tc.wantCode != cli.ExitOK {
				if lines := strings.Count(strings.TrimSpace(errOut), "\n") + 1; lines != 1 || !strings.Contains(errOut, tc.wantError) {
					t.Errorf("stderr %q (%d lines), want one line containing %q", errOut, lines, tc.wantError)
				}
				return
			}
			var got checkJSON
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("stdout %q: %v", out, err)
			}
			if got.ProtocolVersion != tc.wantEra || got.ResourceCount != 1 {
				t.Errorf("receipt %+v, want era %s and 1 resource", got, tc.wantEra)
			}
		})
	}
}

// TestSourceProtocolKeptAndShown: --protocol is stored on source add, kept by a source update
// that does not give it, changed by one that does (auto is stored as the default), and shown
// by source show.
func TestSourceProtocolKeptAndShown(t *testing.T) {
	st := ledger.New(pgtest.NewPool(t))
	ctx := context.Background()
	if _, errOut, code := runOn(t, st, nil, "source", "add", "a", "--url", "http://a.example/mcp", "--protocol", "2026-07-28"); code != 0 {
		t.Fatalf("add: exit %d %s", code, errOut)
	}
	var got []string
	step := func(args ...string) {
		t.Helper()
		if len(args) > 0 {
			if _, errOut, code := runOn(t, st, nil, append([]string{"source", "update", "a"}, args...)...); code != 0 {
				t.Fatalf("update %v: exit %d %s", args, code, errOut)
			}
		}
		src, err := st.SourceByName(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, src.Connection.EffectiveProtocol())
	}
	step()
	step("--poll", "3s")
	out, errOut, code := runOn(t, st, nil, "source", "show", "a")
	if code != 0 || !strings.Contains(out, "2026-07-28") {
		t.Errorf("source show: exit %d, %q %q; want the protocol 2026-07-28 shown", code, out, errOut)
	}
	step("--protocol", "2025-11-25")
	step("--protocol", "auto")
	if diff := cmp.Diff([]string{"2026-07-28", "2026-07-28", "2025-11-25", "auto"}, got); diff != "" {
		t.Errorf("stored protocol after each step (-want +got):\n%s", diff)
	}
}
