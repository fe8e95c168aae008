-- mcpsync ledger, ninth migration: leases with expiry, renewal and fair spreading (issue 12,
-- defect 6). Every session host renews its row in hosts on each claim round; the hosts whose
-- alive_until is still ahead are the live hosts, among which the active sources are spread
-- (internal/ledger/leases.go).
CREATE TABLE hosts (
    queue       text        PRIMARY KEY,          -- the host's task queue, as in sources.host_queue
    alive_until timestamptz NOT NULL,             -- the host counts as live until then
    started_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX hosts_alive_until ON hosts (alive_until);

-- definition_version is bumped whenever a source's definition changes (`source update`); a
-- host running an older version restarts the source's session with the new definition.
ALTER TABLE sources ADD COLUMN definition_version bigint NOT NULL DEFAULT 0;
-- removed_at marks a removed source: it is never claimed, and a host holding it drops it.
ALTER TABLE sources ADD COLUMN removed_at timestamptz;

CREATE INDEX sources_host_queue ON sources (host_queue) WHERE host_queue IS NOT NULL;
