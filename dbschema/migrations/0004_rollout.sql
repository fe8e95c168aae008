-- Roll-out controls (R30): shadow mode, a refresh percentage, and a roll-back that keeps every
-- watermark and close receipt. The fences (ordinals, close, sessions, generations) always run;
-- the roll-out only decides which subscriptions' versions reach consumers ("published").

CREATE TABLE rollout (
    id              integer     PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    mode            text        NOT NULL DEFAULT 'live' CHECK (mode IN ('shadow', 'live')),
    refresh_percent integer     NOT NULL DEFAULT 100 CHECK (refresh_percent BETWEEN 0 AND 100),
    reason          text        NOT NULL DEFAULT '',
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO rollout DEFAULT VALUES;

CREATE TABLE rollout_history (
    id              bigserial   PRIMARY KEY,
    mode            text        NOT NULL,
    refresh_percent integer     NOT NULL,
    reason          text        NOT NULL,
    watermarks      bigint      NOT NULL, -- subscriptions with an accepted watermark at the change
    close_receipts  bigint      NOT NULL, -- close-fence receipts at the change
    changed_at      timestamptz NOT NULL DEFAULT now()
);

-- A subscription's roll-out bucket: a stable number 0..99 from its workflow ID.
CREATE FUNCTION mcpsync_rollout_bucket(workflow_id text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (('x' || substr(md5(workflow_id), 1, 7))::bit(28)::integer % 100) $$;

-- Whether a subscription's versions reach consumers now: live mode and inside the percentage.
CREATE FUNCTION mcpsync_published(workflow_id text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT r.mode = 'live' AND mcpsync_rollout_bucket(workflow_id) < r.refresh_percent FROM rollout r $$;

-- Invalidations of versions accepted while their subscription was not published are kept (the
-- fences ran) but marked shadow: consumers skip them.
ALTER TABLE invalidation_outbox ADD COLUMN shadow boolean NOT NULL DEFAULT false;

CREATE FUNCTION mcpsync_outbox_shadow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind IN ('version', 'tombstone') AND NEW.subscription_id IS NOT NULL THEN
        SELECT NOT mcpsync_published(s.workflow_id) INTO NEW.shadow FROM subscriptions s WHERE s.id = NEW.subscription_id;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER invalidation_outbox_shadow BEFORE INSERT ON invalidation_outbox
    FOR EACH ROW EXECUTE FUNCTION mcpsync_outbox_shadow();
