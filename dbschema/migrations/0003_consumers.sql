-- mcpsync ledger, third migration: the consumers of accepted versions (SPEC.md R22, R23 "cache
-- hit after permission revocation", R24, R29). Grants say which principal may read which
-- source; every read that leaves the ledger joins the grant, under a row lock, in the same
-- statement that returns the content (internal/ledger/lineage.go), and a revocation updates
-- that row, so no read can straddle a revocation. Derived indexes record the versions they
-- took (lineage); a revocation invalidates them in the transaction that revokes the grant and
-- writes one invalidation outbox row per index. Named consumers read the outbox with stored
-- offsets and are woken by NOTIFY.

-- One revocation: the grants it ended, the subscriptions it closed and the indexes it
-- invalidated are in the tables below, keyed by its id.
CREATE TABLE revocations (
    id          bigserial   PRIMARY KEY,
    principal   text        NOT NULL,
    source_id   bigint      REFERENCES sources (id), -- NULL: every source of the principal
    reason      text        NOT NULL DEFAULT '',
    revoked_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX revocations_principal ON revocations (principal, id);

-- A principal may read (and subscribe to) a source while its grant stands, i.e. while
-- revoked_at is NULL. A revocation keeps the row and marks it; a later grant stands again
-- under the next epoch.
CREATE TABLE grants (
    principal     text        NOT NULL CHECK (principal <> ''),
    source_id     bigint      NOT NULL REFERENCES sources (id),
    epoch         bigint      NOT NULL DEFAULT 1 CHECK (epoch > 0),
    granted_at    timestamptz NOT NULL DEFAULT now(),
    granted_by    text        NOT NULL DEFAULT '',
    revoked_at    timestamptz,
    revocation_id bigint      REFERENCES revocations (id),
    PRIMARY KEY (principal, source_id),
    CHECK ((revoked_at IS NULL) = (revocation_id IS NULL))
);
CREATE INDEX grants_source ON grants (source_id);

-- The grants a revocation ended (the epoch names which standing of the grant).
CREATE TABLE revocation_grants (
    revocation_id bigint NOT NULL REFERENCES revocations (id),
    source_id     bigint NOT NULL REFERENCES sources (id),
    grant_epoch   bigint NOT NULL,
    PRIMARY KEY (revocation_id, source_id)
);

-- The subscriptions a revocation told to pass the close fence, with their state at the time.
CREATE TABLE revocation_subscriptions (
    revocation_id       bigint NOT NULL REFERENCES revocations (id),
    subscription_id     bigint NOT NULL REFERENCES subscriptions (id),
    workflow_id         text   NOT NULL,
    state_at_revocation text   NOT NULL,
    PRIMARY KEY (revocation_id, subscription_id)
);

-- Output guard verdicts (R22): a verdict is a function of the content and the guard policy,
-- so it is stored once per (digest, policy). The bytes that may reach a model are the blob
-- named by delivered_digest: the content itself, or its sanitized form.
CREATE TABLE guard_verdicts (
    digest           text        NOT NULL REFERENCES content_blobs (digest),
    policy_id        text        NOT NULL,
    policy           text        NOT NULL, -- human-readable description of the policy
    outcome          text        NOT NULL CHECK (outcome IN ('PASS', 'SANITIZED', 'REJECTED')),
    reasons          text[]      NOT NULL DEFAULT '{}',
    delivered_digest text        REFERENCES content_blobs (digest),
    stripped         integer     NOT NULL DEFAULT 0 CHECK (stripped >= 0),
    checked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (digest, policy_id),
    CHECK ((outcome = 'REJECTED') = (delivered_digest IS NULL)),
    CHECK (outcome <> 'PASS' OR delivered_digest = digest)
);

-- Derived-index lineage (R24): which version each named index took, through which principal
-- and grant epoch. A revocation stamps the live rows of its principal and sources with its id;
-- a stamped row is history, and taking the version again after a new grant makes a new row.
CREATE TABLE index_lineage (
    id               bigserial   PRIMARY KEY,
    index_name       text        NOT NULL CHECK (index_name <> ''),
    principal        text        NOT NULL,
    source_id        bigint      NOT NULL REFERENCES sources (id),
    subscription_id  bigint      NOT NULL REFERENCES subscriptions (id),
    uri              text        NOT NULL,
    version_id       bigint      NOT NULL REFERENCES resource_versions (id),
    read_ordinal     bigint      NOT NULL,
    digest           text        NOT NULL,
    delivered_digest text        NOT NULL,
    policy_id        text        NOT NULL,
    grant_epoch      bigint      NOT NULL,
    first_taken_at   timestamptz NOT NULL DEFAULT now(),
    last_taken_at    timestamptz NOT NULL DEFAULT now(),
    takes            bigint      NOT NULL DEFAULT 1,
    revocation_id    bigint      REFERENCES revocations (id),
    invalidated_at   timestamptz,
    CHECK ((revocation_id IS NULL) = (invalidated_at IS NULL))
);
CREATE UNIQUE INDEX index_lineage_live ON index_lineage (index_name, principal, version_id)
    WHERE revocation_id IS NULL;
CREATE INDEX index_lineage_principal ON index_lineage (principal, source_id) WHERE revocation_id IS NULL;
CREATE INDEX index_lineage_revocation ON index_lineage (revocation_id) WHERE revocation_id IS NOT NULL;

-- The indexes a revocation invalidated, with the outbox row that tells each of them.
CREATE TABLE revocation_indexes (
    revocation_id bigint  NOT NULL REFERENCES revocations (id),
    index_name    text    NOT NULL,
    entries       integer NOT NULL,
    outbox_key    text    NOT NULL UNIQUE, -- invalidation_outbox.idempotency_key
    PRIMARY KEY (revocation_id, index_name)
);

-- Named outbox consumers and their committed offsets, in the outbox's (txid, id) order.
CREATE TABLE outbox_consumers (
    name       text        PRIMARY KEY CHECK (name <> ''),
    txid       xid8        NOT NULL DEFAULT '0',
    last_id    bigint      NOT NULL DEFAULT 0,
    delivered  bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Adding a source grants it to the `default` principal.
CREATE FUNCTION grant_source_to_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO grants (principal, source_id, granted_by) VALUES ('default', NEW.id, 'source add')
    ON CONFLICT (principal, source_id) DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER sources_grant_default AFTER INSERT ON sources
    FOR EACH ROW EXECUTE FUNCTION grant_source_to_default();

-- Existing ledgers: the default principal keeps its sources, and every principal keeps the
-- sources it already subscribed to.
INSERT INTO grants (principal, source_id, granted_by)
    SELECT 'default', id, 'migration' FROM sources
    ON CONFLICT (principal, source_id) DO NOTHING;
INSERT INTO grants (principal, source_id, granted_by)
    SELECT DISTINCT principal, source_id, 'migration' FROM subscriptions
    ON CONFLICT (principal, source_id) DO NOTHING;

-- Wake-ups for outbox consumers. A transaction that notifies holds a server-wide lock from
-- its pre-commit until its commit is done, WAL flush included (PostgreSQL keeps the
-- notification queue in commit order), so notifying from the accept path would serialize
-- every accept's commit (measured by bench/ledger, fsync on: 611
-- allocate+accept pairs/s with a NOTIFY per accept, 1131 without). Only the kinds listed here
-- notify: by default the revocation rows (rare, and R29 bounds their latency). Rows of other
-- kinds reach a follower on its fallback poll, or sooner when any wake-up comes. Inserting a
-- kind here (e.g. 'version') makes its rows prompt at that cost.
CREATE TABLE outbox_notify_kinds (
    kind text PRIMARY KEY
);
INSERT INTO outbox_notify_kinds (kind) VALUES ('revocation'), ('index_invalidation');

-- One NOTIFY per statement that inserted rows of a notifying kind, sent at commit (Postgres
-- folds duplicates within a transaction). The payload is empty: consumers read the rows
-- themselves, in commit-safe order.
CREATE FUNCTION notify_invalidation_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted i JOIN outbox_notify_kinds k ON k.kind = i.kind) THEN
        PERFORM pg_notify('mcpsync_outbox', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER invalidation_outbox_notify AFTER INSERT ON invalidation_outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION notify_invalidation_outbox();
