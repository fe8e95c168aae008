-- mcpsync ledger, eleventh migration: retention (issue 17 item 6, SPEC.md "Retention").
-- ledger.Prune deletes, in bounded batches, rows no fence, consumer or derived index needs.
-- Each batch is one statement whose WHERE carries the whole keep-condition; these indexes let
-- those conditions be checked per row without scanning whole tables.

-- A version is kept while an invalidation outbox row of it exists (the R24 check "orphan
-- invalidation" pairs them by subscription and read ordinal).
CREATE INDEX invalidation_outbox_subscription_ordinal ON invalidation_outbox (subscription_id, read_ordinal)
    WHERE subscription_id IS NOT NULL;

-- A version is kept while a derived index's lineage names it (live or revoked: the lineage is
-- the trace of R24 and references the version).
CREATE INDEX index_lineage_version ON index_lineage (version_id);

-- A blob and its guard verdicts are kept while a version, a verdict or a lineage entry names
-- its digest.
CREATE INDEX resource_versions_digest ON resource_versions (digest) WHERE digest IS NOT NULL;
CREATE INDEX guard_verdicts_delivered ON guard_verdicts (delivered_digest) WHERE delivered_digest IS NOT NULL;
CREATE INDEX index_lineage_digest ON index_lineage (digest);
CREATE INDEX index_lineage_delivered ON index_lineage (delivered_digest);

-- A scan is kept while a catalog or another scan names it.
CREATE INDEX catalogs_entries_scan ON catalogs (entries_scan_id) WHERE entries_scan_id IS NOT NULL;
CREATE INDEX discovery_scans_entries ON discovery_scans (entries_scan_id) WHERE entries_scan_id IS NOT NULL;
CREATE INDEX catalog_consumptions_catalog ON catalog_consumptions (catalog_id) WHERE catalog_id IS NOT NULL;
CREATE INDEX catalogs_basis_scans ON catalogs USING gin (basis_scan_ids);
