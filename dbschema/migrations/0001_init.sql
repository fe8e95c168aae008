-- mcpsync ledger, first migration: the tables of the walking skeleton and the fences of
-- SPEC.md R9-R21. Every guarded transition is a single statement or transaction in
-- internal/ledger; this file only declares shape and constraints.

-- A source is one MCP server endpoint plus the subject it connects as.
CREATE TABLE sources (
    id                 bigserial PRIMARY KEY,
    name               text        NOT NULL UNIQUE,
    transport          text        NOT NULL CHECK (transport IN ('stdio', 'http')),
    command            text[],                       -- stdio: argv
    url                text,                         -- http: endpoint
    subject            text        NOT NULL DEFAULT 'default', -- authorization subject (R15)
    backstop_seconds   integer     NOT NULL DEFAULT 30 CHECK (backstop_seconds > 0),
    poll_seconds       integer     NOT NULL DEFAULT 30 CHECK (poll_seconds > 0),
    current_generation bigint      NOT NULL DEFAULT 0, -- newest session generation (R12)
    host_queue         text,                         -- task queue of the worker holding the session
    lease_until        timestamptz,                  -- host lease on this source
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((transport = 'stdio' AND command IS NOT NULL AND cardinality(command) > 0)
        OR (transport = 'http' AND url IS NOT NULL))
);

-- One row per MCP connection: the session generation and its capability receipt (R1, R9, R12).
CREATE TABLE sessions (
    source_id         bigint      NOT NULL REFERENCES sources (id),
    generation        bigint      NOT NULL,
    host_queue        text        NOT NULL,
    protocol_version  text        NOT NULL,
    cap_resources     boolean     NOT NULL,
    cap_subscribe     boolean     NOT NULL,
    cap_list_changed  boolean     NOT NULL,
    cap_snapshot_ids  boolean     NOT NULL DEFAULT false, -- negotiated snapshot-ID extension (R5)
    server_name       text        NOT NULL DEFAULT '',
    server_version    text        NOT NULL DEFAULT '',
    capabilities      jsonb,
    started_at        timestamptz NOT NULL DEFAULT now(),
    ended_at          timestamptz,
    end_reason        text,
    PRIMARY KEY (source_id, generation)
);

-- resourceSubscription.v1 (R9) plus the fence columns (R14-R21).
CREATE TABLE subscriptions (
    id                      bigserial PRIMARY KEY,
    principal               text        NOT NULL,
    source_id               bigint      NOT NULL REFERENCES sources (id),
    uri                     text        NOT NULL, -- normalized URI: the identity
    server_uri              text        NOT NULL, -- the server's own string, sent back in reads
    workflow_id             text        NOT NULL UNIQUE,
    state                   text        NOT NULL DEFAULT 'DISCOVERED' CHECK (state IN (
                                'DISCOVERED', 'SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING',
                                'UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED',
                                'RECONCILIATION_REQUIRED')),
    state_reason            text        NOT NULL DEFAULT '',
    generation              bigint      NOT NULL DEFAULT 1,  -- subscription generation
    session_generation      bigint      NOT NULL DEFAULT 0,  -- session the subscription is bound to
    last_issued_ordinal     bigint      NOT NULL DEFAULT 0,
    last_accepted_ordinal   bigint      NOT NULL DEFAULT 0,  -- the watermark (R16)
    last_accepted_digest    text,
    previous_accepted_digest text,                           -- digest the last accept replaced
    last_accepted_at        timestamptz,
    last_verified_at        timestamptz,                     -- last read that matched the digest
    last_notification_gen   bigint      NOT NULL DEFAULT 0,
    last_notification_seq   bigint      NOT NULL DEFAULT 0,
    close_ordinal           bigint,                          -- frozen by beginUnsubscribe (R18)
    close_epoch             bigint      NOT NULL DEFAULT 0,
    started_at              timestamptz NOT NULL DEFAULT now(),
    ended_at                timestamptz,
    updated_at              timestamptz NOT NULL DEFAULT now(),
    UNIQUE (principal, source_id, uri),
    CHECK (last_accepted_ordinal <= last_issued_ordinal),
    CHECK (close_ordinal IS NULL OR close_ordinal <= last_issued_ordinal)
);
CREATE INDEX subscriptions_source_state ON subscriptions (source_id, state);

-- Every resources/read dispatch: readOrdinal allocated by compare-and-set (R14).
CREATE TABLE read_dispatches (
    subscription_id     bigint      NOT NULL REFERENCES subscriptions (id),
    ordinal             bigint      NOT NULL,
    generation          bigint      NOT NULL,
    session_generation  bigint      NOT NULL,
    uri                 text        NOT NULL,
    request_id          text        NOT NULL,
    reason              text        NOT NULL CHECK (reason IN (
                            'notification', 'backstop', 'poll', 'session_change', 'initial',
                            'revalidate', 'reconcile')),
    issued_at           timestamptz NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    outcome             text,
    PRIMARY KEY (subscription_id, ordinal),
    UNIQUE (subscription_id, request_id)
);

-- Content-addressed bodies: history carries digests only.
CREATE TABLE content_blobs (
    digest      text        PRIMARY KEY, -- 'sha256:<hex>' of body
    mime_type   text        NOT NULL DEFAULT '',
    size        bigint      NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- resourceVersion.v1 (R15): one row per accepted version or tombstone.
CREATE TABLE resource_versions (
    id                  bigserial PRIMARY KEY,
    subscription_id     bigint      NOT NULL REFERENCES subscriptions (id),
    principal           text        NOT NULL,
    source_id           bigint      NOT NULL REFERENCES sources (id),
    uri                 text        NOT NULL,
    kind                text        NOT NULL DEFAULT 'content' CHECK (kind IN ('content', 'tombstone')),
    mime_type           text        NOT NULL DEFAULT '',
    digest              text,  -- NULL for a tombstone
    size                bigint      NOT NULL DEFAULT 0,
    read_ordinal        bigint      NOT NULL,
    generation          bigint      NOT NULL,
    session_generation  bigint      NOT NULL,
    request_id          text        NOT NULL,
    auth_subject        text        NOT NULL,
    server_name         text        NOT NULL DEFAULT '',
    server_version      text        NOT NULL DEFAULT '',
    last_modified       text, -- a hint from the server, never a substitute for the digest
    accepted_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (subscription_id, read_ordinal),
    CHECK ((kind = 'content') = (digest IS NOT NULL))
);

-- Every outcome of a guarded transition, accepted or refused, and every audited event.
CREATE TABLE receipts (
    id                  bigserial PRIMARY KEY,
    idem_key            text        UNIQUE, -- replaying the same call finds its first receipt
    kind                text        NOT NULL,
    source_id           bigint,
    subscription_id     bigint,
    generation          bigint,
    session_generation  bigint,
    read_ordinal        bigint,
    request_id          text,
    uri                 text,
    digest              text,
    detail              jsonb,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX receipts_subscription ON receipts (subscription_id, id);
CREATE INDEX receipts_kind ON receipts (kind);

-- Invalidation outbox. Consumers read in (txid, id) order and only below the oldest running
-- transaction, so a row committed late is never skipped.
CREATE TABLE invalidation_outbox (
    id                  bigserial PRIMARY KEY,
    txid                xid8        NOT NULL DEFAULT pg_current_xact_id(),
    kind                text        NOT NULL,
    idempotency_key     text        NOT NULL UNIQUE,
    subscription_id     bigint,
    principal           text,
    source_id           bigint,
    uri                 text,
    digest              text,
    read_ordinal        bigint,
    detail              jsonb,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX invalidation_outbox_order ON invalidation_outbox (txid, id);
