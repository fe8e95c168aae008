package mcpsync_test

import (
	"testing"
	"unicode/utf8"

	"github.com/mcpsync/mcpsync"
)

func TestCutAtRune(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 10, "hello"},
		{"hello", 5, "hello"},
		{"hello", 3, "hel"},
		{"héllo", 2, "h"}, // é is 2 bytes: never cut inside it
		{"héllo", 3, "hé"},
		{"日本語", 4, "日"},
		{"日本語", 0, ""},
		{"abc", -1, ""},
	} {
		got := mcpsync.CutAtRune(tc.s, tc.n)
		if got != tc.want || !utf8.ValidString(got) || len(got) > max(tc.n, 0) {
			t.Errorf("CutAtRune(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}
