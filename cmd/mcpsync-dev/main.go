// Command mcpsync-dev runs everything mcpsync needs on one machine, in one process: a Temporal
// server with its Web UI, and — unless DATABASE_URL is set — a private PostgreSQL cluster
// under --data-dir/pg started from the machine's PostgreSQL binaries. Temporal keeps its state
// where --temporal-persistence (or MCPSYNC_TEMPORAL_PERSISTENCE) says: "sqlite" (the
// default) in a SQLite file under --data-dir; "postgres" in the databases temporal and
// temporal_visibility of that PostgreSQL server, created when missing. Both are durable
// (issue 16 item 2; bench/persistence measures them). It prints one "mcpsync-dev ready: ..." line when everything answers and writes the
// same facts to <data-dir>/dev.env as shell KEY=VALUE lines (TEMPORAL_ADDRESS, DATABASE_URL,
// TEMPORAL_UI, TEMPORAL_NAMESPACE, and TEMPORAL_TLS_CA when --tls-cert, --tls-key and --tls-ca
// make the frontend serve TLS), mode 0600: the private cluster trusts nobody, and its
// password, generated afresh at every start, is in DATABASE_URL there and nowhere else
// (issue 14 item 3); what is printed or logged shows it masked. SIGINT or SIGTERM stops the
// UI, Temporal and PostgreSQL in that order; restarting over the same --data-dir keeps all
// data. With --parent-pid it stops the same way when that process exits (scripts/run.sh
// passes its own PID, so that killing the script never leaves mcpsync-dev holding its ports).
// A port already in use is reported in one line naming the process that holds it and how to
// stop it. --temporal-history-shards and --temporal-shard-io-concurrency tune the embedded
// history service (defaults measured by issue 16 item 2); the shard count is fixed when the
// Temporal persistence is created, so an existing one keeps the count it has, and the log says
// so when that differs from the flag. Unless GOGC is set, its garbage collector runs at
// gcpolicy.Percent.
//
// Exit codes: 0 after a clean stop, 1 on failure, 2 on bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/gcpolicy"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/parentwatch"
	"github.com/mcpsync/mcpsync/internal/redact"
)

