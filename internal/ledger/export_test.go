package ledger

import "context"

// SetEnsureLookupHook sets a function EnsureSubscription runs between its upsert and its
// look-up of an existing row; it returns a function that removes it.
func SetEnsureLookupHook(f func()) func() {
	testHookEnsureLookup = f
	return func() { testHookEnsureLookup = nil }
}

// RevokeGrantsStatement returns the statement with which Revoke revokes principal's grant on
// sourceID (0: on every source) as revocation revocationID, and its arguments.
func RevokeGrantsStatement(principal string, revocationID, sourceID int64) (string, []any) {
	return revokeGrantsStatement(principal, revocationID, sourceID)
}

// RevokeFollowUpStatements returns the statements with which Revoke, after the grants,
// invalidates the derived indexes and records the subscriptions of principal on sources, as
// revocation revocationID, with their arguments (named for test failures).
func RevokeFollowUpStatements(principal string, revocationID int64, sources []int64) map[string]struct {
	SQL  string
	Args []any
} {
	type statement = struct {
		SQL  string
		Args []any
	}
	invalidate, invalidateArgs := invalidateIndexesStatement(revocationID, principal, sources, nil)
	record, recordArgs := recordRevokedSubscriptionsStatement(revocationID, principal, sources)
	return map[string]statement{
		"invalidateIndexes":          {invalidate, invalidateArgs},
		"recordRevokedSubscriptions": {record, recordArgs},
	}
}

// LockedRow runs stmt as the answers that take a subscription's row lock run theirs.
func (s *Store) LockedRow(ctx context.Context, id int64, stmt string, args []any, dest ...any) error {
	return s.lockedRow(ctx, id, stmt, args, dest...)
}

// ChunkMax is the most entries one stored chunk of a catalog holds.
const ChunkMax = chunkMax

// OneLine is oneLine: OpenError's folding of a message over lines into one line.
func OneLine(msg string) string { return oneLine(msg) }
