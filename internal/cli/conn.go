package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// runEnv carries lazily opened connections. A command validates all of its input before it
// calls store or temporal, so that bad input is an ExitUsage whether or not a stack runs.
type runEnv struct {
	Env
	pool       *pgxpool.Pool
	ownsClient bool
}

// store opens the ledger (once) and checks its schema is the one this build speaks.
func (e *runEnv) store(ctx context.Context) (*ledger.Store, error) {
	if e.Store != nil {
		return e.Store, nil
	}
	// DATABASE_URL carries the ledger's password: no message quotes it unmasked (issue 14
	// item 3); ledger.OpenError masks it (pgx quotes the string it could not parse, masking
	// only what it recognises) and puts pgx's line per attempt on one line.
	pool, err := ledger.Open(ctx, e.Config.DatabaseURL, 5*time.Second)
	if err != nil {
		switch oe, _ := errors.AsType[*ledger.OpenError](err); {
		case oe != nil && oe.Kind == ledger.OpenMalformed:
			return nil, usageErr("DATABASE_URL is malformed: %v", err)
		case oe != nil && oe.Kind == ledger.OpenAuth:
			return nil, fmt.Errorf("ledger database refused the credentials of DATABASE_URL %s (%v); for mcpsync-dev's database, load its generated password: set -a; . .data/dev.env; set +a",
				redact.DSN(e.Config.DatabaseURL), err)
		}
		return nil, fmt.Errorf("ledger database unreachable (%v); is mcpsync-dev running? (make run) or set DATABASE_URL", err)
	}
	// The schema must be exactly the one this build speaks: mcpsync-worker applies migrations
	// at start, and a CLI racing it (or older or newer than it) must not half-work.
	have, err := dbschema.Version(ctx, pool)
	if err == nil {
		var want int
		if want, err = dbschema.Latest(); err == nil && have != want {
			switch {
			case have == 0:
				err = fmt.Errorf("ledger database has no mcpsync schema; start mcpsync-worker once to apply migrations")
			case have < want:
				err = fmt.Errorf("ledger schema is at version %d, this mcpsync needs %d; start mcpsync-worker to apply migrations", have, want)
			default:
				err = fmt.Errorf("ledger schema is at version %d, newer than this mcpsync (%d); upgrade mcpsync", have, want)
			}
		}
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	e.pool = pool
	e.Store = ledger.New(pool)
	return e.Store, nil
}

// temporal dials Temporal (once).
func (e *runEnv) temporal(ctx context.Context) (client.Client, error) {
	if e.Temporal != nil {
		return e.Temporal, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// TLS and API key from TEMPORAL_TLS_* and TEMPORAL_API_KEY (issue 17 item 1): a bad setting
	// or a refused handshake is one line naming the setting (config.ConfigError, DialError).
	c, err := e.Config.DialTemporal(dctx, client.Options{Logger: quietLogger{}})
	var de *config.DialError
	switch {
	case errors.As(err, &de) && de.Hint == "":
		return nil, fmt.Errorf("%v; is mcpsync-dev running? (make run) or set TEMPORAL_ADDRESS", err)
	case err != nil:
		return nil, err
	}
	e.Temporal, e.ownsClient = c, true
	return c, nil
}

// close closes what store and temporal opened.
func (e *runEnv) close() {
	if e.ownsClient {
		e.Temporal.Close()
	}
	if e.pool != nil {
		e.pool.Close()
	}
}

// storeSource opens the ledger and returns it with the source called name (a not-found error,
// exit 3, when there is none).
func (e *runEnv) storeSource(ctx context.Context, name string) (*ledger.Store, ledger.Source, error) {
	st, err := e.store(ctx)
	if err != nil {
		return nil, ledger.Source{}, err
	}
	src, err := sourceNamed(ctx, st, name)
	return st, src, err
}

// storeLiveSource is storeSource for the commands that act on a source's live state
// (subscribe, scan, source update, source login, grant): a removed source is refused with
// removedErr (exit 3, when it was removed and how to add it back).
func (e *runEnv) storeLiveSource(ctx context.Context, name string) (*ledger.Store, ledger.Source, error) {
	st, src, err := e.storeSource(ctx, name)
	if err == nil && src.RemovedAt != nil {
		err = removedErr(src)
	}
	return st, src, err
}

// sourceNamed returns the source called name, or a not-found error (exit 3) that says how to
// list the sources.
func sourceNamed(ctx context.Context, st *ledger.Store, name string) (ledger.Source, error) {
	src, err := st.SourceByName(ctx, name)
	if errors.Is(err, ledger.ErrNotFound) {
		return ledger.Source{}, notFoundErr("unknown source %q (see mcpsync source list)", name)
	}
	return src, err
}

// quietLogger silences the Temporal client's own logging in the CLI.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}
