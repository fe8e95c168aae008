package redact_test

import (
	"testing"

	"github.com/mcpsync/mcpsync/internal/redact"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://example.com/mcp", "https://example.com/mcp"},
		{"https://user:hunter2@example.com/mcp", "https://user:***@example.com/mcp"},
		{"https://tok123@example.com/mcp", "https://***@example.com/mcp"},
		{"https://example.com/mcp?api_key=abc&x=1", "https://example.com/mcp?api_key=***&x=1"},
		{"https://example.com/mcp?access_token=abc", "https://example.com/mcp?access_token=***"},
		{"https://example.com/mcp?page=2", "https://example.com/mcp?page=2"},
		{"not a url user:pw@x", "not a url user:pw@x"},
		{"//user:pw@host", "//user:pw@host"},
		{"ftp://u:p@h", "ftp://u:***@h"},
	} {
		if got := redact.URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDSN(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://mcpsync:s3cret@127.0.0.1:5432/db", "postgres://mcpsync:***@127.0.0.1:5432/db"},
		{"cannot parse `postgresql://a:b@h/x`: bad", "cannot parse `postgresql://a:***@h/x`: bad"},
		{"host=h user=u password=s3cret dbname=d", "host=h user=u password=*** dbname=d"},
		{"host=h password='s3 cret' dbname=d", "host=h password=*** dbname=d"},
		{"postgres://u@h/db", "postgres://u@h/db"},
	} {
		if got := redact.DSN(tc.in); got != tc.want {
			t.Errorf("DSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestText(t *testing.T) {
	in := `session failed: Get "https://u:pw@h/mcp?token=t": 401; db postgres://a:b@h/d`
	want := `session failed: Get "https://u:***@h/mcp?token=***": 401; db postgres://a:***@h/d`
	if got := redact.Text(in); got != want {
		t.Errorf("Text:\n got %s\nwant %s", got, want)
	}
}
