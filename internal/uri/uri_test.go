package uri_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/uri"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"dot segments under empty authority", "file:///a/./b/../c", "file:///a/c"},
		{"scheme host case and unreserved tilde", "HTTP://Example.COM/%7euser", "http://example.com/~user"},
		{"encoded slash keeps its encoding", "demo://x/a%2fb", "demo://x/a%2Fb"},
		{"encoded slash stays distinct from slash", "demo://x/a%2Fb", "demo://x/a%2Fb"},
		{"plain slash", "demo://x/a/b", "demo://x/a/b"},
		{"reserved encodings are never decoded", "demo://x/%3f%23%5b%5d%40%21%24%26%27%28%29%2a%2b%2c%3b%3d%3a",
			"demo://x/%3F%23%5B%5D%40%21%24%26%27%28%29%2A%2B%2C%3B%3D%3A"},
		{"unreserved encodings are decoded", "demo://x/%41%7A%30%2D%2E%5F%7E", "demo://x/Az0-._~"},
		{"encoded letters in host are lower-cased", "demo://%45X%41mple/%45", "demo://example/E"},
		{"non-ASCII encodings keep upper-case hex", "demo://x/caf%c3%a9", "demo://x/caf%C3%A9"},
		{"encoded percent stays", "demo://x/100%25", "demo://x/100%25"},
		{"opaque urn keeps case after scheme", "URN:ISBN:0-486-27557-4", "urn:ISBN:0-486-27557-4"},
		{"opaque urn dot segments untouched", "urn:a:./b/../c", "urn:a:./b/../c"},
		{"mailto is opaque", "MAILTO:John.Doe@Example.COM", "mailto:John.Doe@Example.COM"},
		{"data URI", "DATA:text/plain;charset=UTF-8,Hello%20W%6Frld%2c", "data:text/plain;charset=UTF-8,Hello%20World%2C"},
		{"data URI base64", "data:image/png;base64,iVBORw0KGgo=", "data:image/png;base64,iVBORw0KGgo="},
		{"IPv6 host lower-cased", "HTTP://[FE80::1AB]:8080/P", "http://[fe80::1ab]:8080/P"},
		{"IPv6 loopback", "http://[::1]/a/../b", "http://[::1]/b"},
		{"IPv6 zone keeps encoded percent", "http://[FE80::1%25ETH0]/", "http://[fe80::1%25eth0]/"},
		{"userinfo case preserved", "HTTP://User:PassWord@Example.COM:8080/", "http://User:PassWord@example.com:8080/"},
		{"userinfo unreserved decoded", "http://%55ser@h/", "http://User@h/"},
		{"last at sign ends userinfo", "http://a@B@HOST/", "http://a@B@host/"},
		{"port untouched", "http://h:0080/", "http://h:0080/"},
		{"empty port untouched", "http://h:/", "http://h:/"},
		{"no trailing slash added", "HTTP://Example.COM", "http://example.com"},
		{"trailing slash kept", "http://example.com/a/", "http://example.com/a/"},
		{"no trailing slash on path", "http://example.com/a", "http://example.com/a"},
		{"dot segments to root", "http://h/a/b/../../..", "http://h/"},
		{"trailing dot segment keeps slash", "http://h/a/b/..", "http://h/a/"},
		{"trailing single dot", "http://h/a/.", "http://h/a/"},
		{"RFC 5.4.1 example", "http://a/b/c/./../../g", "http://a/g"},
		{"RFC 5.2.4 example", "http://a/mid/content=5/../6", "http://a/mid/6"},
		{"encoded dots are dot segments", "http://h/a/%2E%2e/b", "http://h/b"},
		{"dot-like segments stay", "http://h/a/.../..b/b../", "http://h/a/.../..b/b../"},
		{"double slash kept", "http://h/a//b", "http://h/a//b"},
		{"query untouched apart from encoding", "http://h/p?A=%7e&b=%2f&c=./../", "http://h/p?A=~&b=%2F&c=./../"},
		{"fragment untouched apart from encoding", "http://h/p#Frag/../%61", "http://h/p#Frag/../a"},
		{"dot segments in absolute path without authority", "demo:/a/./b/../c", "demo:/a/c"},
		{"rootless path untouched", "demo:a/./b/../c", "demo:a/./b/../c"},
		{"path that would look like authority", "demo:/.//x", "demo:/.//x"},
		{"path collapsing to double slash", "demo:/a/..//x", "demo:/.//x"},
		{"scheme only", "DeMo:", "demo:"},
		{"scheme with plus dot dash", "Coap+TCP.x-y://H/", "coap+tcp.x-y://h/"},
		{"empty authority and path", "demo://", "demo://"},
		{"printable but not RFC-allowed kept", "demo://x/{a}|b^`\"<>\\", "demo://x/{a}|b^`\"<>\\"},
		{"mcp style resource", "demo://resource/static/document/architecture.md", "demo://resource/static/document/architecture.md"},
		{"query before path-like text", "demo:?a/../b", "demo:?a/../b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := uri.Normalize(tt.in)
			if err != nil {
				t.Fatalf("Normalize(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("Normalize(%q) = %q, want %q", tt.in, got, tt.want)
			}
			again, err := uri.Normalize(got)
			if err != nil || again != got {
				t.Errorf("Normalize(%q) = %q, %v; want it unchanged (idempotence)", got, again, err)
			}
		})
	}
}

func TestNormalizeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uri.Error
	}{
		{"empty", "", uri.Error{Kind: uri.KindEmpty, Pos: -1}},
		{"no colon", "example.com/a", uri.Error{Kind: uri.KindNoScheme, Pos: -1}},
		{"slash before colon", "/a:b", uri.Error{Kind: uri.KindNoScheme, Pos: -1}},
		{"query before colon", "a?b:c", uri.Error{Kind: uri.KindNoScheme, Pos: -1}},
		{"empty scheme", ":x", uri.Error{Kind: uri.KindBadScheme, Pos: 0, Detail: "empty scheme"}},
		{"digit first", "1demo:x", uri.Error{Kind: uri.KindBadScheme, Pos: 0, Detail: `character '1' in scheme "1demo"`}},
		{"underscore in scheme", "de_mo:x", uri.Error{Kind: uri.KindBadScheme, Pos: 2, Detail: `character '_' in scheme "de_mo"`}},
		{"percent in scheme", "d%41:x", uri.Error{Kind: uri.KindBadScheme, Pos: 1, Detail: `character '%' in scheme "d%41"`}},
		{"truncated percent at end", "demo://x/a%4", uri.Error{Kind: uri.KindBadPercent, Pos: 10, Detail: `truncated "%4"`}},
		{"lone percent", "demo://x/%", uri.Error{Kind: uri.KindBadPercent, Pos: 9, Detail: `truncated "%"`}},
		{"non-hex percent", "demo://x/%zz/", uri.Error{Kind: uri.KindBadPercent, Pos: 9, Detail: `"%zz" is not %XX`}},
		{"half-hex percent", "demo://x/%4g", uri.Error{Kind: uri.KindBadPercent, Pos: 9, Detail: `"%4g" is not %XX`}},
		{"space", "demo://x/a b", uri.Error{Kind: uri.KindBadChar, Pos: 10, Detail: "unencoded space"}},
		{"tab", "demo://x/\t", uri.Error{Kind: uri.KindBadChar, Pos: 9, Detail: "control character U+0009"}},
		{"newline", "demo://x/\n", uri.Error{Kind: uri.KindBadChar, Pos: 9, Detail: "control character U+000A"}},
		{"NUL", "demo\x00://x", uri.Error{Kind: uri.KindBadChar, Pos: 4, Detail: "control character U+0000"}},
		{"DEL", "demo://x/\x7f", uri.Error{Kind: uri.KindBadChar, Pos: 9, Detail: "control character U+007F"}},
		{"non-ASCII", "demo://x/café", uri.Error{Kind: uri.KindBadChar, Pos: 12, Detail: "non-ASCII byte 0xC3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := uri.Normalize(tt.in)
			if err == nil {
				t.Fatalf("Normalize(%q) = %q, want error", tt.in, got)
			}
			if !errors.Is(err, uri.ErrMalformed) {
				t.Errorf("errors.Is(%v, ErrMalformed) = false", err)
			}
			var ue *uri.Error
			if !errors.As(err, &ue) {
				t.Fatalf("error %T is not *uri.Error", err)
			}
			want := tt.want
			want.URI = tt.in
			if diff := cmp.Diff(&want, ue); diff != "" {
				t.Errorf("Normalize(%q) error mismatch (-want +got):\n%s", tt.in, diff)
			}
			if ue.Error() == "" {
				t.Errorf("empty error message")
			}
		})
	}
}

