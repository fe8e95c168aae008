// Package config reads the settings every mcpsync binary shares from the environment. The
// defaults match mcpsync-dev, so on the embedded default nothing needs setting.
package config

import "os"

// Defaults of the embedded development stack (mcpsync-dev).
const (
	DefaultTemporalAddress = "127.0.0.1:7233"
	DefaultNamespace       = "default"
	DefaultDatabaseURL     = "postgres://postgres@127.0.0.1:55432/mcpsync?sslmode=disable"
)

// Env holds the shared settings.
type Env struct {
	TemporalAddress string // TEMPORAL_ADDRESS
	Namespace       string // TEMPORAL_NAMESPACE
	DatabaseURL     string // DATABASE_URL
}

// FromEnv reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE and DATABASE_URL, falling back to the
// mcpsync-dev defaults.
func FromEnv() Env {
	return Env{
		TemporalAddress: get("TEMPORAL_ADDRESS", DefaultTemporalAddress),
		Namespace:       get("TEMPORAL_NAMESPACE", DefaultNamespace),
		DatabaseURL:     get("DATABASE_URL", DefaultDatabaseURL),
	}
}

func get(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
