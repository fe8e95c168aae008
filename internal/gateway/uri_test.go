package gateway_test

import (
	"errors"
	"testing"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

func TestURIRoundTrip(t *testing.T) {
	for _, up := range []string{
		"demo://resource/static/document/a.md", "file:///tmp/a b.txt", "https://x.example/p?q=1#f",
		"test://static-text", "weird://%2F/ü/100%", "a",
	} {
		u := gateway.URI{Source: "docs", Upstream: up}
		got, err := gateway.ParseURI(u.String())
		if err != nil {
			t.Fatalf("ParseURI(%q): %v", u.String(), err)
		}
		if got != u {
			t.Errorf("round trip of %q: got %+v", up, got)
		}
	}
}

func TestParseURIRefuses(t *testing.T) {
	for _, s := range []string{
		"", "demo://x", "mcpsync://", "mcpsync:///x", "mcpsync://docs", "mcpsync://docs/",
		"mcpsync://docs/a/b", "mcpsync://docs/a?x=1", "mcpsync://docs/%zz", "mcpsync://d%20s/a",
	} {
		if _, err := gateway.ParseURI(s); !errors.Is(err, gateway.ErrBadURI) {
			t.Errorf("ParseURI(%q) = %v, want ErrBadURI", s, err)
		}
	}
}
