package devtemporal

import (
	"bytes"
	"cmp"
	"context"
	"crypto/md5" //nolint:gosec // the schema tool's manifest checksum, not a security use
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.temporal.io/server/common/config"
	tlog "go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/persistence"
	persql "go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	pgplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql"
	"go.temporal.io/server/common/resolver"
	dbschema "go.temporal.io/server/schema"
	pgschema "go.temporal.io/server/schema/postgresql/v12"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// Persistence names where the embedded server keeps its state.
type Persistence string

const (
	// PersistenceSQLite keeps every store in one SQLite file under Options.DataDir (rollback
	// journal, synchronous writes).
	PersistenceSQLite Persistence = "sqlite"
	// PersistencePostgres keeps the main store and the visibility store in two databases of a
	// PostgreSQL server (Options.Postgres), with the server's own schema and SQL plugin.
	PersistencePostgres Persistence = "postgres"
)

// DefaultPersistence is where `make run`'s mcpsync-dev keeps Temporal's state unless
// --temporal-persistence says otherwise (a data directory that already holds a SQLite store
// keeps it), and what the benches measure as "the embedded default". Chosen by measurement
// (bench/persistence, issue 16 item 2; quiet, 2 cores, floor workload of 1,000 entity
// workflows at 150 updates/s, in one `make bench` run): PostgreSQL with 4 history shards and
// shardIOConcurrency 8 kept up, 150 /s with p50 6.4 ms and p99 205 ms, while the SQLite file
// (one connection in Temporal's plugin, so one shard) reached 127.8 /s with p99 2.4 s; both
// durable. Rerun the bench before changing it.
const DefaultPersistence = PersistencePostgres

// ParsePersistence accepts "sqlite" or "postgres" (also "postgresql"); anything else is an
// error naming the choices.
func ParsePersistence(s string) (Persistence, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case string(PersistenceSQLite):
		return PersistenceSQLite, nil
	case string(PersistencePostgres), "postgresql":
		return PersistencePostgres, nil
	}
	return "", fmt.Errorf("unknown Temporal persistence %q (want sqlite or postgres)", s)
}

// Default names of the two databases PersistencePostgres uses.
const (
	DefaultPostgresDatabase           = "temporal"
	DefaultPostgresVisibilityDatabase = "temporal_visibility"
)

// ErrDatabaseInUse reports that another server already runs on the same PostgreSQL database.
//
//lint:ignore ST1005 "Temporal" is a proper noun.
var ErrDatabaseInUse = errors.New("Temporal database is in use by another server")

// Postgres configures PersistencePostgres.
type Postgres struct {
	// URL is a postgres://user:password@host:port/db?sslmode=... URL of the server; its
	// database is only used to create Database and VisibilityDatabase when missing (the user
	// needs CREATEDB then). Its query parameters (sslmode, sslrootcert, ...) are passed on to
	// the server's connections. Required.
	URL string
	// Database holds the main store (default DefaultPostgresDatabase).
	Database string
	// VisibilityDatabase holds the visibility store (default
	// DefaultPostgresVisibilityDatabase); it must differ from Database, since both schemas keep
	// their version in a table of the same name.
	VisibilityDatabase string
	// MaxConns bounds each store's connection pool (default 20).
	MaxConns int
}

// pgTarget is Postgres resolved: the Temporal SQL configs of both stores.
type pgTarget struct {
	admin      string // URL of the admin database
	main       *config.SQL
	visibility *config.SQL
}

func (p *Postgres) resolve() (*pgTarget, error) {
	if p == nil || p.URL == "" {
		return nil, errors.New("PostgreSQL persistence needs Options.Postgres.URL")
	}
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return nil, fmt.Errorf("PostgreSQL URL %s: want postgres://user:password@host:port/database", redact.Text(p.URL))
	}
	main, vis := p.Database, p.VisibilityDatabase
	if main == "" {
		main = DefaultPostgresDatabase
	}
	if vis == "" {
		vis = DefaultPostgresVisibilityDatabase
	}
	if main == vis {
		return nil, fmt.Errorf("PostgreSQL databases: main and visibility store are both %q; they must differ", main)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "5432")
	}
	password, _ := u.User.Password()
	attrs := map[string]string{}
	for k, vs := range u.Query() {
		if len(vs) > 0 {
			attrs[k] = vs[len(vs)-1]
		}
	}
	maxConns := p.MaxConns
	if maxConns <= 0 {
		maxConns = 20
	}
	store := func(db string) *config.SQL {
		return &config.SQL{
			PluginName:        pgplugin.PluginNamePGX,
			DatabaseName:      db,
			ConnectAddr:       addr,
			ConnectProtocol:   "tcp",
			User:              u.User.Username(),
			Password:          password,
			ConnectAttributes: attrs,
			MaxConns:          maxConns,
			MaxIdleConns:      maxConns,
			MaxConnLifetime:   time.Hour,
		}
	}
	return &pgTarget{admin: p.URL, main: store(main), visibility: store(vis)}, nil
}

