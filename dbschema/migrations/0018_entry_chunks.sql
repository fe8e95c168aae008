-- mcpsync ledger, eighteenth migration: a catalog's entries are stored by content (issue 16
-- item 5). A round that lists a set differing from the source's last one in a few entries
-- wrote all of them again (100,000 entries for one added resource), beside the next round's
-- paging. The entries are now cut into chunks at boundaries that depend on the entries
-- themselves (ledger.entryChunks), each chunk stored once under the digest of its content in
-- catalog_entry_chunks; a round's catalog_entry_batches rows only name its chunks in order.
-- A set that changed in one place shares every other chunk with the set before it, so storing
-- it writes one or two chunks and the list of names.
--
-- The chunks of rounds stored before this migration keep a key of their own ('scan-' round
-- '-' batch): they are not shared with later rounds, which store their chunks under digests.

CREATE TABLE catalog_entry_chunks (
    digest      text        PRIMARY KEY, -- ledger.chunkDigest of the content, or 'scan-…' (above)
    kind        text        NOT NULL CHECK (kind IN ('resource', 'template')),
    server_uris text[]      NOT NULL, -- as the server listed them (URI templates for templates)
    uris        text[],               -- normalized URIs of resources; NULL: equal to server_uris
    names       text[]      NOT NULL,
    mime_types  text[]      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((uris IS NULL OR cardinality(uris) = cardinality(server_uris))
           AND cardinality(server_uris) = cardinality(names)
           AND cardinality(server_uris) = cardinality(mime_types))
);

INSERT INTO catalog_entry_chunks (digest, kind, server_uris, uris, names, mime_types)
    SELECT 'scan-' || scan_id || '-' || batch, kind, server_uris, uris, names, mime_types
    FROM catalog_entry_batches;

DROP VIEW catalog_entries;
ALTER TABLE catalog_entry_batches ADD COLUMN chunk text;
UPDATE catalog_entry_batches SET chunk = 'scan-' || scan_id || '-' || batch;
ALTER TABLE catalog_entry_batches
    DROP CONSTRAINT catalog_entry_batches_check,
    DROP COLUMN kind, DROP COLUMN server_uris, DROP COLUMN uris, DROP COLUMN names, DROP COLUMN mime_types,
    ALTER COLUMN chunk SET NOT NULL,
    ADD FOREIGN KEY (chunk) REFERENCES catalog_entry_chunks (digest);
-- Prune looks a chunk's rounds up by the chunk.
CREATE INDEX catalog_entry_batches_chunk ON catalog_entry_batches (chunk);

-- A round's entries as stored arrays, one row per chunk in the round's order.
CREATE VIEW catalog_entry_arrays AS
    SELECT b.scan_id, b.batch, k.kind, k.server_uris, k.uris, k.names, k.mime_types
    FROM catalog_entry_batches b JOIN catalog_entry_chunks k ON k.digest = b.chunk;

-- One row per catalog entry (normalized URI, server URI, name, MIME type), in stored order.
CREATE VIEW catalog_entries AS
    SELECT a.scan_id, a.kind, e.uri, e.server_uri, e.name, e.mime_type, a.batch, e.ord
    FROM catalog_entry_arrays a,
         unnest(coalesce(a.uris, a.server_uris), a.server_uris, a.names, a.mime_types)
             WITH ORDINALITY AS e (uri, server_uri, name, mime_type, ord);
