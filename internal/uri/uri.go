// Package uri normalizes resource URIs so that notifications can be matched to subscriptions.
//
// Normalization is RFC 3986 §6.2.2 syntax-based normalization and nothing more: it never
// applies scheme-specific rules (no default ports, no added or removed trailing slash), and it
// never decodes a percent-encoded reserved character, because a server may give "a%2Fb" and
// "a/b" different meanings. Two URIs with the same normalized form are equivalent under
// RFC 3986 §6.2.2; two URIs with different normalized forms may still be treated as the same
// resource by a particular server, which is why the server's original URI string, not the
// normalized one, is what a client sends back in requests.
package uri

import (
	"errors"
	"fmt"
	"strings"
)

// ErrMalformed is the sentinel every normalization error matches with [errors.Is].
var ErrMalformed = errors.New("malformed URI")

// Kind classifies why a URI was rejected.
type Kind int

// The reasons a URI is rejected.
const (
	// KindEmpty: the URI is the empty string.
	KindEmpty Kind = iota + 1
	// KindNoScheme: there is no ":" before the first "/", "?" or "#".
	KindNoScheme
	// KindBadScheme: the scheme is empty or not ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
	KindBadScheme
	// KindBadPercent: a "%" is not followed by two hexadecimal digits.
	KindBadPercent
	// KindBadChar: a control character, a space, DEL or a non-ASCII byte appears unencoded.
	KindBadChar
)

