// Package config reads the settings every mcpsync binary shares from the environment. The
// defaults match mcpsync-dev, so on the embedded default nothing needs setting.
package config

import (
	"fmt"
	"os"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// Defaults of the embedded development stack (mcpsync-dev). Its PostgreSQL requires the
// password mcpsync-dev generates at each start (scram-sha-256), so DefaultDatabaseURL reaches
// it only with that password supplied some other way (PGPASSWORD); the full URL is in
// <data-dir>/dev.env, which `make run` loads.
const (
	DefaultTemporalAddress = "127.0.0.1:7233"
	DefaultNamespace       = "default"
	DefaultDatabaseURL     = "postgres://postgres@127.0.0.1:55432/mcpsync?sslmode=disable"
)

// Env holds the shared settings. DatabaseURL may carry a password: print an Env with %v or
// %#v (String, GoString mask it), or use RedactedDatabaseURL, never the field itself.
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

// RedactedDatabaseURL is DatabaseURL with its password masked (URL and key=value forms), for
// messages and logs.
func (e Env) RedactedDatabaseURL() string { return redact.DSN(e.DatabaseURL) }

// String describes e with the database password masked.
func (e Env) String() string {
	return fmt.Sprintf("TEMPORAL_ADDRESS=%s TEMPORAL_NAMESPACE=%s DATABASE_URL=%s", e.TemporalAddress, e.Namespace, e.RedactedDatabaseURL())
}

// GoString is String, so that %#v masks the password too.
func (e Env) GoString() string { return "config.Env{" + e.String() + "}" }
