-- mcpsync ledger, fifteenth migration: a complete round's entries may be stored after its end
-- (issue 16 item 5). Round A of a scan stores its entries while round B pages
-- (ledger.EndScanDeferred): round A ends COMPLETE with entries_scan_id NULL, and a second
-- transaction, holding A's row lock from before A's activity returns, writes the entries and
-- sets entries_scan_id. Readers of A's entries (a later round's EndScan, PublishCatalog) lock
-- the row FOR SHARE first and so wait for that transaction. If it fails, entries_scan_id stays
-- NULL: the next round of the same set stores its own entries, and no proven or unproven
-- catalog names a round without entries (the catalogs check is unchanged).
ALTER TABLE discovery_scans DROP CONSTRAINT discovery_scans_check;
ALTER TABLE discovery_scans ADD CONSTRAINT discovery_scans_complete_check
    CHECK (outcome <> 'COMPLETE' OR (set_digest IS NOT NULL AND ended_at IS NOT NULL));
