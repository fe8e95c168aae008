package uri_test

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/uri"
)

// The reference equivalence below is written independently of the package: it parses with the
// RFC 3986 Appendix B regular expression, turns every component into a list of atoms (a literal
// character, or an upper-case "%XX" for a percent-encoded byte that is not unreserved),
// case-folds the scheme and the host, and resolves dot segments with a segment stack instead of
// the RFC's string buffer. Two URIs are reference-equivalent when their atom lists match.

var (
	refScheme  = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.\-]*):`)
	refParts   = regexp.MustCompile(`^(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?$`)
	refPercent = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)
	refBadPct  = regexp.MustCompile(`%([^0-9A-Fa-f]|.[^0-9A-Fa-f]|.?$)`)
)

// refURI is the reference canonical form of a URI.
type refURI struct {
	scheme       string
	hasAuthority bool
	userinfo     string // including the "@", if any
	host         string
	port         string // including the ":", if any
	path         string
	query        string // including the "?", if any
	fragment     string // including the "#", if any
}

// refAtoms rewrites s so that unreserved percent-encodings become their character and every
// other percent-encoding is upper-case; with fold, literal characters are lower-cased too.
func refAtoms(s string, fold bool) string {
	var b strings.Builder
	last := 0
	for _, m := range refPercent.FindAllStringIndex(s, -1) {
		lit := s[last:m[0]]
		if fold {
			lit = strings.ToLower(lit)
		}
		b.WriteString(lit)
		v, _ := strconv.ParseUint(s[m[0]+1:m[1]], 16, 8)
		c := byte(v)
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("-._~", c) >= 0:
			if fold {
				c = byte(strings.ToLower(string(c))[0])
			}
			b.WriteByte(c)
		default:
			b.WriteString(strings.ToUpper(s[m[0]:m[1]]))
		}
		last = m[1]
	}
	lit := s[last:]
	if fold {
		lit = strings.ToLower(lit)
	}
	b.WriteString(lit)
	return b.String()
}

// refRemoveDots resolves "." and ".." segments of an absolute path with a stack of segments.
func refRemoveDots(p string) string {
	segs := strings.Split(p, "/")[1:]
	var out []string
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}

// refParse returns the reference form of s, or ok=false when the reference rejects s.
func refParse(s string) (refURI, bool) {
	for _, r := range []byte(s) {
		if r <= ' ' || r >= 0x7f {
			return refURI{}, false
		}
	}
	if refBadPct.MatchString(s) {
		return refURI{}, false
	}
	m := refScheme.FindStringSubmatch(s)
	if m == nil {
		return refURI{}, false
	}
	var u refURI
	u.scheme = strings.ToLower(m[1])
	p := refParts.FindStringSubmatch(s[len(m[0]):])
	if p == nil {
		panic("Appendix B regexp matches every string")
	}
	u.hasAuthority = p[1] != ""
	if u.hasAuthority {
		auth := p[2]
		if at := strings.LastIndex(auth, "@"); at >= 0 {
			u.userinfo = refAtoms(auth[:at+1], false)
			auth = auth[at+1:]
		}
		hostEnd := strings.Index(auth, ":")
		if strings.HasPrefix(auth, "[") && strings.Contains(auth, "]") {
			hostEnd = strings.Index(auth, "]") + 1
		}
		if hostEnd < 0 {
			hostEnd = len(auth)
		}
		u.host = refAtoms(auth[:hostEnd], true)
		u.port = refAtoms(auth[hostEnd:], false)
	}
	// After an authority the path is empty or absolute, so "absolute" covers both cases.
	u.path = refAtoms(p[3], false)
	if strings.HasPrefix(u.path, "/") {
		u.path = refRemoveDots(u.path)
	}
	if p[4] != "" {
		u.query = "?" + refAtoms(p[5], false)
	}
	if p[6] != "" {
		u.fragment = "#" + refAtoms(p[7], false)
	}
	return u, true
}

// countReservedEscapes counts percent-encodings of characters that are not unreserved.
func countReservedEscapes(s string) int {
	n := 0
	for _, m := range refPercent.FindAllString(s, -1) {
		v, _ := strconv.ParseUint(m[1:], 16, 8)
		c := byte(v)
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0) {
			n++
		}
	}
	return n
}

// mayHaveDotSegment reports whether s might contain a "." or ".." path segment (or encodes one).
func mayHaveDotSegment(s string) bool {
	d := strings.NewReplacer("%2E", ".", "%2e", ".").Replace(s)
	return strings.Contains(d, "/.") || strings.HasPrefix(d, ".")
}

const reservedChars = ":/?#[]@!$&'()*+,;="

var fuzzSeeds = []string{
	"file:///a/./b/../c",
	"HTTP://Example.COM/%7euser",
	"demo://x/a%2Fb",
	"demo://x/a%2fb",
	"demo://x/a/b",
	"urn:ISBN:0-486-27557-4",
	"mailto:John.Doe@Example.COM",
	"data:text/plain;charset=UTF-8,Hello%20World",
	"http://[::1]:8080/a/../b",
	"http://[FE80::1%25eth0]/",
	"http://User:Pass@Example.COM:80/p?q=%7E#F%2f",
	"demo:/a/..//x",
	"demo:/.//x",
	"demo:a/./b",
	"demo://x/%2E%2E/%2e/y",
	"demo://resource/static/document/architecture.md",
	"a://@@:/..?#",
	"x:%41%2f%3F%23",
	"http://h/p/q/../..",
	"s://[a:b]c:D/e",
	"demo://notes/1",
	"HTTP://%41:%42@%43:%44/%45?%46#%47",
}

// FuzzNormalize checks, for any input x:
//   - Normalize fails exactly when the reference rejects x, always with ErrMalformed;
//   - Normalize is idempotent;
//   - Normalize(x) is reference-equivalent to x, so two URIs that normalize equal are
//     reference-equivalent (never merged);
//   - no "%2F" (or any other reserved encoding) is decoded, and no "/" is invented;
//   - replacing one reserved character by its percent-encoding (outside dot-segment paths)
//     always changes the normal form.
func FuzzNormalize(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, x string, pick uint8) {
		n, err := uri.Normalize(x)
		if full, ferr := uri.NormalizeFull(x); full != n || (ferr == nil) != (err == nil) {
			t.Fatalf("Normalize(%q) = %q, %v; without its fast path %q, %v", x, n, err, full, ferr)
		}
		ref, refOK := refParse(x)
		if err != nil {
			if refOK {
				t.Fatalf("Normalize(%q) failed (%v) but the reference accepts it", x, err)
			}
			if !isMalformed(err) {
				t.Fatalf("Normalize(%q) error %v does not match ErrMalformed", x, err)
			}
			return
		}
		if !refOK {
			t.Fatalf("Normalize(%q) = %q but the reference rejects the input", x, n)
		}
		n2, err := uri.Normalize(n)
		if err != nil || n2 != n {
			t.Fatalf("not idempotent: Normalize(%q) = %q, Normalize(%q) = %q, %v", x, n, n, n2, err)
		}
		refN, ok := refParse(n)
		if !ok {
			t.Fatalf("reference rejects Normalize(%q) = %q", x, n)
		}
		if refN != ref {
			t.Fatalf("Normalize(%q) = %q changed the reference form:\n in: %+v\nout: %+v", x, n, ref, refN)
		}
		if strings.Count(n, "/") > strings.Count(x, "/") {
			t.Fatalf("Normalize(%q) = %q invented a '/'", x, n)
		}
		if !mayHaveDotSegment(x) && countReservedEscapes(n) != countReservedEscapes(x) {
			t.Fatalf("Normalize(%q) = %q changed the number of reserved percent-encodings", x, n)
		}

		// Encode one reserved character (chosen by pick) and check the normal form changes.
		if mayHaveDotSegment(x) {
			return
		}
		var positions []int
		for i := 0; i < len(x); i++ {
			if strings.IndexByte(reservedChars, x[i]) >= 0 {
				positions = append(positions, i)
			}
		}
		if len(positions) == 0 {
			return
		}
		i := positions[int(pick)%len(positions)]
		y := x[:i] + fmt.Sprintf("%%%02X", x[i]) + x[i+1:]
		ny, err := uri.Normalize(y)
		if err != nil {
			return // e.g. the scheme's ":" was encoded
		}
		if ny == n {
			t.Fatalf("%q and %q differ in a reserved character vs its encoding but both normalize to %q", x, y, n)
		}
		if uri.Equal(x, y) {
			t.Fatalf("Equal(%q, %q) = true", x, y)
		}
	})
}

func isMalformed(err error) bool {
	var ue *uri.Error
	return errors.Is(err, uri.ErrMalformed) && errors.As(err, &ue)
}

// TestReferenceSeeds runs the fuzz properties' building blocks on the seeds as plain tests, so
// that a broken reference is caught without fuzzing.
func TestReferenceSeeds(t *testing.T) {
	a, okA := refParse("demo://x/a%2Fb")
	b, okB := refParse("demo://x/a/b")
	if !okA || !okB || a == b {
		t.Fatalf("reference merges %%2F and /: %+v %+v", a, b)
	}
	c, _ := refParse("HTTP://Example.COM/%7euser")
	d, _ := refParse("http://example.com/~user")
	if c != d {
		t.Fatalf("reference does not fold case / decode ~: %+v %+v", c, d)
	}
	if _, ok := refParse("demo://x/%4"); ok {
		t.Fatalf("reference accepts a truncated percent-encoding")
	}
	for _, s := range fuzzSeeds {
		n, err := uri.Normalize(s)
		if err != nil {
			t.Fatalf("seed %q: %v", s, err)
		}
		r1, _ := refParse(s)
		r2, _ := refParse(n)
		if r1 != r2 {
			t.Errorf("seed %q: Normalize = %q changes the reference form", s, n)
		}
	}
}
