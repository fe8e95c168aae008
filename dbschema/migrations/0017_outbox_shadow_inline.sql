-- mcpsync ledger, seventeenth migration: the outbox's shadow mark (R30) at the cost of an
-- expression. The trigger called mcpsync_published, a SQL function whose body reads the
-- roll-out row; such a function is never inlined, so PostgreSQL parsed and planned its body
-- again for every outbox row: about a fifth of the acceptance statement's time (issue 16,
-- measured with pg_stat_statements: the body planned once per call, 0.12 ms to plan and
-- 0.05 ms to run, under a trigger statement of 0.27 ms). The rule now lives in one
-- IMMUTABLE expression function of the roll-out's mode and percentage, which PostgreSQL
-- inlines; mcpsync_published and the trigger both apply it, and the trigger's statement (one
-- join of the subscription and the roll-out row) is planned once per session by PL/pgSQL.

-- Whether a subscription with this workflow ID is published under the given roll-out: live
-- mode and inside the percentage.
CREATE FUNCTION mcpsync_published_under(mode text, refresh_percent integer, workflow_id text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT mode = 'live' AND mcpsync_rollout_bucket(workflow_id) < refresh_percent $$;

CREATE OR REPLACE FUNCTION mcpsync_published(workflow_id text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT mcpsync_published_under(r.mode, r.refresh_percent, workflow_id) FROM rollout r $$;

CREATE OR REPLACE FUNCTION mcpsync_outbox_shadow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind IN ('version', 'tombstone') AND NEW.subscription_id IS NOT NULL THEN
        SELECT NOT mcpsync_published_under(r.mode, r.refresh_percent, s.workflow_id) INTO NEW.shadow
        FROM subscriptions s CROSS JOIN rollout r WHERE s.id = NEW.subscription_id;
    END IF;
    RETURN NEW;
END $$;