func TestErrorMessage(t *testing.T) {
	_, err := uri.Normalize("demo://x/a b")
	want := `uri "demo://x/a b": invalid character: unencoded space at byte 10`
	if err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
}

func TestEqual(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"HTTP://Example.COM/%7euser", "http://example.com/~user", true},
		{"demo://x/a%2Fb", "demo://x/a/b", false},
		{"demo://x/a%2fb", "demo://x/a%2Fb", true},
		{"demo://x/a?b", "demo://x/a%3Fb", false},
		{"demo://x/a#b", "demo://x/a%23b", false},
		{"demo://x/A", "demo://x/a", false},
		{"urn:ISBN:1", "urn:isbn:1", false},
		{"URN:isbn:1", "urn:isbn:1", true},
		{"file:///a/./b/../c", "file:///a/c", true},
		{"demo://x/a b", "demo://x/a b", true},
		{"demo://x/a b", "demo://x/a%20b", false},
		{"not a uri", "NOT A URI", false},
	}
	for _, tt := range tests {
		if got := uri.Equal(tt.a, tt.b); got != tt.want {
			t.Errorf("Equal(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := uri.Equal(tt.b, tt.a); got != tt.want {
			t.Errorf("Equal(%q, %q) = %v, want %v (symmetry)", tt.b, tt.a, got, tt.want)
		}
	}
}

// Normalize's fast path (a URI already in normal form is returned as it is) gives what the
// full normalization gives, for URIs built from the characters where the two could differ:
// cases, dots and dot segments, empty segments, percent signs, ports, userinfo, queries.
func TestNormalizeFastPathAgreesWithFull(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 11))
	parts := []string{"a", "Z", "0", "-", ".", "..", "/", "//", "_", "~", "%2e", "%41", ":", "@", "?", "#", "+", "!"}
	schemes := []string{"demo", "Demo", "a+b", "x.y", "1x", "", "file"}
	fast := 0
	for range 200000 {
		var b strings.Builder
		b.WriteString(schemes[rng.IntN(len(schemes))])
		b.WriteString([]string{"://", ":", ":/", "//"}[rng.IntN(4)])
		for range rng.IntN(10) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		x := b.String()
		got, err := uri.Normalize(x)
		want, werr := uri.NormalizeFull(x)
		if got != want || (err == nil) != (werr == nil) {
			t.Fatalf("Normalize(%q) = %q, %v; full normalization %q, %v", x, got, err, want, werr)
		}
		if uri.AlreadyNormal(x) {
			fast++
			if werr != nil || want != x {
				t.Fatalf("fast path taken for %q, whose normal form is %q, %v", x, want, werr)
			}
		}
	}
	if fast < 1000 {
		t.Errorf("only %d of 200000 URIs took the fast path: the test exercises too little of it", fast)
	}
}
