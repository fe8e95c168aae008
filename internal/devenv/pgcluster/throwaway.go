package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Throwaway starts a private cluster in a new temporary directory named after prefix, with the
// server's default durability settings (fsync and synchronous commit on) and max_connections
// 100, installing PostgreSQL first if it is missing. It returns the admin URL and the function
// that stops the cluster and removes its data; benchmarks use it so that they need no database.
func Throwaway(ctx context.Context, prefix string) (adminURL string, stop func(), err error) {
	if err := EnsureInstalled(ctx, nil); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	c, err := Start(ctx, Options{DataDir: filepath.Join(dir, "pg"),
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
