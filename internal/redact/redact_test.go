package redact_test

import (
	"errors"
	"fmt"
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

func TestTextSecretShapes(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"bearer token", `401 for Bearer eyJhbGciOi.payload.sig`, `401 for Bearer ***`},
		{"bearer in quotes", `header "Bearer abcdefgh12345"`, `header "Bearer ***"`},
		{"challenge kept", `Bearer error="invalid_token", error_description="expired"`, `Bearer error="invalid_token", error_description="expired"`},
		{"challenge realm kept", `Bearer realm="mcp", resource_metadata="https://h/.well-known/x"`, `Bearer realm="mcp", resource_metadata="https://h/.well-known/x"`},
		{"short word kept", `no bearer token given`, `no bearer token given`},
		{"basic header", `Authorization: Basic dXNlcjpwYXNz`, `Authorization: Basic ***`},
		{"go header map", `map[Authorization:[Basic dXNlcjpwYXNz] Accept:[*/*]]`, `map[Authorization:[Basic ***] Accept:[*/*]]`},
		{"plain authorization words kept", `authorization: failed to refresh`, `authorization: failed to refresh`},
		{"json token", `{"access_token":"at-123","token_type":"Bearer","refresh_token": "rt-9"}`, `{"access_token":"***","token_type":"Bearer","refresh_token": "***"}`},
		{"escaped json token", `{"body":"{\"client_secret\":\"cs-1\"}"}`, `{"body":"{\"client_secret\":\"***\"}"}`},
		{"form", `grant_type=client_credentials&client_secret=cs-1&scope=a`, `grant_type=client_credentials&client_secret=***&scope=a`},
		{"other scheme userinfo", `dial redis://u:pw@h:6379/0 failed`, `dial redis://u:***@h:6379/0 failed`},
		{"url in escaped json", `{"error":"Get \"https://u:pw@h/mcp?api_key=k\": EOF"}`, `{"error":"Get \"https://u:***@h/mcp?api_key=***\": EOF"}`},
		{"dsn in escaped json", `{"error":"bad \"host=h password=pw dbname=d\""}`, `{"error":"bad \"host=h password=*** dbname=d\""}`},
		{"nothing secret", `session open protocol=2025-11-25 server=demo 1.0`, `session open protocol=2025-11-25 server=demo 1.0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := redact.Text(tc.in)
			if got != tc.want {
				t.Errorf("Text(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
			if again := redact.Text(got); again != got {
				t.Errorf("Text is not idempotent: %q → %q", got, again)
			}
		})
	}
}

func TestErr(t *testing.T) {
	if redact.Err(nil) != nil {
		t.Fatal("Err(nil) != nil")
	}
	base := errors.New(`Post "https://u:hunter2@h/mcp": 401`)
	err := redact.Err(fmt.Errorf("session: %w", base))
	if got, want := err.Error(), `session: Post "https://u:***@h/mcp": 401`; got != want {
		t.Errorf("Err: %q, want %q", got, want)
	}
	if !errors.Is(err, base) {
		t.Error("Err hides the original chain from errors.Is")
	}
}

func TestValue(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"API_TOKEN", "abc", "***"},
		{"LOG_LEVEL", "debug", "debug"},
		{"GITHUB_PAT_KEY", "", ""},
	} {
		if got := redact.Value(tc.name, tc.value); got != tc.want {
			t.Errorf("Value(%q, %q) = %q, want %q", tc.name, tc.value, got, tc.want)
		}
	}
}

func TestTextBearerPadding(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`Bearer dXNlcjpwYXNzd29yZA==`, `Bearer ***`},
		{`Bearer resource_metadata="https://h/x"`, `Bearer resource_metadata="https://h/x"`},
		{`Bearer resource_metadata=https://h/x`, `Bearer resource_metadata=https://h/x`},
		{`Bearer error_description="token expired"`, `Bearer error_description="token expired"`},
	} {
		if got := redact.Text(tc.in); got != tc.want {
			t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestTextBackquotedURL(t *testing.T) {
	in := "cannot parse `postgres://u:xxxxx@h/db`: bad; see `https://u:pw@h/x`"
	want := "cannot parse `postgres://u:***@h/db`: bad; see `https://u:***@h/x`"
	if got := redact.Text(in); got != want {
		t.Errorf("Text(%q) = %q, want %q", in, got, want)
	}
}

func TestArgs(t *testing.T) {
	in := []string{"npx", "server", "--api-key", "k123", "--token=t456", "--port", "8080", "--password", "--verbose",
		"https://u:pw@h/mcp", "--log-level=debug", "--no-auth", "serve.js"}
	want := []string{"npx", "server", "--api-key", "***", "--token=***", "--port", "8080", "--password", "--verbose",
		"https://u:***@h/mcp", "--log-level=debug", "--no-auth", "serve.js"}
	got := redact.Args(in)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
	if in[3] != "k123" {
		t.Error("Args changed its input")
	}
}
