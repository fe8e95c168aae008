package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mcpsync/mcpsync/internal/cli"
)

// mcpsync gate passes mcpsync-gate's output and exit code through. When mcpsync-gate refuses
// its input (exit 2: an unknown --only section, which only it knows) it has said why in one
// line, and mcpsync adds nothing: no gate ran, so none "did not pass". A gate that ran and
// failed (exit 1) is said to have failed. (A stand-in mcpsync-gate on PATH; the real one's
// own refusals are tested in internal/harness/gate.)
func TestGatePassesItsExitThrough(t *testing.T) {
	dir := t.TempDir()
	script := `#!/bin/sh
case "$2" in
nope) echo 'mcpsync gate: unknown section "nope" (have shuffles, discovery)' >&2; exit 2 ;;
*) echo 'R26  shuffles  FAIL'; exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "mcpsync-gate"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, tc := range []struct {
		only           string
		code           cli.ExitCode
		stdout, stderr string
	}{
		{"nope", cli.ExitUsage, "", "mcpsync gate: unknown section \"nope\" (have shuffles, discovery)\n"},
		{"shuffles", cli.ExitFailure, "R26  shuffles  FAIL\n", "mcpsync gate: the release gate did not pass (exit 1)\n"},
	} {
		out, errOut, code := run(t, "gate", "--only", tc.only)
		if code != tc.code || out != tc.stdout || errOut != tc.stderr {
			t.Errorf("gate --only %s: exit %d, stdout %q, stderr %q; want exit %d, %q, %q", tc.only, code, out, errOut, tc.code, tc.stdout, tc.stderr)
		}
	}
}
