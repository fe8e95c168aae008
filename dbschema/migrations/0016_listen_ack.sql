-- mcpsync ledger, sixteenth migration: a subscription whose URI the server left out of its
-- subscriptions/listen acknowledgement (MCP 2026-07-28, issue 13 item 3) is not watched: it
-- refreshes by polling with the source's published staleness bound (R11), and status says
-- so. Activate records it for the session the subscription activates on; it is meaningful
-- only while session_generation is the live one (status and the gateway check that).
ALTER TABLE subscriptions ADD COLUMN not_acknowledged boolean NOT NULL DEFAULT false;
