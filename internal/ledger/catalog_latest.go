package ledger

import (
	"context"
	"fmt"
)

// LatestCatalog returns the newest catalog of a source (the first of Catalogs: newest
// measurement, then highest ID), or ErrNotFound when none was published. One indexed row,
// for callers that list on every request (the gateway's resources/list).
func (s *Store) LatestCatalog(ctx context.Context, sourceID int64) (Catalog, error) {
	c, err := scanCatalog(s.pool.QueryRow(ctx, `SELECT `+catalogColumns+`
		FROM catalogs c JOIN sources so ON so.id = c.source_id
		WHERE c.source_id = $1 ORDER BY c.measured_at DESC, c.id DESC LIMIT 1`, sourceID))
	if err != nil {
		return Catalog{}, notFound(err, fmt.Sprintf("ledger: latest catalog of source %d", sourceID))
	}
	return c, nil
}
