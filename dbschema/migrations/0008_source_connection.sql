-- mcpsync ledger, eighth migration: how a worker connects to a source (issue: reach real
-- servers safely). The column holds ledger.Connection as JSON: literal non-secret HTTP headers,
-- and only references to secrets (environment variable names, file paths), never a secret.
ALTER TABLE sources ADD COLUMN connection jsonb NOT NULL DEFAULT '{}';
