package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Digest returns the content digest mcpsync uses everywhere: "sha256:" and the lower-case hex
// SHA-256 of body.
func Digest(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// PutBlob stores body under its digest (content-addressed; storing it twice stores nothing
// new) and returns the digest. The MIME type is the server's and is stored through SafeText.
// Storing a blob again refreshes its age when it is older than blobTouchEvery, so Prune, which
// deletes no blob younger than BlobGrace, cannot delete a body a read just stored for its
// answer before the acceptance point names it (SPEC.md "Retention").
func (s *Store) PutBlob(ctx context.Context, body []byte, mimeType string) (string, error) {
	d := Digest(body)
	q := putBlob(d, body, mimeType)
	if _, err := s.pool.Exec(ctx, q.sql, q.args...); err != nil {
		return "", fmt.Errorf("ledger: put blob: %w", err)
	}
	return d, nil
}

// putBlob is PutBlob's statement for body and its digest (Digest(body)), for PutBlob and for
// an acceptance that stores the body in its own transaction (AcceptRequest.Body).
func putBlob(digest string, body []byte, mimeType string) queued {
	if body == nil {
		body = []byte{}
	}
	return queued{sql: `INSERT INTO content_blobs (digest, mime_type, size, body) VALUES ($1, $2, $3, $4)
		ON CONFLICT (digest) DO UPDATE SET created_at = now()
		WHERE content_blobs.created_at < now() - make_interval(secs => $5)`,
		args: []any{digest, SafeText(mimeType), len(body), body, blobTouchEvery.Seconds()}}
}

// Blob returns the body stored under digest, or ErrNotFound.
func (s *Store) Blob(ctx context.Context, digest string) ([]byte, error) {
	var body []byte
	if err := s.pool.QueryRow(ctx, `SELECT body FROM content_blobs WHERE digest = $1`, digest).Scan(&body); err != nil {
		return nil, notFound(err, "ledger: blob "+digest)
	}
	return body, nil
}
