// Package config reads the settings every mcpsync binary shares from the environment. The
// defaults match mcpsync-dev, so on the embedded default nothing needs setting.
package config

import (
	"context"
	"flag"
	"fmt"
	"os"

	"go.temporal.io/sdk/client"

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

// Env holds the shared settings. DatabaseURL may carry a password and Temporal.APIKey is a
// secret: print an Env with %v or %#v (String, GoString mask both), or use
// RedactedDatabaseURL, never the fields themselves.
type Env struct {
	TemporalAddress string // TEMPORAL_ADDRESS
	Namespace       string // TEMPORAL_NAMESPACE
	DatabaseURL     string // DATABASE_URL
	// Temporal is TLS and the API key (TEMPORAL_TLS_*, TEMPORAL_API_KEY; issue 17 item 1).
	Temporal TemporalConn
}

// FromEnv reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, DATABASE_URL, TEMPORAL_TLS_CERT,
// TEMPORAL_TLS_KEY, TEMPORAL_TLS_CA, TEMPORAL_TLS_SERVER_NAME, TEMPORAL_TLS and
// TEMPORAL_API_KEY, falling back to the mcpsync-dev defaults (plain text, no credentials).
func FromEnv() Env {
	return Env{
		TemporalAddress: get("TEMPORAL_ADDRESS", DefaultTemporalAddress),
		Namespace:       get("TEMPORAL_NAMESPACE", DefaultNamespace),
		DatabaseURL:     get("DATABASE_URL", DefaultDatabaseURL),
		Temporal:        temporalConnFromEnv(),
	}
}

// TemporalFlags registers --temporal-address and --temporal-namespace, then the TLS flags of
// TemporalConn.Flags, on fs; each defaults to e's current value, so a flag overrides its
// environment variable.
func (e *Env) TemporalFlags(fs *flag.FlagSet) {
	fs.StringVar(&e.TemporalAddress, "temporal-address", e.TemporalAddress, "Temporal frontend host:port (TEMPORAL_ADDRESS)")
	fs.StringVar(&e.Namespace, "temporal-namespace", e.Namespace, "Temporal namespace (TEMPORAL_NAMESPACE)")
	e.Temporal.Flags(fs)
}

// DialTemporal connects to TemporalAddress in Namespace with the TLS and API-key settings
// (TemporalConn.Dial), on top of base (logger, interceptors).
func (e Env) DialTemporal(ctx context.Context, base client.Options) (client.Client, error) {
	return e.Temporal.Dial(ctx, e.TemporalAddress, e.Namespace, base)
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

// String describes e with the database password and the API key masked.
func (e Env) String() string {
	s := fmt.Sprintf("TEMPORAL_ADDRESS=%s TEMPORAL_NAMESPACE=%s DATABASE_URL=%s", e.TemporalAddress, e.Namespace, e.RedactedDatabaseURL())
	if t := e.Temporal.String(); t != "" {
		s += " " + t
	}
	return s
}

// GoString is String, so that %#v masks the password too.
func (e Env) GoString() string { return "config.Env{" + e.String() + "}" }
