-- Routing a notification looks subscriptions up by (source, normalized URI); the unique key
-- leads with the principal, so give the lookup an index of its own.
CREATE INDEX subscriptions_source_uri ON subscriptions (source_id, uri);
