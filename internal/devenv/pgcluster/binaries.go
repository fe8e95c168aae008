package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// InstallHint is the command that installs the PostgreSQL server binaries on Debian and Ubuntu.
const InstallHint = "apt-get install -y postgresql"

// ErrBinariesMissing reports that no PostgreSQL server binaries (initdb and postgres) were found.
// Errors returned by FindBinaries, Start and EnsureInstalled wrap it when that is the cause; test
// with errors.Is. Its message names the package to install.
var ErrBinariesMissing = errors.New("PostgreSQL server binaries (initdb, postgres) not found; install them with: " + InstallHint)

// debianBinGlob is where Debian's postgresql-NN packages put the server binaries.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// Binaries locates the PostgreSQL server programs the package runs.
type Binaries struct {
	// Dir is the directory holding the programs.
	Dir string
	// Initdb and Postgres are absolute paths of the two programs.
	Initdb, Postgres string
}

// FindBinaries returns the PostgreSQL server binaries to use: the directory named by the PG_BIN
// environment variable when it is set, otherwise the highest-versioned /usr/lib/postgresql/*/bin
// that holds both initdb and postgres. When none qualifies the error wraps ErrBinariesMissing.
func FindBinaries() (Binaries, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		b, ok := binariesIn(dir)
		if !ok {
			return Binaries{}, fmt.Errorf("PG_BIN=%s does not contain executable initdb and postgres: %w", dir, ErrBinariesMissing)
		}
		return b, nil
	}
	dirs, _ := filepath.Glob(debianBinGlob) // the pattern is constant and valid
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if b, ok := binariesIn(dir); ok {
			return b, nil
		}
	}
	return Binaries{}, fmt.Errorf("searched $PG_BIN and %s: %w", debianBinGlob, ErrBinariesMissing)
}

// versionOf extracts the numeric major version from /usr/lib/postgresql/NN/bin (0 if none).
func versionOf(binDir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	if err != nil {
		return 0
	}
	return v
}

func binariesIn(dir string) (Binaries, bool) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Binaries{}, false
	}
	b := Binaries{Dir: abs, Initdb: filepath.Join(abs, "initdb"), Postgres: filepath.Join(abs, "postgres")}
	for _, p := range []string{b.Initdb, b.Postgres} {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return Binaries{}, false
		}
	}
	return b, true
}

// EnsureInstalled makes sure PostgreSQL server binaries are available. When they are missing,
// PG_BIN is unset and the process runs as root, it installs Debian's postgresql package with apt-get (running
// apt-get update and retrying once if the first install fails); when not root it returns an error
// wrapping ErrBinariesMissing that says what to install. It returns nil only when FindBinaries
// succeeds afterwards.
func EnsureInstalled(ctx context.Context, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	if _, err := FindBinaries(); err == nil || !errors.Is(err, ErrBinariesMissing) {
		return err
	} else if os.Getenv("PG_BIN") != "" {
		return err // installing a package would not change what PG_BIN points at
	} else if os.Geteuid() != 0 {
		return fmt.Errorf("not root, cannot install them myself: %w", err)
	}
	log.Warn("PostgreSQL server binaries not found; installing Debian's postgresql package", zap.String("command", InstallHint))
	if err := aptGet(ctx, "install", "-y", "postgresql"); err != nil {
		log.Warn("apt-get install failed; running apt-get update and retrying", zap.Error(err))
		if err := aptGet(ctx, "update"); err != nil {
			return fmt.Errorf("installing postgresql: %w (%w)", err, ErrBinariesMissing)
		}
		if err := aptGet(ctx, "install", "-y", "postgresql"); err != nil {
			return fmt.Errorf("installing postgresql: %w (%w)", err, ErrBinariesMissing)
		}
	}
	if _, err := FindBinaries(); err != nil {
		return fmt.Errorf("postgresql was installed but %w", err)
	}
	log.Info("installed Debian's postgresql package")
	return nil
}

func aptGet(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("apt-get %s: %w: %s", strings.Join(args, " "), err, tail(out.String(), 2000))
	}
	return nil
}

// tail returns at most n trailing bytes of s, trimmed.
func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}
