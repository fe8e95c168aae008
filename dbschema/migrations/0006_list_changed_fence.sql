-- A list_changed recorded for a source fences the catalogs being published (SPEC.md R3, R6,
-- R25). ledger.InvalidateCatalogs counts every list_changed it records in
-- sources.list_changed_seq (and stamps list_changed_at), in the transaction that invalidates
-- the published catalogs; ledger.BeginScan copies the count into the round it opens; and
-- ledger.PublishCatalog publishes a catalog invalidated, with its re-check due at once, when
-- the source's count has moved since its round A began. A list_changed that arrives between
-- round B's end and the publication is so never lost.
ALTER TABLE sources
    ADD COLUMN list_changed_seq bigint      NOT NULL DEFAULT 0 CHECK (list_changed_seq >= 0),
    ADD COLUMN list_changed_at  timestamptz;

-- The source's list_changed_seq when the round began (in BeginScan's statement).
ALTER TABLE discovery_scans
    ADD COLUMN source_list_changed_seq bigint NOT NULL DEFAULT 0;