const host = "127.0.0.1"

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("mcpsync-dev", flag.ContinueOnError)
	dataDir := fs.String("data-dir", ".data", "directory for the Temporal SQLite file, the PostgreSQL cluster (pg/) and dev.env")
	frontendPort := fs.Int("frontend-port", 7233, "Temporal frontend gRPC port on "+host)
	uiPort := fs.Int("ui-port", 8233, "Temporal Web UI HTTP port on "+host)
	pgPort := fs.Int("pg-port", 55432, "PostgreSQL port on "+host+" (unused when DATABASE_URL is set)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	parentPID := fs.Int("parent-pid", 0, "stop everything when the process with this PID exits (0: never)")
	tlsCert := fs.String("tls-cert", "", "serve the Temporal frontend over TLS with this PEM certificate (with --tls-key and --tls-ca)")
	tlsKey := fs.String("tls-key", "", "PEM private key of --tls-cert")
	tlsCA := fs.String("tls-ca", "", "PEM file of the CA that signed --tls-cert; dev.env names it as TEMPORAL_TLS_CA")
	persistenceFlag := fs.String("temporal-persistence", envOr("MCPSYNC_TEMPORAL_PERSISTENCE", string(defaultPersistence)),
		"where Temporal keeps its state: postgres (databases temporal and temporal_visibility on the PostgreSQL server) or sqlite (a file under --data-dir)")
	historyShards := fs.Int("temporal-history-shards", 0,
		"history shards of a new Temporal persistence, fixed at creation: an existing one keeps its count (0: the measured default, sqlite 1, postgres 4)")
	shardIO := fs.Int("temporal-shard-io-concurrency", 0,
		"persistence operations in flight per Temporal history shard, history.shardIOConcurrency (0: the measured default, sqlite 1, postgres 8)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *historyShards < 0 || *historyShards > 1024 {
		fmt.Fprintf(os.Stderr, "mcpsync-dev: bad --temporal-history-shards %d: want 1 to 1024 (0: the default)\n", *historyShards)
		return 2
	}
	if err := checkPortRange([]portFlag{{"--frontend-port", *frontendPort}, {"--ui-port", *uiPort}, {"--pg-port", *pgPort}}); err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-dev:", err)
		return 2
	}
	if *shardIO < 0 || *shardIO > 1024 {
		fmt.Fprintf(os.Stderr, "mcpsync-dev: bad --temporal-shard-io-concurrency %d: want 1 to 1024 (0: the default)\n", *shardIO)
		return 2
	}
	persistence, err := devtemporal.ParsePersistence(*persistenceFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-dev: bad --temporal-persistence:", err)
		return 2
	}
	explicit := os.Getenv("MCPSYNC_TEMPORAL_PERSISTENCE") != ""
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "temporal-persistence" })
	var note string
	persistence, note = choosePersistence(persistence, explicit, *dataDir)
	if note != "" {
		fmt.Fprintln(os.Stderr, "mcpsync-dev: note:", note)
	}
	serverTLS, err := frontendTLS(*tlsCert, *tlsKey, *tlsCA)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-dev:", err)
		return 2
	}
	log, err := logging.New(*logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcpsync-dev: bad --log-level: %v\n", err)
		return 2
	}
	level := log.Level()
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mcpsync-dev: unexpected arguments %q\n", fs.Args())
		return 2
	}
	// A data directory that cannot be one (a file, a path under one) is bad input, found before
	// anything starts: PostgreSQL would otherwise be initialised elsewhere first, for nothing.
	if err := os.MkdirAll(*dataDir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "mcpsync-dev: bad --data-dir %s: %v\n", *dataDir, err)
		return 2
	}
	defer log.Sync() //nolint:errcheck
	// The embedded server's collector target measured for this process (issue 16); GOGC
	// overrides it.
	log.Info("garbage collector", zap.Stringer("gogc", gcpolicy.Apply()))

	// Signals are caught from here on; a second one after shutdown began kills the process.
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	// The parent's exit stops us as a signal would (on Linux it is delivered as SIGTERM).
	ctx, stopWatch := parentwatch.Context(ctx, *parentPID, parentwatch.Options{})
	defer stopWatch()

	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "mcpsync-dev:", redact.Text(describe(err)))
		return 1
	}
	began := time.Now()
	databaseURL := os.Getenv("DATABASE_URL")
	ports := []portFlag{{"--frontend-port", *frontendPort}, {"--ui-port", *uiPort}}
	if databaseURL == "" {
		ports = append(ports, portFlag{"--pg-port", *pgPort})
	}
	if err := checkPorts(ports); err != nil {
		return fail(err)
	}

	var pg *pgcluster.Cluster
	if databaseURL == "" {
		if err := pgcluster.EnsureInstalled(ctx, log); err != nil {
			return fail(fmt.Errorf("%w (or set DATABASE_URL to use an existing PostgreSQL server)", err))
		}
		password, err := pgcluster.NewPassword()
		if err != nil {
			return fail(err)
		}
		pg, err = pgcluster.Start(ctx, pgcluster.Options{
			DataDir:  filepath.Join(*dataDir, "pg"),
			Host:     host,
			Port:     *pgPort,
			Logger:   log.Named("pg"),
			Password: password,
			// Room for Temporal's connection pools (four services, two stores) beside the
			// worker's and the CLI's.
			Settings: map[string]string{"max_connections": "200"},
		})
		if err != nil {
			return fail(err)
		}
		defer stopPostgres(pg)
		databaseURL = pg.URL()
	}

	var temporalPG *devtemporal.Postgres
	if persistence == devtemporal.PersistencePostgres {
		// Temporal's databases sit beside the ledger's, on the same server; the private
		// cluster's admin database is where they are created.
		admin := databaseURL
		if pg != nil {
			admin = pg.AdminURL()
		}
		temporalPG = &devtemporal.Postgres{URL: admin}
		if _, err := os.Stat(filepath.Join(*dataDir, devtemporal.DatabaseFileName)); err == nil {
			fmt.Fprintf(os.Stderr, "mcpsync-dev: note: Temporal state now lives in PostgreSQL; the earlier SQLite state in %s is not used (--temporal-persistence sqlite uses it)\n",
				filepath.Join(*dataDir, devtemporal.DatabaseFileName))
		}
	}
	tmp, err := devtemporal.Start(ctx, devtemporal.Options{
		DataDir:        *dataDir,
		Persistence:    persistence,
		Postgres:       temporalPG,
		Host:           host,
		FrontendPort:   *frontendPort,
		UIPort:         *uiPort,
		Logger:         log,
		ServerLogLevel: level,
		TLS:            serverTLS,
		// Measured defaults (issue 16 item 2); an existing persistence keeps its shard count.
		HistoryShards:      int32(*historyShards),
		ShardIOConcurrency: *shardIO,
	})
	if err != nil && temporalPG != nil && pg == nil {
		return fail(fmt.Errorf("%w (Temporal's databases go on DATABASE_URL's server, which needs CREATEDB for that; or use --temporal-persistence sqlite)", err))
	}
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := tmp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "mcpsync-dev:", err)
		}
	}()

	envFile := filepath.Join(*dataDir, "dev.env")
	vars := [][2]string{
		{"TEMPORAL_ADDRESS", tmp.FrontendAddress()},
		{"TEMPORAL_NAMESPACE", tmp.Namespace()},
		{"TEMPORAL_UI", tmp.UIURL()},
		{"DATABASE_URL", databaseURL},
	}
	if serverTLS != nil {
		vars = append(vars, [2]string{"TEMPORAL_TLS_CA", serverTLS.CAFile})
	}
	if err := writeEnv(envFile, vars); err != nil {
		return fail(err)
	}
	defer os.Remove(envFile) // its facts end with this process

	log.Info("started", zap.Duration("startup", time.Since(began)))
	fmt.Printf("mcpsync-dev ready: temporal=%s (persistence %s) ui=%s database=%s (full URL in %s)\n", tmp.FrontendAddress(), persistence, tmp.UIURL(), redact.DSN(databaseURL), envFile)

	var pgDone <-chan struct{}
	if pg != nil {
		pgDone = pg.Done()
	}
	select {
	case <-ctx.Done():
		stopSignals()
		if cause := context.Cause(ctx); errors.Is(cause, parentwatch.ErrParentGone) {
			fmt.Fprintf(os.Stderr, "mcpsync-dev: stopping: %v\n", cause)
		} else {
			fmt.Fprintln(os.Stderr, "mcpsync-dev: stopping")
		}
		return 0
	case <-pgDone:
		stopSignals()
		return fail(fmt.Errorf("PostgreSQL exited unexpectedly: %v", pg.ExitError()))
	}
}

