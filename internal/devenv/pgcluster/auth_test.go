package pgcluster_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
)

// connectErr connects to rawURL with its userinfo replaced by user[:password] (no password
// when pw is nil) and returns the error, nil if the connection was accepted.
func connectErr(t *testing.T, rawURL string, pw *string) error {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	if pw == nil {
		u.User = url.User(pgcluster.Superuser)
	} else {
		u.User = url.UserPassword(pgcluster.Superuser, *pw)
	}
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, u.String())
	if err == nil {
		conn.Close(ctx)
	}
	return err
}

// refused reports whether err is PostgreSQL refusing the password (invalid_password).
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "28P01"
}

// The dev cluster (a cluster with Options.Password) authenticates TCP connections with
// scram-sha-256 and trusts nobody (issue 14 item 3): without the password, or with an old
// one, the connection is refused. A cluster made with trust is converted on its next start
// with a password, and each start may rotate the password; data is kept throughout.
func TestDevClusterRequiresPassword(t *testing.T) {
	dir := filepath.Join(worldTraversableDir(t), "pg")
	opts := pgcluster.Options{DataDir: dir, Logger: testLogger(t), NoFsync: true}

	// First start: a trust cluster, as an older mcpsync-dev made it.
	c, err := pgcluster.Start(testContext(t), opts)
	if err != nil {
		t.Fatalf("Start (trust): %v", err)
	}
	t.Cleanup(func() {
		<-c.Done()
		if err := c.RemoveData(); err != nil {
			t.Errorf("RemoveData: %v", err)
		}
	})
	if err := connectErr(t, c.URL(), nil); err != nil {
		t.Fatalf("trust cluster refused a connection without password: %v", err)
	}
	exec(t, c.URL(), `CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)`)
	restart := func(password string) {
		t.Helper()
		if err := c.Stop(context.Background()); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		opts.Port, opts.Password = c.Port(), password
		if c, err = pgcluster.Start(testContext(t), opts); err != nil {
			t.Fatalf("Start: %v", err)
		}
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	pw1, err := pgcluster.NewPassword()
	if err != nil {
		t.Fatal(err)
	}
	restart(pw1)
	if !strings.Contains(c.URL(), ":"+pw1+"@") || !strings.Contains(c.AdminURL(), ":"+pw1+"@") {
		t.Errorf("URL %q / AdminURL %q do not carry the password", c.URL(), c.AdminURL())
	}
	if got := queryInt(t, c.URL(), `SELECT x FROM kept`); got != 7 {
		t.Errorf("kept.x = %d after conversion, want 7", got)
	}
	wrong := "not-the-password"
	for name, pw := range map[string]*string{"no password": nil, "wrong password": &wrong} {
		if err := connectErr(t, c.URL(), pw); !refused(err) {
			t.Errorf("%s: want the connection refused (28P01), got %v", name, err)
		}
	}
	hba, err := os.ReadFile(filepath.Join(c.DataDir(), "pg_hba.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(hba), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") && (f[len(f)-1] == "trust" || !strings.Contains(line, "scram-sha-256") && !strings.Contains(line, "peer")) {
			t.Errorf("pg_hba.conf line %q is neither scram-sha-256 nor peer", line)
		}
	}
	if !strings.Contains(string(hba), "scram-sha-256") {
		t.Errorf("pg_hba.conf has no scram-sha-256 line:\n%s", hba)
	}
	if fi, err := os.Stat(filepath.Join(c.DataDir(), "pg_hba.conf")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("pg_hba.conf mode: %v %v, want 0600", fi.Mode().Perm(), err)
	}
	var method string
	if err := pgxQueryRow(t, c.URL(), `SELECT left(rolpassword, 14) FROM pg_authid WHERE rolname = 'postgres'`, &method); err != nil || method != "SCRAM-SHA-256$" {
		t.Errorf("stored password is %q (%v), want a SCRAM-SHA-256 verifier", method, err)
	}

	// The next start rotates the password: the old one stops working.
	pw2, err := pgcluster.NewPassword()
	if err != nil {
		t.Fatal(err)
	}
	restart(pw2)
	if err := connectErr(t, c.URL(), &pw1); !refused(err) {
		t.Errorf("old password after rotation: want refused (28P01), got %v", err)
	}
	if err := connectErr(t, c.URL(), &pw2); err != nil {
		t.Errorf("new password refused: %v", err)
	}
	if got := queryInt(t, c.URL(), `SELECT x FROM kept`); got != 7 {
		t.Errorf("kept.x = %d after rotation, want 7", got)
	}
}

func pgxQueryRow(t *testing.T, url, sql string, dst any) error {
	t.Helper()
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dst)
}
