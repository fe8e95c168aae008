package gate_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
)

// TestMainBadInput: bad flags, arguments and section names exit 2 with one line on stderr,
// nothing on stdout, before any deployment starts (no component log file is named).
func TestMainBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"extra"}, "usage: mcpsync gate"},
		{[]string{"--storm-rounds", "0"}, "usage: mcpsync gate"},
		{[]string{"--storm-resources", "-1"}, "usage: mcpsync gate"},
		{[]string{"--shuffles", "-1"}, "usage: mcpsync gate"},
		{[]string{"--only", "storm,nosuch"}, `unknown section "nosuch"`},
		{[]string{"--log-level", "loud", "--only", "storm"}, `log level "loud"`},
	} {
		var stdout, stderr bytes.Buffer
		code := gate.Main(tc.args, &stdout, &stderr)
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != 2 || stdout.Len() != 0 || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("Main(%q) = %d, stdout %q, stderr %q; want 2, nothing, one line with %q", tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}
