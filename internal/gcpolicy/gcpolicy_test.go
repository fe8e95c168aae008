package gcpolicy_test

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/gcpolicy"
)

// Apply gives the process gcpolicy.Percent when the environment sets no GOGC, and leaves what
// the environment set (the runtime applied it at start) otherwise; Current reads it back.
func TestApply(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	for _, tc := range []struct {
		name    string
		env     *string // GOGC; nil: unset
		running int     // the target in force before Apply (what the runtime took from GOGC)
		want    gcpolicy.Setting
		str     string
	}{
		{"unset", nil, 100, gcpolicy.Setting{Percent: gcpolicy.Percent}, "200 (mcpsync default)"},
		{"set", ptr("50"), 50, gcpolicy.Setting{Percent: 50, FromEnv: true}, "50 (GOGC)"},
		{"set to 100", ptr("100"), 100, gcpolicy.Setting{Percent: 100, FromEnv: true}, "100 (GOGC)"},
		{"off", ptr("off"), -1, gcpolicy.Setting{Percent: -1, FromEnv: true}, "off (GOGC)"},
		// The runtime reads an empty GOGC as 100: still the environment's choice.
		{"empty", ptr(""), 100, gcpolicy.Setting{Percent: 100, FromEnv: true}, "100 (GOGC)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env == nil {
				t.Setenv("GOGC", "")
				os.Unsetenv("GOGC")
			} else {
				t.Setenv("GOGC", *tc.env)
			}
			debug.SetGCPercent(tc.running)
			got := gcpolicy.Apply()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Apply (-want +got):\n%s", diff)
			}
			if cur := gcpolicy.Current(); cur != tc.want.Percent {
				t.Errorf("in force after Apply: %d, want %d", cur, tc.want.Percent)
			}
			if got.String() != tc.str {
				t.Errorf("String() = %q, want %q", got.String(), tc.str)
			}
		})
	}
}

func ptr(s string) *string { return &s }
