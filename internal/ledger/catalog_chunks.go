package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
)

// A round's entries are stored by content (migration 0018): cut into chunks, each stored once
// in catalog_entry_chunks under the digest of what it holds, the round's catalog_entry_batches
// rows naming its chunks in order. Where a chunk ends depends on the entries around the cut,
// not on their position in the set, so a set that differs from the last one in a few entries
// shares every other chunk with it and storing it writes only the chunks that changed.
const (
	// chunkMin and chunkMax bound a chunk's entries; between them a chunk ends after an entry
	// whose server URI hashes to a multiple of chunkSpread (a content-defined cut), so chunks
	// hold about chunkMin + chunkSpread entries.
	chunkMin    = 64
	chunkSpread = 256
	chunkMax    = 1000
)

// entryChunk is one chunk of a round's entries: entries[start:end], all of one kind, with the
// arrays it is stored as and the digest of those arrays.
type entryChunk struct {
	kind                       string
	uris, servers, names, mime []string // uris nil: every URI is already in normal form
	digest                     string
}

// chunkCut reports whether a chunk of n entries ends after an entry with server URI u: at
// chunkMax, or from chunkMin on where u's FNV-1a hash is a multiple of chunkSpread.
func chunkCut(n int, u string) bool {
	if n >= chunkMax {
		return true
	}
	if n < chunkMin {
		return false
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(u); i++ {
		h = (h ^ uint64(u[i])) * 1099511628211
	}
	return h%chunkSpread == 0
}

// entryChunks cuts entries, in their order, into chunks of one kind each (chunkCut), the
// server's strings escaped (SafeText), each with its digest (chunkDigest).
func entryChunks(entries []ScanEntry) []entryChunk {
	var out []entryChunk
	var buf []byte
	for start := 0; start < len(entries); {
		end := start + 1
		for end < len(entries) && entries[end].Kind == entries[start].Kind && !chunkCut(end-start, entries[end-1].ServerURI) {
			end++
		}
		n := end - start
		c := entryChunk{kind: entries[start].Kind, uris: make([]string, n), servers: make([]string, n), names: make([]string, n), mime: make([]string, n)}
		normalized := false
		for i, e := range entries[start:end] {
			// Names, MIME types and template URIs are the server's own strings (SafeText).
			c.uris[i], c.servers[i], c.names[i], c.mime[i] = SafeText(e.URI), SafeText(e.ServerURI), SafeText(e.Name), SafeText(e.MIMEType)
			normalized = normalized || e.URI != e.ServerURI
		}
		if !normalized {
			c.uris = nil // stored as NULL: every URI is already in normal form
		}
		c.digest, buf = chunkDigest(c, buf)
		out = append(out, c)
		start = end
	}
	return out
}

// chunkDigest is the hex SHA-256 of a chunk as stored: its kind, whether its normalized URIs
// are stored, and every stored string, each preceded by its length. buf is scratch space,
// returned for reuse.
func chunkDigest(c entryChunk, buf []byte) (string, []byte) {
	h := sha256.New()
	buf = append(buf[:0], "mcpsync entry chunk 1\x00"...)
	buf = binary.AppendUvarint(buf, uint64(len(c.kind)))
	buf = append(buf, c.kind...)
	if c.uris != nil {
		buf = append(buf, 1)
	} else {
		buf = append(buf, 0)
	}
	add := func(s string) {
		if len(buf) > 32<<10 {
			h.Write(buf)
			buf = buf[:0]
		}
		buf = binary.AppendUvarint(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	for i := range c.servers {
		if c.uris != nil {
			add(c.uris[i])
		}
		add(c.servers[i])
		add(c.names[i])
		add(c.mime[i])
	}
	h.Write(buf)
	return hex.EncodeToString(h.Sum(nil)), buf
}

// storeEntries stores a round's entries in tx: the chunks not yet stored, then the round's
// list of chunks. The chunks already stored are locked FOR KEY SHARE first, so that a prune
// cannot delete one before the round names it (a prune that tried waits and then fails on the
// foreign key, and runs again); a chunk another transaction stores at the same time is
// written once (ON CONFLICT DO NOTHING waits for it).
func storeEntries(ctx context.Context, tx pgx.Tx, scanID int64, entries []ScanEntry) error {
	chunks := entryChunks(entries)
	if len(chunks) == 0 {
		return nil
	}
	digests := make([]string, len(chunks))
	for i, c := range chunks {
		digests[i] = c.digest
	}
	rows, err := tx.Query(ctx, `SELECT digest FROM catalog_entry_chunks WHERE digest = ANY ($1) FOR KEY SHARE`, digests)
	if err != nil {
		return err
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	have := make(map[string]bool, len(stored))
	for _, d := range stored {
		have[d] = true
	}
	var b pgx.Batch
	for _, c := range chunks {
		if have[c.digest] {
			continue
		}
		have[c.digest] = true // a set may hold one chunk twice (a resource listed over and over): insert it once
		b.Queue(`INSERT INTO catalog_entry_chunks (digest, kind, server_uris, uris, names, mime_types)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (digest) DO NOTHING`,
			c.digest, c.kind, c.servers, c.uris, c.names, c.mime)
	}
	b.Queue(`INSERT INTO catalog_entry_batches (scan_id, batch, chunk)
		SELECT $1, d.ord - 1, d.chunk FROM unnest($2::text[]) WITH ORDINALITY AS d (chunk, ord)`, scanID, digests)
	return tx.SendBatch(ctx, &b).Close()
}
