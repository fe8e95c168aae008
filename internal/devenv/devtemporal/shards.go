package devtemporal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"go.temporal.io/server/common/config"
	tlog "go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/persistence"
	"go.temporal.io/server/common/persistence/serialization"
	persql "go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	"go.temporal.io/server/common/resolver"
	"go.uber.org/zap"
)

// DefaultHistoryShards is the number of history shards Start gives a cluster it creates on p
// when Options.HistoryShards is 0. A shard serialises the history service's work on the
// workflows it owns, so more shards let updates to different workflows overlap — when the
// store can take the writes in parallel. Chosen by measurement (internal/devenv/devtemporal/
// internal/shardsweep and bench/persistence, floor workload, 300 entity workflows, on 2 cores
// loaded by other work, so the spread is wide; issue 16 item 2):
//   - PostgreSQL: 4. Offered 50/s, 1 shard accepted 20-29/s, 4 shards with
//     DefaultShardIOConcurrency 29-49/s (mean 38 over 4 runs), 8 shards 39-49/s (mean 44,
//     within the spread of 4); bench/persistence offered 120/s: 76/s with p99 11.2 s on 1
//     shard, 115/s with p99 2.3 s on 4.
//   - SQLite file: 1, as before. Its plugin has one connection, the bottleneck either way:
//     offered 120/s, 1 shard accepted 86-103/s, 4 shards 91/s and 97/s in two runs but 8-70/s
//     in three others; no run showed a gain beyond the spread.
func DefaultHistoryShards(p Persistence) int32 {
	if p == PersistencePostgres {
		return 4
	}
	return 1
}

// DefaultShardIOConcurrency is history.shardIOConcurrency, the persistence operations one
// shard may have in flight, on p when Options.ShardIOConcurrency is 0 (the server's own
// default is 1). PostgreSQL: 8 (with 4 shards, offered 50/s, a mean 38/s accepted against 34/s
// with 1). SQLite: 1, as before (one connection takes one operation at a time anyway).
func DefaultShardIOConcurrency(p Persistence) int {
	if p == PersistencePostgres {
		return 8
	}
	return 1
}

// storedShardCount reads the history shard count recorded in cfg's cluster metadata when the
// cluster was created; ok is false when the persistence holds no cluster yet (a new one).
func storedShardCount(cfg *config.SQL, logger tlog.Logger) (count int32, ok bool, err error) {
	db, err := persql.NewSQLDB(sqlplugin.DbKindMain, cfg, resolver.NewNoopResolver(), logger, metrics.NoopMetricsHandler)
	if err != nil {
		return 0, false, fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = db.Close() }()
	row, err := db.GetClusterMetadata(context.Background(), &sqlplugin.ClusterMetadataFilter{ClusterName: clusterName})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, fmt.Errorf("read cluster metadata: %w", err)
	}
	md, err := serialization.NewSerializer().DeserializeClusterMetadata(persistence.NewDataBlob(row.Data, row.DataEncoding))
	if err != nil {
		return 0, false, fmt.Errorf("decode cluster metadata: %w", err)
	}
	if md.GetHistoryShardCount() <= 0 {
		return 0, false, fmt.Errorf("cluster metadata records %d history shards", md.GetHistoryShardCount())
	}
	return md.GetHistoryShardCount(), true, nil
}

// historyShards is the shard count the server must run with: the one the persistence was
// created with when it holds a cluster (the count is fixed at creation: every workflow lives
// on the shard its ID hashes to under that count), else want. A stored count that differs
// from want is used and logged in one line.
func (s *Server) historyShards(cfg *config.SQL, want int32, logger tlog.Logger) (int32, error) {
	stored, ok, err := storedShardCount(cfg, logger)
	if err != nil {
		return 0, fmt.Errorf("history shard count of %s: %w", s.store, err)
	}
	if !ok {
		return want, nil
	}
	if stored != want {
		s.log.Warn("Temporal persistence was created with another history shard count, which is fixed at creation: using it (a new data directory or database gets the configured count)",
			zap.Int32("historyShards", stored), zap.Int32("configured", want), zap.String("db", s.store))
	}
	return stored, nil
}
