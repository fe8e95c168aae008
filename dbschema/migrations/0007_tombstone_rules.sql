-- mcpsync ledger, seventh migration: how deletions are confirmed (SPEC.md R7, R21, R25).
--
-- A catalog that confirms a deletion (ledger.ConfirmTombstone) is consumed for a per-URI
-- fact, not for a complete enumeration: every such use, accepted or refused, is recorded in
-- catalog_consumptions with purpose 'tombstone' and the subscription it was for, in the
-- confirmation's own statement, so the release gate counts it (R25).
ALTER TABLE catalog_consumptions DROP CONSTRAINT catalog_consumptions_purpose_check;
ALTER TABLE catalog_consumptions
    ADD CONSTRAINT catalog_consumptions_purpose_check CHECK (purpose IN ('integrity', 'display', 'tombstone')),
    ADD COLUMN subscription_id bigint REFERENCES subscriptions (id),
    ADD CONSTRAINT catalog_consumptions_tombstone_subscription
        CHECK ((purpose = 'tombstone') = (subscription_id IS NOT NULL));

-- Whether the URI template tpl (RFC 6570) can produce uri. A level-1 expression {var}
-- percent-encodes every reserved character, so it stands for one or more characters other
-- than '/', '?' and '#'; every other expression ({+var}, {#var}, {/var}, {.var}, {;var},
-- {?var}, {&var}, several variables, modifiers) stands for any text, so the match errs
-- towards "can produce". Letters compare case-insensitively, for the same reason. Outside
-- expressions every character is literal (an unbalanced brace too).
CREATE FUNCTION mcpsync_uri_template_matches(tpl text, uri text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT uri ~* ('^' || regexp_replace(regexp_replace(regexp_replace(
               regexp_replace(tpl, '([.^$*+?()\[\]\\|])', '\\\1', 'g'),
               '\{[A-Za-z0-9_%]+\}', '[^/?#]+', 'g'),
               '\{[^}]*\}', '.*', 'g'),
               '([{}])', '\\\1', 'g') || '$')
$$;
