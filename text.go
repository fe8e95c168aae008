package mcpsync

import "unicode/utf8"

// CutAtRune returns the longest prefix of s that is at most n bytes long and does not end
// inside a UTF-8 sequence. It is the one place strings are cut to a byte bound; callers add
// their own marker ("…", a digest) after the cut.
func CutAtRune(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
