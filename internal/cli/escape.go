package cli

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// visible returns s with every character a terminal could act on written as a visible escape,
// so that a string a server chose (a resource name, a MIME type, a failure text, serverInfo)
// can never move the cursor, clear the screen, set the window title or break a table's rows
// when the CLI prints it as text. Escaped, in Go's notation: the C0 controls (\a \b \t \n \v
// \f \r by name, the others and ESC as \x1b), DEL (\x7f), the C1 controls U+0080-U+009F
// (\u009b), the bidirectional overrides and isolates U+202A-U+202E and U+2066-U+2069 (they
// reorder what follows), and each byte of invalid UTF-8 (\xNN: a raw 0x9B is CSI to an 8-bit
// terminal). Everything else, backslashes included, is kept as it is, so the ledger's own
// \u0000 and \xNN escapes (internal/ledger SafeText) show unchanged; the escape is for the
// eye, not reversible. JSON output needs none of this: encoding/json escapes control
// characters itself.
func visible(s string) string {
	i := strings.IndexFunc(s, needsEscape)
	if i < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !needsEscape(r):
			b.WriteString(s[i : i+size])
		case r < 0x80:
			b.WriteString(controlName(r))
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

// needsEscape reports whether visible escapes r.
func needsEscape(r rune) bool {
	switch {
	case r < ' ', r == 0x7f, 0x80 <= r && r < 0xa0:
		return true
	case 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069:
		return true
	}
	return false
}

// controlName spells an ASCII control character the way Go source would.
func controlName(r rune) string {
	switch r {
	case '\a':
		return `\a`
	case '\b':
		return `\b`
	case '\t':
		return `\t`
	case '\n':
		return `\n`
	case '\v':
		return `\v`
	case '\f':
		return `\f`
	case '\r':
		return `\r`
	}
	return fmt.Sprintf(`\x%02x`, r)
}
