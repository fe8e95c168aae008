// Package pgcluster runs a private PostgreSQL cluster from the machine's PostgreSQL binaries:
// it initialises a data directory when needed, starts the server as a child process that this
// process owns (and that dies with it), waits until it accepts connections, creates the
// application database, and stops it again. Restarting over the same data directory reuses
// the data.
//
// When this process runs as root, PostgreSQL runs as the `postgres` OS user. That user must be
// able to traverse every parent of the data directory; when it cannot (for example under /root,
// which is mode 0700), the data lives in a private directory under /tmp instead, named after a
// hash of the requested path, and Start logs where.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/devenv/ports"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// Superuser is the database superuser created by initdb. Without Options.Password, connections
// authenticate as it with trust authentication (test clusters only: any local process could
// connect); with it, TCP connections need the password (scram-sha-256).
const Superuser = "postgres"

// DefaultDatabase is the application database Start creates when Options.Database is empty.
const DefaultDatabase = "mcpsync"

// DefaultHost is the address the server listens on when Options.Host is empty.
const DefaultHost = "127.0.0.1"

// ErrDataDirInUse reports that a live PostgreSQL server already runs on the data directory.
var ErrDataDirInUse = errors.New("PostgreSQL data directory is in use")

// PortInUseError reports that the TCP port the cluster should listen on is already taken.
type PortInUseError struct {
	Host string
	Port int
	Err  error
}

// Error names the address that is taken.
func (e *PortInUseError) Error() string {
	return fmt.Sprintf("port %d on %s is already in use (PostgreSQL cannot listen there): %v", e.Port, e.Host, e.Err)
}

// Unwrap returns the listen error.
func (e *PortInUseError) Unwrap() error { return e.Err }

// Options configure Start.
type Options struct {
	// DataDir is where the cluster's data should live; it is created (and initialised with
	// initdb) when it holds no PG_VERSION file. Required. See the package comment for when the
	// data lives elsewhere; Cluster.DataDir reports the directory actually used.
	DataDir string
	// Host is the listen address (default 127.0.0.1).
	Host string
	// Port is the TCP port; 0 picks a free one.
	Port int
	// Database is the application database, created when missing (default "mcpsync").
	Database string
	// Logger receives the server's log lines and start/stop events (default: discard).
	Logger *zap.Logger
	// NoFsync turns off fsync, synchronous_commit and full_page_writes. Data may be lost on a
	// machine crash; meant for test clusters only.
	NoFsync bool
	// SocketDir holds the server's Unix-domain socket; it is created (mode 0700, owned by the
	// server's OS user) when missing. Default: a private directory under /tmp named after a hash
	// of DataDir, removed again by Stop.
	SocketDir string
	// Settings are extra server parameters, passed as `-c key=value`.
	Settings map[string]string
	// StartTimeout bounds how long Start waits for the server to accept connections
	// (default 60 s).
	StartTimeout time.Duration
	// Password, when set, turns trust off (issue 14 item 3): at every start pg_hba.conf is
	// rewritten so that TCP connections need scram-sha-256 and the Unix socket admits only
	// this process's OS user (peer authentication), through which Start sets Superuser's
	// password to Password; URL and AdminURL then carry it. A cluster made earlier with trust
	// is converted on its next start with a Password. Empty: trust, as initdb made it (meant
	// for test clusters on loopback). NewPassword makes a good one.
	Password string
}

// Cluster is a running PostgreSQL server started by Start. Its methods are safe for concurrent
// use.
type Cluster struct {
	log        *zap.Logger
	host       string
	port       int
	database   string
	dataDir    string
	sockDir    string
	password   string // Options.Password
	ownSockDir bool   // sockDir was made by Start for the socket alone: remove it after exit
	privateDir string // when the data was relocated: the private directory under /tmp holding it
	cmd        *exec.Cmd
	out        *lineLog
	done       chan struct{}
	exitErr    error // valid after done is closed
	stopOnce   sync.Once
	stopErr    error
}