// dbURL is the admin URL pointed at database db.
func (t *pgTarget) dbURL(db string) string {
	u, _ := url.Parse(t.admin) // parsed before in resolve
	u.Path, u.RawPath = "/"+db, ""
	return u.String()
}

// describe names the two databases, password masked.
func (t *pgTarget) describe() string {
	return redact.Text(t.dbURL(t.main.DatabaseName)) + " (visibility: " + t.visibility.DatabaseName + ")"
}

// preparePostgres creates both databases when missing, takes the server lock (an advisory
// lock held on its own connection until Stop), brings both schemas to the versions this
// server ships (schema_version tells what is applied, so a restart applies nothing) and creates
// the namespace when it is missing. The visibility table's slot indexes are made partial
// (leanVisibilityIndexes).
func (s *Server) preparePostgres(ctx context.Context, opts Options) (main, vis *config.SQL, err error) {
	t, err := opts.Postgres.resolve()
	if err != nil {
		return nil, nil, err
	}
	s.store = t.describe()
	for _, db := range []string{t.main.DatabaseName, t.visibility.DatabaseName} {
		if err := createDatabase(ctx, t.admin, db); err != nil {
			return nil, nil, err
		}
	}
	if s.pgLock, err = lockDatabase(ctx, t.dbURL(t.main.DatabaseName)); err != nil {
		return nil, nil, err
	}
	logger := tlog.NewZapLogger(s.log.Named("temporal-schema").WithOptions(gate(opts.ServerLogLevel, s.quiet)))
	for _, st := range []struct {
		cfg  *config.SQL
		dir  string
		want string
	}{
		{t.main, "postgresql/v12/temporal", pgschema.Version},
		{t.visibility, "postgresql/v12/visibility", pgschema.VisibilityVersion},
	} {
		if err := migrate(st.cfg, st.dir, st.want, logger); err != nil {
			return nil, nil, fmt.Errorf("schema of database %s: %w", st.cfg.DatabaseName, err)
		}
	}
	n, err := leanVisibilityIndexes(ctx, t.dbURL(t.visibility.DatabaseName))
	if err != nil {
		return nil, nil, fmt.Errorf("database %s: %w", t.visibility.DatabaseName, err)
	}
	if n > 0 {
		s.log.Info("visibility indexes made partial (rows whose search-attribute slot is empty are left out)", zap.Int("indexes", n))
	}
	ns, err := sqliteschema.NewNamespaceConfig(clusterName, opts.Namespace, false, opts.SearchAttributes)
	if err != nil {
		return nil, nil, fmt.Errorf("namespace %s: %w", opts.Namespace, err)
	}
	// CreateNamespaces is plugin-neutral (it writes through the SQL plugin the config names)
	// and leaves an existing namespace as it is.
	if err := sqliteschema.CreateNamespaces(t.main, ns); err != nil {
		return nil, nil, fmt.Errorf("create namespace %s: %w", opts.Namespace, err)
	}
	return t.main, t.visibility, nil
}

// migrate brings the database to the newest schema version the server module ships under dir
// (its embedded schema tree), as temporal-sql-tool's `setup-schema -v 0.0` followed by
// `update-schema` does: schema_version records what is applied, each newer versioned
// directory's files run in version order, and the version is recorded after each. A statement
// that fails with "already exists" (an earlier attempt that stopped half-way) is skipped, as
// the tool does. The result must be want, the version the server checks at start.
func migrate(cfg *config.SQL, dir, want string, logger tlog.Logger) error {
	db, err := persql.NewSQLAdminDB(sqlplugin.DbKindUnknown, cfg, resolver.NewNoopResolver(), logger, metrics.NoopMetricsHandler)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = db.Close() }()
	if err := db.CreateSchemaVersionTables(); err != nil {
		return fmt.Errorf("version tables: %w", err)
	}
	current, err := db.ReadSchemaVersion(cfg.DatabaseName)
	if errors.Is(err, sql.ErrNoRows) {
		current = "0.0"
	} else if err != nil {
		return fmt.Errorf("read version: %w", err)
	}
	have, err := parseVersion(current)
	if err != nil {
		return err
	}
	updates, err := versionedUpdates(path.Join(dir, "versioned"), have)
	if err != nil {
		return err
	}
	for _, u := range updates {
		for _, stmt := range u.statements {
			if err := db.Exec(stmt); err != nil && !strings.Contains(err.Error(), "already exist") {
				return fmt.Errorf("version %s: %w", u.CurrVersion, err)
			}
		}
		if err := db.UpdateSchemaVersion(cfg.DatabaseName, u.CurrVersion, u.MinCompatibleVersion); err != nil {
			return fmt.Errorf("record version %s: %w", u.CurrVersion, err)
		}
		if err := db.WriteSchemaUpdateLog(current, u.CurrVersion, u.md5, u.Description); err != nil {
			return fmt.Errorf("log version %s: %w", u.CurrVersion, err)
		}
		current = u.CurrVersion
	}
	if current != want {
		return fmt.Errorf("schema version %s after update, want %s", current, want)
	}
	return nil
}

