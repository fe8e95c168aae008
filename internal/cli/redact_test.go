package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

// runWithDB runs mcpsync with args against the ledger at dbURL and no Temporal.
func runWithDB(t *testing.T, dbURL string, args ...string) (stdout, stderr string, code cli.ExitCode) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Config: config.Env{
		TemporalAddress: closedAddr(t), Namespace: "default", DatabaseURL: dbURL,
	}}, args)
	return out.String(), errb.String(), code
}

// The password of DATABASE_URL never appears in what the CLI prints when the URL is
// malformed or the database cannot be reached (issue 14 item 3), in URL and key=value form.
func TestDatabaseURLPasswordMasked(t *testing.T) {
	const pw = "hunter2pw"
	addr := closedAddr(t)
	host, port, _ := strings.Cut(addr, ":")
	for _, tc := range []struct {
		name, dsn string
		code      cli.ExitCode
	}{
		{"malformed url", "postgres://mcpsync:" + pw + "@127.0.0.1:notaport/mcpsync", cli.ExitUsage},
		{"malformed url with spaces", "postgres://mcpsync:" + pw + " x@127.0.0.1/mcpsync", cli.ExitUsage},
		{"malformed key=value", "host=127.0.0.1 user=mcpsync password=" + pw + " connect_timeout=x", cli.ExitUsage},
		{"malformed quoted key=value", "host=127.0.0.1 password='" + pw + " x' connect_timeout=x", cli.ExitUsage},
		{"malformed pool setting", "postgres://mcpsync:" + pw + "@127.0.0.1/mcpsync?pool_max_conns=x", cli.ExitUsage},
		{"unreachable url", "postgres://mcpsync:" + pw + "@" + addr + "/mcpsync?sslmode=disable&connect_timeout=2", cli.ExitFailure},
		{"unreachable key=value", "host=" + host + " port=" + port + " user=mcpsync password=" + pw + " sslmode=disable connect_timeout=2", cli.ExitFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runWithDB(t, tc.dsn, "source", "list")
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if strings.Contains(out+errOut, pw) {
				t.Errorf("the password is printed: stdout %q stderr %q", out, errOut)
			}
			if lines := strings.Count(strings.TrimSpace(errOut), "\n") + 1; errOut == "" || lines != 1 {
				t.Errorf("want one line on stderr, got %q", errOut)
			}
		})
	}
}

// Sources stored before URLs with credentials were refused may still hold them: `source
// list` masks them in both formats (issue 14 item 3). The row is inserted with SQL, as an
// older mcpsync would have stored it.
func TestSourceListRedactsStoredCredentials(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const stored = "https://alice:hunter2pw@mcp.example/mcp?api_key=k3yvalue&page=2&access_token=t0kenvalue"
	if _, err := conn.Exec(ctx, `INSERT INTO sources (name, transport, url) VALUES ('legacy', 'http', $1)`, stored); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"source", "list"}, {"source", "list", "--json"}} {
		out, errOut, code := runWithDB(t, dbURL, args...)
		if code != cli.ExitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		for _, secret := range []string{"hunter2pw", "k3yvalue", "t0kenvalue"} {
			if strings.Contains(out, secret) {
				t.Errorf("%v shows %q:\n%s", args, secret, out)
			}
		}
		for _, want := range []string{"legacy", "mcp.example/mcp", "api_key=***", "page=2", "access_token=***", "alice:***@"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: output lacks %q:\n%s", args, want, out)
			}
		}
	}
}