// Start initialises (if needed) and starts a PostgreSQL server as a child process of this
// process, waits until it accepts connections and creates the application database when it is
// missing. The child is placed in its own process group (so a terminal's Ctrl-C reaches only
// this process, which then stops it in order) and, on Linux, receives SIGINT (fast shutdown)
// if this process dies without calling Stop. It fails with a *PortInUseError when the port is taken,
// with ErrBinariesMissing when no server binaries exist, and with ErrDataDirInUse when another
// live server owns the data directory. On any error nothing is left running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.DataDir == "" {
		return nil, errors.New("pgcluster: Options.DataDir is required")
	}
	if opts.Host == "" {
		opts.Host = DefaultHost
	}
	if opts.Database == "" {
		opts.Database = DefaultDatabase
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	log := opts.Logger
	bins, err := FindBinaries()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(opts.Host); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	} else if err := checkPortFree(opts.Host, opts.Port); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	requested, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: data directory %q: %w", opts.DataDir, err)
	}

	// Decide who runs the server and where its files go.
	var runAs *osUser
	tmpBase := os.TempDir()
	if os.Geteuid() == 0 {
		if runAs, err = lookupPostgresUser(); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		tmpBase = rootTmpBase
	}
	c := &Cluster{
		log:      log,
		host:     opts.Host,
		port:     opts.Port,
		database: opts.Database,
		password: opts.Password,
		dataDir:  requested,
		done:     make(chan struct{}),
		out:      newLineLog(log.Named("postgres"), 40),
	}
	privDir := relocatedDir(tmpBase, requested)
	if runAs != nil {
		if ok, blocker := traversable(filepath.Dir(requested), runAs); !ok {
			c.dataDir = filepath.Join(privDir, "data")
			c.privateDir = privDir
			log.Warn("the postgres OS user cannot reach the requested PostgreSQL data directory; keeping the data in a private directory under /tmp instead",
				zap.String("requested", requested), zap.String("blocked_at", blocker), zap.String("data_dir", c.dataDir))
		}
	}
	if opts.SocketDir == "" {
		c.sockDir = privDir
		c.ownSockDir = c.privateDir == ""
	} else if c.sockDir, err = filepath.Abs(opts.SocketDir); err != nil {
		return nil, fmt.Errorf("pgcluster: socket directory %q: %w", opts.SocketDir, err)
	} else if runAs != nil {
		if ok, blocker := traversable(filepath.Dir(c.sockDir), runAs); !ok {
			return nil, fmt.Errorf("pgcluster: the %s user cannot reach socket directory %s (blocked at %s)", runAs.name, c.sockDir, blocker)
		}
	}
	for _, dir := range []string{c.privateDir, c.sockDir} {
		if dir == "" {
			continue
		}
		if err := ensurePrivateDir(dir, runAs); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	fail := func(err error) (*Cluster, error) {
		if c.ownSockDir {
			_ = os.Remove(c.sockDir) // only if empty: another server may own it
		}
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := ensureDataDir(c.dataDir, runAs); err != nil {
		return fail(err)
	}
	if pid, err := clearStalePID(c.dataDir); err != nil {
		return fail(err)
	} else if pid != 0 {
		log.Info("removed stale postmaster.pid left by a server that is gone", zap.Int("pid", pid))
	}
	if err := c.initdb(ctx, bins, runAs, opts.NoFsync); err != nil {
		return fail(err)
	}
	if c.password != "" {
		osUser, err := currentOSUser()
		if err != nil {
			return fail(err)
		}
		if err := writeAuthConfig(c.dataDir, osUser, runAs); err != nil {
			return fail(err)
		}
	}
	if err := c.spawn(bins, runAs, opts); err != nil {
		return fail(err)
	}
	if err := c.waitReady(ctx, opts.StartTimeout); err != nil {
		c.kill()
		return fail(err)
	}
	if c.password != "" {
		if err := c.setPassword(ctx); err != nil {
			c.kill()
			return fail(err)
		}
	}
	if err := c.createDatabase(ctx); err != nil {
		c.kill()
		return fail(err)
	}
	log.Info("PostgreSQL ready", zap.String("url", redact.DSN(c.URL())), zap.Bool("password", c.password != ""), zap.String("data_dir", c.dataDir), zap.Int("pid", c.PID()))
	return c, nil
}

func (c *Cluster) createDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.adminConnString())
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact.DSN(c.adminConnString()), redact.Err(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, c.database).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %q: %w", c.database, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{c.database}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created concurrently
		err = nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", c.database, err)
	}
	c.log.Info("created database", zap.String("database", c.database))
	return nil
}

// kill ends the server without a clean shutdown and waits for it; used when Start fails.
func (c *Cluster) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// Stop shuts the server down with a fast shutdown (SIGINT: open sessions are disconnected,
// committed data is kept) and waits until the process has exited. If it has not exited when
// ctx ends or after 30 s, whichever comes first, it is killed with SIGKILL and Stop returns an
// error saying so. It also reports a server that had already exited on its own. Stop is
// idempotent; later calls return the first result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { c.stopErr = c.stop(ctx) })
	return c.stopErr
}

func (c *Cluster) stop(ctx context.Context) error {
	defer c.removeSocketFiles()
	select {
	case <-c.done:
		return fmt.Errorf("pgcluster: postgres (PID %d) had already exited: %v", c.PID(), c.exitErr)
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		c.log.Warn("signal postgres", zap.Error(err))
	}
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-c.done:
		c.log.Info("PostgreSQL stopped", zap.Int("pid", c.PID()))
		return nil
	case <-ctx.Done():
	case <-timer.C:
	}
	c.kill()
	return fmt.Errorf("pgcluster: postgres (PID %d) did not shut down in time and was killed", c.PID())
}

