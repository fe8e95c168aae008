package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
)

// Token is a gateway bearer token as the ledger records it: never the token itself, only who
// it names and when it stops authenticating (issue 15 item 2).
type Token struct {
	// ID is the token's public identifier ("tok_" and 12 hex digits): what `mcpsync token
	// list` shows and `mcpsync token revoke` takes. It reveals nothing about the token.
	ID string
	// Principal is the principal the token authenticates as.
	Principal string
	// CreatedAt is when the token was made (the database's clock).
	CreatedAt time.Time
	// ExpiresAt is when the token stops authenticating; nil: never.
	ExpiresAt *time.Time
	// RevokedAt is when the token was revoked; nil: not revoked.
	RevokedAt *time.Time
}

// Token states, as Status reports them.
const (
	TokenActive  = "active"
	TokenExpired = "expired"
	TokenRevoked = "revoked"
)

// Status says whether t authenticates at now: TokenRevoked once revoked (whatever its
// expiry), TokenExpired at or after ExpiresAt, TokenActive otherwise.
func (t Token) Status(now time.Time) string {
	switch {
	case t.RevokedAt != nil:
		return TokenRevoked
	case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		return TokenExpired
	}
	return TokenActive
}

// ErrTokenInvalid is wrapped by every AuthenticateToken failure that means "this token does
// not authenticate": unknown, malformed, expired or revoked. The error never says which, and
// never contains the token.
var ErrTokenInvalid = errors.New("token unknown, expired or revoked")

// TokenChannel is the LISTEN/NOTIFY channel RevokeToken notifies, in the revoking
// transaction, with the revoked token's ID as the payload: a listener hears of a revocation
// only once it has committed (the gateway then ends that token's open streams).
const TokenChannel = "mcpsync_tokens"

// tokenPrefix starts every token, so a token is recognisable in a config file or a leak
// scanner; tokenRandomBytes random bytes follow, base64url-encoded without padding.
const (
	tokenPrefix      = "mcps_"
	tokenRandomBytes = 32
)

// tokenLen is the length of a well-formed token.
var tokenLen = len(tokenPrefix) + base64.RawURLEncoding.EncodedLen(tokenRandomBytes)

// MaxPrincipalBytes bounds a principal's name.
const MaxPrincipalBytes = 256

// PrincipalError says what is wrong with a principal name; it matches ErrInvalid with
// errors.Is.
type PrincipalError struct {
	Principal string
	Problem   string // e.g. "must not be empty"
}

// Error names the principal and the problem.
func (e *PrincipalError) Error() string {
	return fmt.Sprintf("principal %q %s", e.Principal, e.Problem)
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *PrincipalError) Unwrap() error { return ErrInvalid }

// CheckPrincipal refuses, with a *PrincipalError (errors.Is ErrInvalid), a principal name a
// token may not carry: empty, longer than MaxPrincipalBytes, with leading or trailing white
// space, or with a control character.
func CheckPrincipal(p string) error {
	problem := ""
	switch {
	case strings.TrimSpace(p) == "":
		problem = "must not be empty"
	case len(p) > MaxPrincipalBytes:
		problem = fmt.Sprintf("is too long: %d bytes, at most %d", len(p), MaxPrincipalBytes)
	case strings.TrimSpace(p) != p:
		problem = "has leading or trailing white space"
	case strings.IndexFunc(p, unicode.IsControl) >= 0:
		problem = "contains a control character"
	default:
		return nil
	}
	if len(p) > 64 {
		p = p[:64] + "..."
	}
	return &PrincipalError{Principal: p, Problem: problem}
}

// tokenIDPattern is the shape of every token ID (the table's CHECK says the same).
var tokenIDPattern = regexp.MustCompile(`^tok_[0-9a-f]{12}$`)

// ValidTokenID reports whether id has the shape of a token ID ("tok_" and 12 lower-case hex
// digits); RevokeToken of any other string can only be ErrNotFound.
func ValidTokenID(id string) bool { return tokenIDPattern.MatchString(id) }

// tokenHash is what the ledger stores of a token: its SHA-256. The token carries 256 random
// bits, so the hash needs no salt or stretching to be irreversible.
func tokenHash(plaintext string) []byte {
	h := sha256.Sum256([]byte(plaintext))
	return h[:]
}

