package pgcluster

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// NewPassword returns a random password of 32 URL-safe characters (192 bits), fit for
// Options.Password and for a URL's userinfo without escaping.
func NewPassword() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// identMap names the pg_ident.conf map that lets this process's OS user in as Superuser.
const identMap = "mcpsync"

// writeAuthConfig replaces pg_hba.conf and pg_ident.conf of the data directory (issue 14
// item 3): TCP connections need scram-sha-256, and the Unix socket (in a private directory)
// admits only osUser, by peer authentication, as Superuser — the way Start sets the
// password. No line trusts anybody. Files are mode 0600, owned by runAs when set.
func writeAuthConfig(dataDir, osUser string, runAs *osUser) error {
	files := map[string]string{
		"pg_hba.conf": "# Written by mcpsync's pgcluster at every start: no trust.\n" +
			"# TYPE  DATABASE  USER  ADDRESS  METHOD\n" +
			"local   all       all            peer map=" + identMap + "\n" +
			"host    all       all   all      scram-sha-256\n",
		"pg_ident.conf": "# Written by mcpsync's pgcluster: the OS user that runs it may use the socket as " + Superuser + ".\n" +
			"# MAPNAME  SYSTEM-USERNAME  PG-USERNAME\n" +
			identMap + "  " + osUser + "  " + Superuser + "\n",
	}
	for name, content := range files {
		path := filepath.Join(dataDir, name)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if runAs != nil {
			if err := os.Chown(tmp, int(runAs.uid), int(runAs.gid)); err != nil {
				os.Remove(tmp)
				return fmt.Errorf("chown %s to %s: %w", path, runAs.name, err)
			}
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// currentOSUser is the name PostgreSQL's peer authentication sees for this process.
func currentOSUser() (string, error) {
	u, err := user.Current()
	if err != nil {
		return "", fmt.Errorf("password authentication needs this process's OS user name for the socket's peer map: %w", err)
	}
	if strings.ContainsAny(u.Username, " \t\n\"#") {
		return "", fmt.Errorf("OS user name %q cannot appear in pg_ident.conf", u.Username)
	}
	return u.Username, nil
}

// socketConnString is a connection string for Superuser over the Unix socket (peer
// authentication; no password).
func (c *Cluster) socketConnString(db string) string {
	quote := func(s string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'" }
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", quote(c.sockDir), c.port, quote(Superuser), quote(db))
}

// setPassword gives Superuser the cluster's password, sent as a SCRAM verifier so that the
// clear text reaches neither the server nor its logs.
func (c *Cluster) setPassword(ctx context.Context) error {
	verifier, err := scramVerifier(c.password)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.adminConnString())
	if err != nil {
		return fmt.Errorf("connect over the socket to set the password: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// ALTER ROLE takes no parameters; the verifier is base64 and '$', ':' only.
	if _, err := conn.Exec(ctx, "ALTER ROLE "+pgx.Identifier{Superuser}.Sanitize()+" PASSWORD '"+verifier+"'"); err != nil {
		return fmt.Errorf("set the password of %s: %w", Superuser, err)
	}
	return nil
}

// scramIterations is PostgreSQL's default scram_iterations.
const scramIterations = 4096

// scramVerifier returns the SCRAM-SHA-256 verifier PostgreSQL stores for password (RFC 5802,
// 7677): SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>. The password must be
// ASCII (SASLprep leaves it unchanged), as NewPassword's are.
func scramVerifier(password string) (string, error) {
	for _, r := range password {
		if r < 0x21 || r > 0x7e {
			return "", fmt.Errorf("the cluster password must be printable ASCII")
		}
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("salt: %w", err)
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, scramIterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("pbkdf2: %w", err)
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac(salted, "Client Key"))
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$" + strconv.Itoa(scramIterations) + ":" + b64(salt) + "$" + b64(stored[:]) + ":" + b64(mac(salted, "Server Key")), nil
}
