-- mcpsync ledger, second migration: discovery scans, published catalogs and their consumers
-- (SPEC.md R2-R8, R21, R24, R25). internal/ledger/catalog.go and tombstone.go hold the guarded
-- statements; the constraints below repeat the rules that must hold whatever code writes here.

-- resourceDiscoveryScan.v1 (R4): one row per round, i.e. one pass over resources/list and
-- resources/templates/list on one session. Cursors themselves are never stored (R2): only
-- their digests. While the round runs, the page and item counts are its progress.
CREATE TABLE discovery_scans (
    id                      bigserial   PRIMARY KEY,
    scan_key                text        NOT NULL UNIQUE, -- <scan run>/round-<n>: one row per round
    scan_run                text        NOT NULL,        -- <scan workflow id>/<run id>
    scan_workflow_id        text        NOT NULL,
    round                   integer     NOT NULL CHECK (round > 0),
    source_id               bigint      NOT NULL REFERENCES sources (id),
    session_generation      bigint      NOT NULL,
    host_queue              text        NOT NULL DEFAULT '',
    started_at              timestamptz NOT NULL DEFAULT clock_timestamp(), -- time of the first request
    ended_at                timestamptz,
    outcome                 text        NOT NULL DEFAULT 'RUNNING'
                                        CHECK (outcome IN ('RUNNING', 'COMPLETE', 'FAILED')),
    failure_kind            text,       -- CURSOR_CYCLE, PAGE_CAP, CURSOR_ERROR, STALE_SESSION, ...
    failure                 text,
    resource_pages          integer     NOT NULL DEFAULT 0,
    template_pages          integer     NOT NULL DEFAULT 0,
    resource_count          integer     NOT NULL DEFAULT 0,
    template_count          integer     NOT NULL DEFAULT 0,
    duplicate_count         integer     NOT NULL DEFAULT 0, -- entries listed twice in the round
    -- Digest of the cursor that requested each page after the first, in request order.
    resource_cursor_digests text[]      NOT NULL DEFAULT '{}',
    template_cursor_digests text[]      NOT NULL DEFAULT '{}',
    set_digest              text,       -- digest of the sorted URI/descriptor set
    -- The round whose catalog_entries hold this round's set: itself, or an earlier complete
    -- round of the source with the same set digest (an unchanged set is not written again).
    entries_scan_id         bigint      REFERENCES discovery_scans (id),
    snapshot_negotiated     boolean     NOT NULL DEFAULT false, -- the session's capability receipt (R5)
    snapshot_ids            text[]      NOT NULL DEFAULT '{}',  -- distinct IDs seen, first-seen order
    snapshot_pages          integer     NOT NULL DEFAULT 0,     -- pages that carried an ID
    snapshot_id             text,       -- the one ID every page carried; NULL otherwise
    list_changed_before     bigint      NOT NULL DEFAULT 0,     -- session's list_changed count at start
    list_changed_after      bigint,
    list_changed_observed   bigint      NOT NULL DEFAULT 0,     -- received during the round
    progress_at             timestamptz,
    UNIQUE (scan_run, round),
    CHECK (outcome <> 'COMPLETE' OR (set_digest IS NOT NULL AND ended_at IS NOT NULL AND entries_scan_id IS NOT NULL)),
    CHECK (outcome <> 'FAILED' OR (failure_kind IS NOT NULL AND ended_at IS NOT NULL))
);
CREATE INDEX discovery_scans_session ON discovery_scans (source_id, session_generation, id);
CREATE INDEX discovery_scans_workflow ON discovery_scans (scan_workflow_id, id);
CREATE INDEX discovery_scans_set ON discovery_scans (source_id, set_digest) WHERE outcome = 'COMPLETE';

-- The URI/descriptor set a complete round listed, written by the first round of the source
-- that listed that set (discovery_scans.entries_scan_id), so a set is stored once. A catalog
-- names the round whose entries it publishes (catalogs.entries_scan_id). Entries are stored in
-- batches of up to 1,000 (one list kind per batch, sorted by server URI): writing 100,000
-- one-row entries with their index cost as much as listing them; catalog_entries shows them
-- one row per entry.
CREATE TABLE catalog_entry_batches (
    scan_id     bigint  NOT NULL REFERENCES discovery_scans (id) ON DELETE CASCADE,
    batch       integer NOT NULL,
    kind        text    NOT NULL CHECK (kind IN ('resource', 'template')),
    server_uris text[]  NOT NULL, -- as the server listed them (URI templates for templates)
    uris        text[],           -- normalized URIs of resources; NULL: equal to server_uris
    names       text[]  NOT NULL,
    mime_types  text[]  NOT NULL,
    PRIMARY KEY (scan_id, batch),
    CHECK ((uris IS NULL OR cardinality(uris) = cardinality(server_uris))
           AND cardinality(server_uris) = cardinality(names)
           AND cardinality(server_uris) = cardinality(mime_types))
);

