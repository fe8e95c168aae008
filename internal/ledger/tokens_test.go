package ledger_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A token authenticates as its principal until it expires or is revoked; Tokens lists every
// token's record with its state (issue 15 item 2).
func TestTokenLifecycle(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))

	alice, aliceTok, err := st.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	bob, bobTok, err := st.CreateToken(ctx, "bob", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	short, shortTok, err := st.CreateToken(ctx, "carol", time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	if !ledger.ValidTokenID(alice.ID) || alice.ID == bob.ID || aliceTok == bobTok {
		t.Fatalf("ids %q %q, tokens distinct: %v", alice.ID, bob.ID, aliceTok != bobTok)
	}
	if alice.ExpiresAt != nil {
		t.Errorf("ttl 0: expires at %v, want never", alice.ExpiresAt)
	}
	if bob.ExpiresAt == nil || bob.ExpiresAt.Sub(bob.CreatedAt) != time.Hour {
		t.Errorf("ttl 1h: created %v, expires %v", bob.CreatedAt, bob.ExpiresAt)
	}

	// The microsecond token is past its expiry once the database's clock moved on.
	time.Sleep(5 * time.Millisecond)

	for _, tt := range []struct {
		name, token string
		want        *ledger.Token // nil: refused
	}{
		{"never expires", aliceTok, &alice},
		{"expires in an hour", bobTok, &bob},
		{"expired", shortTok, nil},
	} {
		got, err := st.AuthenticateToken(ctx, tt.token)
		if tt.want == nil {
			if !errors.Is(err, ledger.ErrTokenInvalid) {
				t.Errorf("%s: AuthenticateToken = %+v, %v; want ErrTokenInvalid", tt.name, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if diff := cmp.Diff(*tt.want, got); diff != "" {
			t.Errorf("%s: token (-want +got):\n%s", tt.name, diff)
		}
	}

	revoked, err := st.RevokeToken(ctx, bob.ID)
	if err != nil {
		t.Fatal(err)
	}
	if revoked.RevokedAt == nil || revoked.Principal != "bob" || revoked.ID != bob.ID {
		t.Fatalf("RevokeToken = %+v", revoked)
	}
	if _, err := st.AuthenticateToken(ctx, bobTok); !errors.Is(err, ledger.ErrTokenInvalid) {
		t.Errorf("revoked token authenticates: %v", err)
	}
	// Revoking again keeps the first revocation time.
	again, err := st.RevokeToken(ctx, bob.ID)
	if err != nil || !again.RevokedAt.Equal(*revoked.RevokedAt) {
		t.Errorf("second revoke = %+v, %v; want revoked at %v", again, err, revoked.RevokedAt)
	}
	// The other tokens are untouched.
	if _, err := st.AuthenticateToken(ctx, aliceTok); err != nil {
		t.Errorf("alice after bob's revocation: %v", err)
	}
	if _, err := st.RevokeToken(ctx, "tok_000000000000"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("revoke unknown id: %v, want ErrNotFound", err)
	}

	list, err := st.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	type row struct{ ID, Principal, Status string }
	var got []row
	for _, tk := range list {
		got = append(got, row{tk.ID, tk.Principal, tk.Status(now)})
	}
	want := []row{{alice.ID, "alice", ledger.TokenActive}, {bob.ID, "bob", ledger.TokenRevoked}, {short.ID, "carol", ledger.TokenExpired}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Tokens (-want +got):\n%s", diff)
	}
}

// The ledger stores only the SHA-256 of a token: no column of the table holds the token or
// any part of its random text.
func TestTokenStoredAsHashOnly(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	st := ledger.New(pool)
	tk, plaintext, err := st.CreateToken(ctx, "alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(plaintext, "mcps_") || len(plaintext) != len("mcps_")+43 {
		t.Fatalf("token %d bytes, prefix %q", len(plaintext), plaintext[:5])
	}
	var hash []byte
	var rowText string
	if err := pool.QueryRow(ctx, `SELECT token_hash, t::text FROM gateway_tokens t WHERE id = $1`, tk.ID).Scan(&hash, &rowText); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(plaintext))
	if !bytes.Equal(hash, sum[:]) {
		t.Errorf("token_hash is not the SHA-256 of the token")
	}
	secret := strings.TrimPrefix(plaintext, "mcps_")
	if strings.Contains(rowText, secret[:16]) || strings.Contains(rowText, secret[len(secret)-16:]) {
		t.Errorf("the table row holds the token's text: %s", rowText)
	}
	var columns []string
	rows, err := pool.Query(ctx, `SELECT column_name FROM information_schema.columns WHERE table_name = 'gateway_tokens' ORDER BY ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		columns = append(columns, c)
	}
	if diff := cmp.Diff([]string{"id", "principal", "token_hash", "created_at", "expires_at", "revoked_at"}, columns); diff != "" {
		t.Errorf("gateway_tokens columns (-want +got):\n%s", diff)
	}
}

// Anything but a token CreateToken made is refused with ErrTokenInvalid, and the error never
// repeats what it was given.
func TestAuthenticateMalformedToken(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	_, good, err := st.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	flipped := []byte(good)
	flipped[10] ^= 1
	for _, tt := range []struct{ name, token string }{
		{"empty", ""},
		{"prefix only", "mcps_"},
		{"no prefix", strings.TrimPrefix(good, "mcps_")},
		{"other prefix", "mcpx_" + strings.TrimPrefix(good, "mcps_")},
		{"truncated", good[:len(good)-1]},
		{"extended", good + "A"},
		{"padding", good[:len(good)-1] + "="},
		{"not base64url", good[:len(good)-1] + "+"},
		{"one bit off", string(flipped)},
		{"upper-cased", strings.ToUpper(good)},
		{"white space", " " + good},
		{"huge", "mcps_" + strings.Repeat("A", 1<<16)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := st.AuthenticateToken(ctx, tt.token)
			if !errors.Is(err, ledger.ErrTokenInvalid) {
				t.Fatalf("AuthenticateToken: %v, want ErrTokenInvalid", err)
			}
			if len(tt.token) > 8 && strings.Contains(err.Error(), tt.token[5:]) {
				t.Errorf("error %q repeats the token", err)
			}
		})
	}
}

// RevokeToken notifies TokenChannel with the token's ID in the revoking transaction: a
// listening connection hears it, and only once the revocation holds.
func TestRevokeTokenNotifies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t)
	st := ledger.New(pool)
	tk, plaintext, err := st.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+ledger.TokenChannel); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RevokeToken(ctx, tk.ID); err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithTimeout(ctx, 15*time.Second)
	defer ncancel()
	n, err := conn.Conn().WaitForNotification(nctx)
	if err != nil {
		t.Fatalf("no notification on %s after RevokeToken: %v", ledger.TokenChannel, err)
	}
	if n.Channel != ledger.TokenChannel || n.Payload != tk.ID {
		t.Errorf("notification %s %q, want %s %q", n.Channel, n.Payload, ledger.TokenChannel, tk.ID)
	}
	// Heard means committed: the token no longer authenticates.
	if _, err := st.AuthenticateToken(ctx, plaintext); !errors.Is(err, ledger.ErrTokenInvalid) {
		t.Errorf("after the notification the token still authenticates: %v", err)
	}
	// Nothing is notified for an unknown ID.
	if _, err := st.RevokeToken(ctx, "tok_ffffffffffff"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	if n, err := conn.Conn().WaitForNotification(wctx); err == nil {
		t.Errorf("unexpected notification %s %q after revoking an unknown id", n.Channel, n.Payload)
	}
}

// CreateToken refuses a bad principal or a negative ttl with ErrInvalid and stores nothing.
func TestCreateTokenRefuses(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	for _, tt := range []struct {
		name, principal string
		ttl             time.Duration
	}{
		{"empty principal", "", 0},
		{"blank principal", "  ", 0},
		{"padded principal", " alice", 0},
		{"control character", "al\nice", 0},
		{"too long", strings.Repeat("a", ledger.MaxPrincipalBytes+1), 0},
		{"negative ttl", "alice", -time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, tok, err := st.CreateToken(ctx, tt.principal, tt.ttl); !errors.Is(err, ledger.ErrInvalid) || tok != "" {
				t.Errorf("CreateToken: token given: %v, err %v; want ErrInvalid", tok != "", err)
			}
		})
	}
	if list, err := st.Tokens(ctx); err != nil || len(list) != 0 {
		t.Errorf("Tokens after refusals = %d, %v; want none", len(list), err)
	}
}
