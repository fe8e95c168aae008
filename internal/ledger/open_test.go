package ledger_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Open's errors say why in one line with the password masked, and carry the kind the CLI and
// the worker answer differently: a URL that does not parse, a server that does not answer (pgx
// tries 127.0.0.1 twice under the default sslmode=prefer, with TLS and without: one line per
// attempt, the same text twice), a role the server refuses. A reachable database gives a pool.
func TestOpenSaysWhyOnOneLine(t *testing.T) {
	const secret = "s3cret-pw"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	u, err := url.Parse(pgtest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("no_such_role_open_test", secret)
	unknownRole := u.String()

	for _, tc := range []struct {
		name string
		url  string
		kind ledger.OpenErrorKind
		want []string
		once string // a text that must appear exactly once
	}{
		{"malformed", "postgres://u:" + secret + "@127.0.0.1:notaport/x", ledger.OpenMalformed, []string{"cannot parse"}, ""},
		{"unreachable", "postgres://u:" + secret + "@" + closed + "/x?connect_timeout=2", ledger.OpenUnreachable,
			[]string{"failed to connect", "connection refused"}, "connection refused"},
		{"unknown role", unknownRole, ledger.OpenAuth, []string{"no_such_role_open_test"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := ledger.Open(context.Background(), tc.url, 5*time.Second)
			if err == nil {
				pool.Close()
				t.Fatal("Open succeeded")
			}
			oe, ok := errors.AsType[*ledger.OpenError](err)
			if !ok {
				t.Fatalf("error %T %q is not an *ledger.OpenError", err, err)
			}
			msg := err.Error()
			if oe.Kind != tc.kind {
				t.Errorf("kind %d, want %d (%q)", oe.Kind, tc.kind, msg)
			}
			if strings.Contains(msg, "\n") || strings.Contains(msg, "\t") {
				t.Errorf("message spans lines: %q", msg)
			}
			if strings.Contains(msg, secret) {
				t.Errorf("message shows the password: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if tc.once != "" && strings.Count(msg, tc.once) != 1 {
				t.Errorf("message %q has %q %d times, want once", msg, tc.once, strings.Count(msg, tc.once))
			}
		})
	}

	pool, err := ledger.Open(context.Background(), pgtest.NewDB(t), 5*time.Second)
	if err != nil {
		t.Fatalf("Open of a reachable database: %v", err)
	}
	pool.Close()
}

func TestOneLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"failed to connect to `user=u database=x`:\n\ta (a): refused\n\ta (a): refused", "failed to connect to `user=u database=x`: a (a): refused"},
		{"failed:\n\ta: refused\n\tb: timeout\n", "failed: a: refused; b: timeout"},
		{"\n\tx\n\ty", "x; y"},
		{"two  spaces\there", "two spaces here"},
	} {
		if got := ledger.OneLine(tc.in); got != tc.want {
			t.Errorf("OneLine(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
