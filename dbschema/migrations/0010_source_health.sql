-- mcpsync ledger, tenth migration: source health (issue 14, item 2). One row per source that a
-- host has reported on: the session state of the host that holds the source's lease, since
-- when, the last error with its time (redacted and bounded by the writer, bounded here too),
-- when the next connection attempt is due, and how many reconnection attempts were made. The
-- generation and the era (protocol version) are not repeated here: they are the source's
-- current_generation and its sessions row.
--
-- Only the host holding the lease writes a row (ledger.SetSourceHealth: one statement whose
-- WHERE carries host_queue = the writer AND a live lease), so a host that lost its lease cannot
-- overwrite what its successor reports.
CREATE TABLE source_health (
    source_id       bigint      PRIMARY KEY REFERENCES sources (id) ON DELETE CASCADE,
    state           text        NOT NULL
                    CHECK (state IN ('CONNECTING', 'LIVE', 'BACKOFF', 'AUTH_FAILED', 'FAILED')),
    state_since     timestamptz NOT NULL,
    host_queue      text        NOT NULL,            -- the host that reported the state
    last_error      text        CHECK (octet_length(last_error) <= 512),
    last_error_at   timestamptz,
    next_attempt_at timestamptz,                     -- BACKOFF, AUTH_FAILED, FAILED: next connect
    reconnects      bigint      NOT NULL DEFAULT 0 CHECK (reconnects >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((last_error IS NULL) = (last_error_at IS NULL))
);