// String names the kind for messages and logs.
func (k Kind) String() string {
	switch k {
	case KindEmpty:
		return "empty"
	case KindNoScheme:
		return "no scheme"
	case KindBadScheme:
		return "invalid scheme"
	case KindBadPercent:
		return "invalid percent-encoding"
	case KindBadChar:
		return "invalid character"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// Error describes a URI that cannot be normalized. It matches [ErrMalformed] with errors.Is.
type Error struct {
	// URI is the rejected input, verbatim.
	URI string
	// Kind says why it was rejected.
	Kind Kind
	// Pos is the byte offset of the offending byte, or -1 when no single byte is at fault.
	Pos int
	// Detail is a human-readable description of the offending part.
	Detail string
}

// Error renders the kind, position and detail, quoting the input.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "uri %q: %s", e.URI, e.Kind)
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Pos >= 0 {
		fmt.Fprintf(&b, " at byte %d", e.Pos)
	}
	return b.String()
}

// Unwrap returns [ErrMalformed], so that errors.Is(err, ErrMalformed) holds for every *Error.
func (e *Error) Unwrap() error { return ErrMalformed }

// Normalize returns the RFC 3986 §6.2.2 syntax-based normal form of raw:
//   - the scheme and the host are lower-cased (userinfo, port, path, query and fragment keep
//     their case);
//   - hexadecimal digits of percent-encodings are upper-cased;
//   - percent-encoded unreserved characters (ALPHA / DIGIT / "-" / "." / "_" / "~") are decoded,
//     and no other percent-encoding is ever decoded ("%2F" stays "%2F");
//   - dot segments are removed (RFC 3986 §5.2.4) from paths that follow an authority or begin
//     with "/"; opaque paths ("urn:a:./b", "mailto:...", "data:...") are left alone. When no
//     authority is present and the result would begin with "//", it is prefixed with "/." so
//     that it cannot be re-read as an authority.
//
// Nothing else changes: no trailing slash is added or dropped, an empty port stays, characters
// that RFC 3986 does not allow but that are printable ASCII are kept as they are.
// Normalize is idempotent: Normalize(Normalize(x)) == Normalize(x).
//
// It returns an *[Error] (matching [ErrMalformed]) for an empty string, a missing or invalid
// scheme, a "%" not followed by two hex digits, and any unencoded control character, space,
// DEL or non-ASCII byte.
func Normalize(raw string) (string, error) {
	if alreadyNormal(raw) {
		return raw, nil // the common case, without a copy: a discovery round normalizes every URI it lists
	}
	return normalize(raw)
}

// alreadyNormal reports whether raw is certainly its own normal form, by one pass that decides
// only the simplest shape and leaves everything else to normalize: a lower-case scheme, "//",
// a host of lower-case letters, digits, "-", ".", "_" and "~" (no userinfo, no port), and a
// path of unreserved characters and "/" without a "." or ".." segment; no "%", no query, no
// fragment.
func alreadyNormal(raw string) bool {
	i := 0
	for ; i < len(raw) && raw[i] != ':'; i++ {
		c := raw[i]
		if !('a' <= c && c <= 'z' || i > 0 && (isDigit(c) || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	if i == 0 || !strings.HasPrefix(raw[i:], "://") {
		return false
	}
	i += 3
	for ; i < len(raw) && raw[i] != '/'; i++ {
		if c := raw[i]; !isUnreserved(c) || toLower(c) != c {
			return false
		}
	}
	// The path: each segment between "/"s (from the "/" after the host) must not be "." or "..".
	seg := i + 1
	for ; i <= len(raw); i++ {
		if i == len(raw) || raw[i] == '/' {
			if s := raw[min(seg, i):i]; s == "." || s == ".." {
				return false
			}
			seg = i + 1
			continue
		}
		if !isUnreserved(raw[i]) {
			return false
		}
	}
	return true
}

// normalize is Normalize without the fast path.
func normalize(raw string) (string, error) {
	if raw == "" {
		return "", &Error{URI: raw, Kind: KindEmpty, Pos: -1}
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c <= ' ' || c >= 0x7f {
			return "", &Error{URI: raw, Kind: KindBadChar, Pos: i, Detail: describeByte(c)}
		}
	}
	colon := strings.IndexAny(raw, ":/?#")
	if colon < 0 || raw[colon] != ':' {
		return "", &Error{URI: raw, Kind: KindNoScheme, Pos: -1}
	}
	scheme := raw[:colon]
	if err := checkScheme(raw, scheme); err != nil {
		return "", err
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '%' {
			continue
		}
		if i+2 >= len(raw) {
			return "", &Error{URI: raw, Kind: KindBadPercent, Pos: i, Detail: fmt.Sprintf("truncated %q", raw[i:])}
		}
		if !isHex(raw[i+1]) || !isHex(raw[i+2]) {
			return "", &Error{URI: raw, Kind: KindBadPercent, Pos: i, Detail: fmt.Sprintf("%q is not %%XX", raw[i:i+3])}
		}
	}

	rest := raw[colon+1:]
	var b strings.Builder
	b.Grow(len(raw))
	b.WriteString(strings.ToLower(scheme))
	b.WriteByte(':')

	hasAuthority := strings.HasPrefix(rest, "//")
	if hasAuthority {
		end := strings.IndexAny(rest[2:], "/?#")
		if end < 0 {
			end = len(rest)
		} else {
			end += 2
		}
		b.WriteString("//")
		writeAuthority(&b, rest[2:end])
		rest = rest[end:]
	}

	path, tail := rest, ""
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		path, tail = rest[:i], rest[i:]
	}
	path = normalizePercent(path, false)
	if hasAuthority || strings.HasPrefix(path, "/") {
		path = removeDotSegments(path)
		if !hasAuthority && strings.HasPrefix(path, "//") {
			path = "/." + path
		}
	}
	b.WriteString(path)
	b.WriteString(normalizePercent(tail, false))
	return b.String(), nil
}

// Equal reports whether a and b have the same normal form. A URI that cannot be normalized is
// equal only to the identical string.
func Equal(a, b string) bool {
	if a == b {
		return true
	}
	na, errA := Normalize(a)
	nb, errB := Normalize(b)
	return errA == nil && errB == nil && na == nb
}

func checkScheme(raw, scheme string) error {
	if scheme == "" {
		return &Error{URI: raw, Kind: KindBadScheme, Pos: 0, Detail: "empty scheme"}
	}
	for i := 0; i < len(scheme); i++ {
		c := scheme[i]
		ok := isAlpha(c) || (i > 0 && (isDigit(c) || c == '+' || c == '-' || c == '.'))
		if !ok {
			return &Error{URI: raw, Kind: KindBadScheme, Pos: i, Detail: fmt.Sprintf("character %q in scheme %q", c, scheme)}
		}
	}
	return nil
}

// writeAuthority writes userinfo@host:port with the host lower-cased and every part
// percent-normalized. The userinfo ends at the last "@"; the host is an IP literal up to its
// "]" or else ends at the first ":", and the remainder (the port) is not case-folded.
func writeAuthority(b *strings.Builder, auth string) {
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		b.WriteString(normalizePercent(auth[:at+1], false))
		auth = auth[at+1:]
	}
	host, port := auth, ""
	if strings.HasPrefix(auth, "[") {
		if end := strings.IndexByte(auth, ']'); end >= 0 {
			host, port = auth[:end+1], auth[end+1:]
		} else if i := strings.IndexByte(auth, ':'); i >= 0 {
			host, port = auth[:i], auth[i:]
		}
	} else if i := strings.IndexByte(auth, ':'); i >= 0 {
		host, port = auth[:i], auth[i:]
	}
	b.WriteString(normalizePercent(host, true))
	b.WriteString(normalizePercent(port, false))
}

// normalizePercent upper-cases the hex digits of every percent-encoding, decodes those that
// encode unreserved characters, and, when lower is set, lower-cases every other character
// (including decoded letters). The input's percent-encodings must already be valid.
func normalizePercent(s string, lower bool) string {
	if !strings.ContainsRune(s, '%') && !(lower && hasUpper(s)) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' {
			v := unhex(s[i+1])<<4 | unhex(s[i+2])
			i += 2
			if isUnreserved(v) {
				if lower {
					v = toLower(v)
				}
				b.WriteByte(v)
				continue
			}
			b.WriteByte('%')
			b.WriteByte(upperHex[v>>4])
			b.WriteByte(upperHex[v&0xf])
			continue
		}
		if lower {
			c = toLower(c)
		}
		b.WriteByte(c)
	}
	return b.String()
}