-- One row per catalog entry (normalized URI, server URI, name, MIME type), in stored order.
CREATE VIEW catalog_entries AS
    SELECT b.scan_id, b.kind, e.uri, e.server_uri, e.name, e.mime_type, b.batch, e.ord
    FROM catalog_entry_batches b,
         unnest(coalesce(b.uris, b.server_uris), b.server_uris, b.names, b.mime_types)
             WITH ORDINALITY AS e (uri, server_uri, name, mime_type, ord);

-- A published catalog of a source and its proof level (R5-R7). SNAPSHOT_PROVEN and
-- SNAPSHOT_UNPROVEN rest on two consecutive rounds A and B; a single round never yields one
-- (R24). The newest catalog of a source (by measured_at) supersedes older ones.
CREATE TABLE catalogs (
    id                  bigserial   PRIMARY KEY,
    catalog_key         text        NOT NULL UNIQUE, -- the scan run: one catalog per scan
    source_id           bigint      NOT NULL REFERENCES sources (id),
    session_generation  bigint      NOT NULL,
    scan_workflow_id    text        NOT NULL,
    proof_level         text        NOT NULL CHECK (proof_level IN (
                            'SNAPSHOT_PROVEN', 'SNAPSHOT_UNPROVEN', 'RECONCILIATION_REQUIRED')),
    reason              text        NOT NULL DEFAULT '',
    rounds_used         integer     NOT NULL CHECK (rounds_used >= 0),
    basis_scan_ids      bigint[]    NOT NULL DEFAULT '{}', -- rounds A and B
    entries_scan_id     bigint      REFERENCES discovery_scans (id),
    set_digest          text,
    snapshot_id         text,       -- SNAPSHOT_PROVEN: the ID both rounds carried on every page
    resource_count      integer     NOT NULL DEFAULT 0,
    template_count      integer     NOT NULL DEFAULT 0,
    scans_started_at    timestamptz, -- first request of round A
    measured_at         timestamptz NOT NULL,
    staleness_bound     interval    NOT NULL,
    next_check_at       timestamptz NOT NULL,
    published_at        timestamptz NOT NULL DEFAULT now(),
    invalidated_at      timestamptz, -- a list_changed arrived after publication (R3)
    invalidated_reason  text,
    CHECK (proof_level = 'RECONCILIATION_REQUIRED' OR (
        cardinality(basis_scan_ids) = 2 AND basis_scan_ids[1] <> basis_scan_ids[2]
        AND entries_scan_id IS NOT NULL AND set_digest IS NOT NULL AND scans_started_at IS NOT NULL)),
    CHECK (proof_level <> 'SNAPSHOT_PROVEN' OR snapshot_id IS NOT NULL)
);
CREATE INDEX catalogs_latest ON catalogs (source_id, measured_at DESC, id DESC);

-- Every request for a catalog, accepted or refused, for the release gate (R25): integrity
-- tasks accept only SNAPSHOT_PROVEN, and nobody accepts a catalog that needs reconciliation.
CREATE TABLE catalog_consumptions (
    id           bigserial   PRIMARY KEY,
    source_id    bigint      NOT NULL REFERENCES sources (id),
    catalog_id   bigint      REFERENCES catalogs (id),
    consumer     text        NOT NULL,
    purpose      text        NOT NULL CHECK (purpose IN ('integrity', 'display')),
    proof_level  text,
    outcome      text        NOT NULL CHECK (outcome IN ('ACCEPTED', 'REFUSED')),
    refusal      text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((outcome = 'REFUSED') = (refusal IS NOT NULL)),
    CHECK (outcome <> 'ACCEPTED' OR (catalog_id IS NOT NULL
        AND proof_level IN ('SNAPSHOT_PROVEN', 'SNAPSHOT_UNPROVEN')
        AND (purpose <> 'integrity' OR proof_level = 'SNAPSHOT_PROVEN')))
);
CREATE INDEX catalog_consumptions_gate ON catalog_consumptions (purpose, outcome, proof_level);
