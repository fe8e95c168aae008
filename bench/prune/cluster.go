package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
)

// privateCluster starts a throwaway cluster with the server's default durability settings (as
// bench/ledger does, so that `make bench` needs no database) and returns its admin URL and
// the function that stops and removes it.
func privateCluster(ctx context.Context) (string, func(), error) {
	if err := pgcluster.EnsureInstalled(ctx, nil); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "mcpsync-prunebench-")
	if err != nil {
		return "", nil, err
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: filepath.Join(dir, "pg"),
		Settings: map[string]string{"max_connections": "100"}})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("private cluster: %w", err)
	}
	return c.AdminURL(), func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = c.Stop(sctx)
		_ = c.RemoveData()
		os.RemoveAll(dir)
	}, nil
}
