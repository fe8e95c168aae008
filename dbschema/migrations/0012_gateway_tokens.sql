-- mcpsync ledger, twelfth migration: gateway bearer tokens (issue 15 item 2).
-- A token names a principal to the MCP gateway. The ledger keeps only the SHA-256 of the
-- token (tokens are 32 random bytes, so a plain hash cannot be reversed by guessing); the
-- plaintext is shown once, by `mcpsync token create`. A token authenticates while it is not
-- revoked and not past expires_at; ledger.AuthenticateToken checks both in the statement
-- that finds it by hash.
CREATE TABLE gateway_tokens (
    id          text PRIMARY KEY CHECK (id ~ '^tok_[0-9a-f]{12}$'),
    principal   text NOT NULL CHECK (principal <> ''),
    token_hash  bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz CHECK (expires_at IS NULL OR expires_at > created_at),
    revoked_at  timestamptz
);

CREATE INDEX gateway_tokens_principal ON gateway_tokens (principal);
