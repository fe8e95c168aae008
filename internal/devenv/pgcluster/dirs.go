package pgcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// osUser is the account the PostgreSQL processes run as when this process is root.
type osUser struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
}

func (u *osUser) credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
}

// lookupPostgresUser returns the `postgres` OS account.
func lookupPostgresUser() (*osUser, error) {
	pu, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL must run as the 'postgres' OS user, which does not exist (%w); it comes with Debian's postgresql package: %s", err, InstallHint)
	}
	uid, err := strconv.ParseUint(pu.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user: bad uid %q: %w", pu.Uid, err)
	}
	gid, err := strconv.ParseUint(pu.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user: bad gid %q: %w", pu.Gid, err)
	}
	u := &osUser{name: pu.Username, uid: uint32(uid), gid: uint32(gid), groups: []uint32{}}
	if ids, err := pu.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				u.groups = append(u.groups, uint32(g))
			}
		}
	}
	return u, nil
}

// canSearch reports whether u may traverse (search) the directory described by fi.
func canSearch(fi fs.FileInfo, u *osUser) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == u.uid:
		return perm&0o100 != 0
	case st.Gid == u.gid || slices.Contains(u.groups, st.Gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// traversable reports whether u can reach entries of dir: every existing directory from / down to
// dir must be searchable by u. Components that do not exist yet are created later with mode 0755
// and therefore do not block.
func traversable(dir string, u *osUser) (bool, string) {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil && !canSearch(fi, u) {
			return false, p
		}
		if p == filepath.Dir(p) {
			return true, ""
		}
	}
}

// shortHash names per-cluster directories under /tmp after the requested data directory.
func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

// ensurePrivateDir makes dir exist as a real directory (not a symlink) with mode 0700 owned by
// owner (the current user when owner is nil). An existing directory owned by somebody else is
// refused, because it lives in a world-writable place.
func ensurePrivateDir(dir string, owner *osUser) error {
	uid := uint32(os.Geteuid())
	if owner != nil {
		uid = owner.uid
	}
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if owner != nil {
			if err := os.Chown(dir, int(owner.uid), int(owner.gid)); err != nil {
				return fmt.Errorf("chown %s to %s: %w", dir, owner.name, err)
			}
		}
		return nil
	case err != nil:
		return fmt.Errorf("stat %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("refusing to use %s: not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != uid {
		return fmt.Errorf("refusing to use %s: it is not owned by uid %d", dir, uid)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("chmod %s: %w", dir, err)
		}
	}
	return nil
}

// ensureDataDir makes dir exist and belong to owner (nil: the current user). A missing directory
// is created with mode 0700 (parents 0755); an existing empty one is handed over to owner; an
// existing non-empty one must already belong to owner, since PostgreSQL refuses anything else.
func ensureDataDir(dir string, owner *osUser) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create parent of data directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("create data directory: %w", err)
		}
		fi, err = os.Stat(dir)
	}
	if err != nil {
		return fmt.Errorf("stat data directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("data directory %s is not a directory", dir)
	}
	if owner == nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && st.Uid == owner.uid {
		return nil
	}
	empty, err := isEmptyDir(dir)
	if err != nil {
		return err
	}
	if !empty {
		return fmt.Errorf("data directory %s is not empty and not owned by the %s user; PostgreSQL cannot use it", dir, owner.name)
	}
	if err := os.Chown(dir, int(owner.uid), int(owner.gid)); err != nil {
		return fmt.Errorf("chown data directory to %s: %w", owner.name, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("chmod data directory: %w", err)
	}
	return nil
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", dir, err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); errors.Is(err, io.EOF) {
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("read %s: %w", dir, err)
	}
	return false, nil
}

// clearStalePID removes dataDir/postmaster.pid when the process it names is gone (or is not a
// PostgreSQL server), so that a cluster killed without a clean shutdown starts again. When the
// named process is a live PostgreSQL server the data directory is in use and the error wraps
// ErrDataDirInUse. It reports the PID whose file it removed (0 when none).
func clearStalePID(dataDir string) (int, error) {
	path := filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, perr := strconv.Atoi(strings.TrimSpace(first))
	if perr == nil && pid > 0 && processAlive(pid) && servesDataDir(pid, dataDir) {
		return 0, fmt.Errorf("%w: %s is used by a running PostgreSQL server (PID %d); stop it first", ErrDataDirInUse, dataDir, pid)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("remove stale %s: %w", path, err)
	}
	return pid, nil
}

// processAlive reports whether a process with this PID exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// servesDataDir reports whether pid is a PostgreSQL process working in dataDir (the postmaster
// and its children run with the data directory as working directory), so that a PID reused by
// an unrelated process, even another cluster's postgres, does not block a restart. When /proc
// does not let us see the working directory it falls back to the program name, and when it
// cannot tell at all it answers true, erring on the side of not deleting a live server's lock.
func servesDataDir(pid int, dataDir string) bool {
	proc := "/proc/" + strconv.Itoa(pid)
	cwd, err := os.Readlink(proc + "/cwd")
	if err == nil {
		want, evalErr := filepath.EvalSymlinks(dataDir)
		if evalErr != nil {
			want = dataDir
		}
		return cwd == want
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	comm, err := os.ReadFile(proc + "/comm")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres")
}