// RemoveData deletes the cluster's data directory (and the private directory under /tmp that
// holds it, when the data had to live there). It refuses while the server is running.
func (c *Cluster) RemoveData() error {
	select {
	case <-c.done:
	default:
		return errors.New("pgcluster: RemoveData called while the server is running")
	}
	dir := c.dataDir
	if c.privateDir != "" {
		dir = c.privateDir
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pgcluster: remove data: %w", err)
	}
	return nil
}

// RemoveRelocated deletes the private directory under /tmp where Start, run as root, keeps the
// data of a cluster whose requested dataDir the postgres user cannot reach (Relocated). A
// process that ran a cluster on a directory it is about to delete (a temporary `mcpsync-dev`
// data directory) calls it once that cluster has stopped, or the relocated data outlives the
// directory. Not running as root, or with nothing there, it does nothing.
func RemoveRelocated(dataDir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("pgcluster: data directory %q: %w", dataDir, err)
	}
	if err := os.RemoveAll(relocatedDir(rootTmpBase, abs)); err != nil {
		return fmt.Errorf("pgcluster: remove relocated data of %s: %w", abs, err)
	}
	return nil
}

// rootTmpBase is where Start, run as root, keeps private directories (whatever TMPDIR says:
// the postgres user must reach them).
const rootTmpBase = "/tmp"

// relocatedDir is the private directory under tmpBase for the requested (absolute) data
// directory: the relocated data's home, and the socket directory otherwise.
func relocatedDir(tmpBase, requested string) string {
	return filepath.Join(tmpBase, "mcpsync-pg-"+shortHash(requested))
}

// removeSocketFiles deletes the socket and its lock file once the server is gone (a killed
// server leaves them behind), and the socket directory itself when it holds nothing else.
func (c *Cluster) removeSocketFiles() {
	<-c.done
	base := filepath.Join(c.sockDir, ".s.PGSQL."+strconv.Itoa(c.port))
	_ = os.Remove(base)
	_ = os.Remove(base + ".lock")
	if c.ownSockDir {
		_ = os.Remove(c.sockDir)
	}
}

// Done is closed once the server process has exited, whether through Stop or on its own.
func (c *Cluster) Done() <-chan struct{} { return c.done }

// ExitError is the server process's exit status once Done is closed (nil for a clean exit).
func (c *Cluster) ExitError() error {
	select {
	case <-c.done:
		return c.exitErr
	default:
		return nil
	}
}

// PID is the process ID of the postmaster.
func (c *Cluster) PID() int { return c.cmd.Process.Pid }

// Port is the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Host is the address the server listens on.
func (c *Cluster) Host() string { return c.host }

// Database is the application database's name.
func (c *Cluster) Database() string { return c.database }

// DataDir is the directory that actually holds the data (see the package comment).
func (c *Cluster) DataDir() string { return c.dataDir }

// Relocated reports whether the data lives in a private directory under /tmp instead of the
// requested DataDir, because the postgres OS user could not reach the latter.
func (c *Cluster) Relocated() bool { return c.privateDir != "" }

// SocketDir is the directory holding the server's Unix-domain socket.
func (c *Cluster) SocketDir() string { return c.sockDir }

// URL is the connection URL of the application database, e.g.
// postgres://postgres@127.0.0.1:55432/mcpsync?sslmode=disable, with the password in the
// userinfo when Options.Password is set (mask it with redact.DSN before showing it).
func (c *Cluster) URL() string { return c.urlFor(c.database) }

// AdminURL is the connection URL of the `postgres` maintenance database, for creating and
// dropping databases (with the password, like URL).
func (c *Cluster) AdminURL() string { return c.urlFor("postgres") }

func (c *Cluster) urlFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     c.userinfo(),
		Host:     net.JoinHostPort(c.host, strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

func (c *Cluster) userinfo() *url.Userinfo {
	if c.password != "" {
		return url.UserPassword(Superuser, c.password)
	}
	return url.User(Superuser)
}

// adminConnString is how Start itself connects to the maintenance database: over TCP with
// trust, or over the Unix socket by peer authentication when the cluster has a password
// (which Start sets only once connected).
func (c *Cluster) adminConnString() string {
	if c.password != "" {
		return c.socketConnString("postgres")
	}
	return c.AdminURL()
}

// checkPortFree fails with a *PortInUseError when host:port cannot be bound.
func checkPortFree(host string, port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return &PortInUseError{Host: host, Port: port, Err: err}
		}
		return fmt.Errorf("cannot listen on %s:%d: %w", host, port, err)
	}
	return l.Close()
}

// FreePort returns a TCP port on host that was free a moment ago, outside the kernel's
// ephemeral range (ports.Free): no outgoing connection takes it while the cluster is
// initialised and started.
func FreePort(host string) (int, error) { return ports.Free(host) }