// schemaUpdate is one versioned directory of the server's schema tree.
type schemaUpdate struct {
	CurrVersion          string
	MinCompatibleVersion string
	Description          string
	SchemaUpdateCqlFiles []string
	version              [2]int
	md5                  string
	statements           []string
}

// versionedUpdates reads the versioned directories under dir newer than have, oldest first.
func versionedUpdates(dir string, have [2]int) ([]schemaUpdate, error) {
	fsys := dbschema.Assets()
	dirs, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("schema files %s: %w", dir, err)
	}
	var out []schemaUpdate
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		blob, err := fs.ReadFile(fsys, path.Join(dir, d.Name(), "manifest.json"))
		if err != nil {
			return nil, fmt.Errorf("schema files %s: %w", dir, err)
		}
		var u schemaUpdate
		if err := json.Unmarshal(blob, &u); err != nil {
			return nil, fmt.Errorf("manifest of %s/%s: %w", dir, d.Name(), err)
		}
		if u.version, err = parseVersion(u.CurrVersion); err != nil {
			return nil, err
		}
		if "v"+u.CurrVersion != d.Name() {
			return nil, fmt.Errorf("manifest of %s/%s names version %s", dir, d.Name(), u.CurrVersion)
		}
		if cmpVersion(u.version, have) <= 0 {
			continue
		}
		sum := md5.Sum(blob) // the tool records the manifest's MD5; not a security use
		u.md5 = hex.EncodeToString(sum[:])
		var files []io.Reader
		for _, f := range u.SchemaUpdateCqlFiles {
			b, err := fs.ReadFile(fsys, path.Join(dir, d.Name(), f))
			if err != nil {
				return nil, fmt.Errorf("schema files %s: %w", dir, err)
			}
			files = append(files, bytes.NewReader(b))
		}
		if u.statements, err = persistence.LoadAndSplitQueryFromReaders(files); err != nil {
			return nil, fmt.Errorf("schema files %s/%s: %w", dir, d.Name(), err)
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b schemaUpdate) int { return cmpVersion(a.version, b.version) })
	return out, nil
}

// parseVersion reads "major.minor".
func parseVersion(v string) ([2]int, error) {
	var out [2]int
	major, minor, ok := strings.Cut(v, ".")
	var err1, err2 error
	out[0], err1 = strconv.Atoi(major)
	out[1], err2 = strconv.Atoi(minor)
	if !ok || err1 != nil || err2 != nil {
		return out, fmt.Errorf("schema version %q is not major.minor", v)
	}
	return out, nil
}

func cmpVersion(a, b [2]int) int {
	if c := cmp.Compare(a[0], b[0]); c != 0 {
		return c
	}
	return cmp.Compare(a[1], b[1])
}

// createDatabase creates db on the admin URL's server unless it exists.
func createDatabase(ctx context.Context, admin, db string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact.Text(admin), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", db, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created meanwhile
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", db, err)
	}
	return nil
}

// serverLockKey is the advisory lock a server holds on its main database.
const serverLockKey = 0x6d637073796e63 // "mcpsync"

// lockDatabase takes the server lock on db, or fails with ErrDatabaseInUse.
func lockDatabase(ctx context.Context, dbURL string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.Text(dbURL), err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(serverLockKey)).Scan(&ok); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("lock %s: %w", redact.Text(dbURL), err)
	}
	if !ok {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%w: %s", ErrDatabaseInUse, redact.Text(dbURL))
	}
	return conn, nil
}

// unlockDatabase releases the server lock and ends its session. The explicit unlock comes
// first because closing the connection alone returns before the server's backend has exited
// and dropped the lock: a server started on the same database right after Stop would then
// find it held and fail with ErrDatabaseInUse. When the unlock cannot run (connection already
// broken) the session is gone or going, and the lock with it.
func unlockDatabase(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(serverLockKey))
	_ = conn.Close(ctx) // the session ends either way
}