// defaultPersistence: devtemporal.DefaultPersistence (chosen by bench/persistence).
const defaultPersistence = devtemporal.DefaultPersistence

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func stopPostgres(pg *pgcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pg.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-dev:", err)
	}
}

type portFlag struct {
	flag string
	port int
}

// portTakenError names a taken port, the process that holds it if it can be found, how to
// stop that process and the flag that chooses another port — in one line.
type portTakenError struct {
	portFlag
	holder holder
	found  bool
}

// newPortTakenError looks up who holds p's port.
func newPortTakenError(p portFlag) *portTakenError {
	h, ok := portHolder(p.port)
	return &portTakenError{portFlag: p, holder: h, found: ok}
}

func (e *portTakenError) Error() string {
	if !e.found {
		return fmt.Sprintf("port %d on %s is already in use: find the process with `lsof -nP -iTCP:%d -sTCP:LISTEN` (or `ss -ltnp`) and stop it with `kill PID`, or choose another port with %s",
			e.port, host, e.port, e.flag)
	}
	h := e.holder
	who, stop := fmt.Sprintf("PID %d (%s)", h.PID, orUnknown(h.Name)), h.PID
	if h.OwnerPID != 0 {
		who, stop = fmt.Sprintf("PID %d (%s) started by PID %d (%s)", h.PID, orUnknown(h.Name), h.OwnerPID, h.OwnerName), h.OwnerPID
	}
	hint := ""
	if strings.HasPrefix(h.Name, "mcpsync") || h.OwnerPID != 0 {
		// It may be a stack that is running (another make run) as well as a leftover.
		hint = ", another mcpsync stack (running, or left over from an earlier run)"
	}
	return fmt.Sprintf("port %d on %s is held by %s%s: stop it with `kill %d`, or choose another port with %s",
		e.port, host, who, hint, stop, e.flag)
}

func orUnknown(name string) string {
	if name == "" {
		return "unknown command"
	}
	return name
}

// checkPortRange refuses a port flag outside 1-65535 (bad input, before anything is contacted):
// each port is one the stack's clients are told, so "any free port" (0) is not one either.
func checkPortRange(ports []portFlag) error {
	for _, p := range ports {
		if p.port < 1 || p.port > 65535 {
			return fmt.Errorf("bad %s %d: want a port from 1 to 65535", p.flag, p.port)
		}
	}
	return nil
}