// wellFormedToken reports whether s has the shape of a token CreateToken makes.
func wellFormedToken(s string) bool {
	rest, ok := strings.CutPrefix(s, tokenPrefix)
	if !ok || len(s) != tokenLen {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == tokenRandomBytes
}

const tokenColumns = `id, principal, created_at, expires_at, revoked_at`

func scanToken(row pgx.Row) (Token, error) {
	var t Token
	err := row.Scan(&t.ID, &t.Principal, &t.CreatedAt, &t.ExpiresAt, &t.RevokedAt)
	return t, err
}

// CreateToken makes a new bearer token for principal that expires ttl after now (the
// database's clock); ttl 0 means it never expires, a negative ttl or a bad principal name is
// ErrInvalid. It returns the token's record and its plaintext, which exists only in the
// return value: the ledger stores its SHA-256 alone, so it cannot be shown again.
func (s *Store) CreateToken(ctx context.Context, principal string, ttl time.Duration) (Token, string, error) {
	if err := CheckPrincipal(principal); err != nil {
		return Token{}, "", fmt.Errorf("ledger: create token: %w", err)
	}
	if ttl < 0 {
		return Token{}, "", fmt.Errorf("ledger: create token: negative ttl %s: %w", ttl, ErrInvalid)
	}
	var ttlMicros *int64
	if ttl > 0 {
		us := max(ttl.Microseconds(), 1)
		ttlMicros = &us
	}
	for attempt := 0; ; attempt++ {
		secret := make([]byte, tokenRandomBytes)
		rand.Read(secret)
		plaintext := tokenPrefix + base64.RawURLEncoding.EncodeToString(secret)
		idBytes := make([]byte, 6)
		rand.Read(idBytes)
		t, err := scanToken(s.pool.QueryRow(ctx, `
			INSERT INTO gateway_tokens (id, principal, token_hash, expires_at)
			VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond')
			RETURNING `+tokenColumns, "tok_"+hex.EncodeToString(idBytes), principal, tokenHash(plaintext), ttlMicros))
		if err == nil {
			return t, plaintext, nil
		}
		// A unique violation means an ID (48 random bits) collided: draw again.
		if isRetryable(err) && attempt < 3 {
			continue
		}
		return Token{}, "", fmt.Errorf("ledger: create token for %q: %w", principal, err)
	}
}

// AuthenticateToken returns the token plaintext names if it authenticates now: known (by its
// hash), not revoked and not expired, all checked in the one statement that finds it, against
// the database's clock. Every other case, a malformed string included, is an error wrapping
// ErrTokenInvalid that does not say which case it was and does not contain plaintext.
func (s *Store) AuthenticateToken(ctx context.Context, plaintext string) (Token, error) {
	if !wellFormedToken(plaintext) {
		return Token{}, fmt.Errorf("ledger: authenticate: %w", ErrTokenInvalid)
	}
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM gateway_tokens
		WHERE token_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())`,
		tokenHash(plaintext)))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Token{}, fmt.Errorf("ledger: authenticate: %w", ErrTokenInvalid)
	case err != nil:
		return Token{}, fmt.Errorf("ledger: authenticate: %w", err)
	}
	return t, nil
}

// Tokens returns every token's record (never a token or its hash), active, expired and
// revoked, oldest first.
func (s *Store) Tokens(ctx context.Context) ([]Token, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tokenColumns+` FROM gateway_tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("ledger: list tokens: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) { return scanToken(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: list tokens: %w", err)
	}
	return out, nil
}

// RevokeToken revokes the token called id: from its commit on, AuthenticateToken refuses it.
// The same transaction notifies TokenChannel with id, so listeners hear of it exactly when it
// holds. Revoking a revoked token keeps its first RevokedAt and notifies again; an unknown id
// is ErrNotFound.
func (s *Store) RevokeToken(ctx context.Context, id string) (Token, error) {
	var t Token
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		t, err = scanToken(tx.QueryRow(ctx, `UPDATE gateway_tokens SET revoked_at = coalesce(revoked_at, now())
			WHERE id = $1 RETURNING `+tokenColumns, id))
		if err != nil {
			return notFound(err, fmt.Sprintf("ledger: revoke token %q", id))
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, TokenChannel, t.ID); err != nil {
			return fmt.Errorf("ledger: revoke token %q: notify: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return Token{}, err
	}
	return t, nil
}