// removeDotSegments is RFC 3986 §5.2.4 applied to a path whose percent-encodings are
// already normalized (so "%2E" has become ".").
func removeDotSegments(in string) string {
	if !strings.Contains(in, ".") {
		return in
	}
	var out []byte
	for len(in) > 0 {
		switch {
		case strings.HasPrefix(in, "../"):
			in = in[3:]
		case strings.HasPrefix(in, "./"):
			in = in[2:]
		case strings.HasPrefix(in, "/./"):
			in = in[2:]
		case in == "/.":
			in = "/"
		case strings.HasPrefix(in, "/../"):
			in = in[3:]
			out = dropLastSegment(out)
		case in == "/..":
			in = "/"
			out = dropLastSegment(out)
		case in == "." || in == "..":
			in = ""
		default:
			// Move the first segment, with its leading "/" if any, to the output.
			start := 0
			if in[0] == '/' {
				start = 1
			}
			end := strings.IndexByte(in[start:], '/')
			if end < 0 {
				end = len(in)
			} else {
				end += start
			}
			out = append(out, in[:end]...)
			in = in[end:]
		}
	}
	return string(out)
}

// dropLastSegment removes the last segment and its preceding "/" (if any) from out.
func dropLastSegment(out []byte) []byte {
	i := len(out) - 1
	for i >= 0 && out[i] != '/' {
		i--
	}
	if i < 0 {
		return out[:0]
	}
	return out[:i]
}

const upperHex = "0123456789ABCDEF"

func describeByte(c byte) string {
	switch {
	case c == ' ':
		return "unencoded space"
	case c < ' ' || c == 0x7f:
		return fmt.Sprintf("control character U+%04X", c)
	default:
		return fmt.Sprintf("non-ASCII byte 0x%02X", c)
	}
}

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func isUnreserved(c byte) bool {
	return isAlpha(c) || isDigit(c) || c == '-' || c == '.' || c == '_' || c == '~'
}

func unhex(c byte) byte {
	switch {
	case isDigit(c):
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

func toLower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}