// checkPorts fails on the first port that cannot be bound, before anything starts.
func checkPorts(ports []portFlag) error {
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p.port)))
		if errors.Is(err, syscall.EADDRINUSE) {
			return newPortTakenError(p)
		} else if err != nil {
			return fmt.Errorf("cannot listen on %s:%d (%s): %w", host, p.port, p.flag, err)
		}
		l.Close()
	}
	return nil
}

// describe turns a port error that slipped past checkPorts (taken in between) into the same
// one-line message.
func describe(err error) string {
	var pgPort *pgcluster.PortInUseError
	var tPort *devtemporal.PortInUseError
	switch {
	case errors.As(err, &pgPort):
		return newPortTakenError(portFlag{"--pg-port", pgPort.Port}).Error()
	case errors.As(err, &tPort) && tPort.Service == "frontend":
		return newPortTakenError(portFlag{"--frontend-port", tPort.Port}).Error()
	case errors.As(err, &tPort) && tPort.Service == "ui":
		return newPortTakenError(portFlag{"--ui-port", tPort.Port}).Error()
	}
	return err.Error()
}

// writeEnv writes KEY=VALUE lines, atomically and readable by this OS user only (mode 0600:
// DATABASE_URL carries the database password), that a POSIX shell can source (and make can
// include): a value is single-quoted only when a shell would otherwise misread it.
func writeEnv(path string, vars [][2]string) error {
	var b strings.Builder
	for _, kv := range vars {
		v := kv[1]
		if strings.ContainsAny(v, " \t\n'\"\\$`;&|<>()*[]{}!#~") {
			v = "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
		}
		fmt.Fprintf(&b, "%s=%s\n", kv[0], v)
	}
	tmp := path + ".tmp"
	// A leftover temporary file may have other permissions, which WriteFile would keep.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.WriteString(b.String())
	if err == nil {
		err = f.Chmod(0o600) // umask only narrows 0600; a default ACL or a setgid directory could widen it
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// frontendTLS checks --tls-cert, --tls-key and --tls-ca (all or none; readable, a matching
// pair, a PEM CA) and returns the TLS option for the embedded frontend, nil when none is set.
// The paths are made absolute, since dev.env is read from other directories.
func frontendTLS(cert, key, ca string) (*devtemporal.TLS, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, errors.New("--tls-cert, --tls-key and --tls-ca go together")
	}
	abs := make([]string, 3)
	for i, p := range []string{cert, key, ca} {
		a, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		abs[i] = a
	}
	// The server's own clients verify it with the CA: check the files as a client would.
	conn := config.TemporalConn{TLSCert: abs[0], TLSKey: abs[1], TLSCA: abs[2]}
	if err := conn.Validate(); err != nil {
		return nil, errors.New(flagNames.Replace(err.Error()))
	}
	return &devtemporal.TLS{CertFile: abs[0], KeyFile: abs[1], CAFile: abs[2]}, nil
}

// flagNames renames the settings in config's messages to mcpsync-dev's flags.
var flagNames = strings.NewReplacer("TEMPORAL_TLS_CERT", "--tls-cert", "TEMPORAL_TLS_KEY", "--tls-key", "TEMPORAL_TLS_CA", "--tls-ca")

// choosePersistence is the Temporal persistence to run: the requested one, except that a data
// directory holding a SQLite Temporal store keeps using it when nobody chose the persistence
// explicitly (flag or MCPSYNC_TEMPORAL_PERSISTENCE): a data directory made while SQLite was
// the default must not lose its workflows to the new default. The note says so, once.
func choosePersistence(requested devtemporal.Persistence, explicit bool, dataDir string) (devtemporal.Persistence, string) {
	if explicit || requested == devtemporal.PersistenceSQLite {
		return requested, ""
	}
	file := filepath.Join(dataDir, devtemporal.DatabaseFileName)
	if _, err := os.Stat(file); err != nil {
		return requested, ""
	}
	return devtemporal.PersistenceSQLite, fmt.Sprintf("keeping the Temporal state of this data directory in SQLite (%s); the default for new data directories is %s (--temporal-persistence %s switches, leaving that state unused)",
		file, requested, requested)
}
