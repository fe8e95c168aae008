package cli

import (
	"errors"
	"fmt"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// ExitCode is the status mcpsync exits with. Run returns one of the constants below (or, for
// `mcpsync gate`, the release gate's own status); scripts may rely on each value. README.md
// ("Exit codes") lists the same table, and a test keeps the two equal.
type ExitCode int

// Exit codes of the mcpsync command line.
const (
	// ExitOK: the command did what it was asked (help included).
	ExitOK ExitCode = 0
	// ExitFailure: the command did not complete: a service unreachable, an operation that
	// failed or did not finish within its wait.
	ExitFailure ExitCode = 1
	// ExitUsage: bad input: an unknown command or flag, a missing or extra argument, a
	// malformed value or a contradictory combination of flags. Exactly one line on stderr names
	// the problem, and it is found before anything is contacted (no Temporal, no ledger).
	ExitUsage ExitCode = 2
	// ExitNotFound: what the command names does not exist: an unknown source, no subscription,
	// no accepted version, no catalog yet, no standing grant to revoke.
	ExitNotFound ExitCode = 3
	// ExitRefused: the ledger refused the source's catalog for the purpose: anything short of
	// SNAPSHOT_PROVEN for integrity, a catalog that needs reconciliation for anybody (catalog;
	// R7, R25).
	ExitRefused ExitCode = 4
	// ExitDenied: the principal holds no standing grant on the source, or the version is not
	// published under the current roll-out (get, subscribe; R24, R30).
	ExitDenied ExitCode = 5
	// ExitGuardRejected: the output guard rejected the content; nothing was delivered (get).
	ExitGuardRejected ExitCode = 6
)

// exitCodeRow is one row of the exit-code table.
type exitCodeRow struct {
	Code    ExitCode
	Name    string // the constant's name
	Meaning string // as `mcpsync help` prints it
}

// exitCodes is the exit-code table, in order; `mcpsync help` prints it and README.md repeats
// it.
var exitCodes = []exitCodeRow{
	{ExitOK, "ExitOK", "success"},
	{ExitFailure, "ExitFailure", "failure (a service unreachable, an operation that did not complete)"},
	{ExitUsage, "ExitUsage", "bad input (one line on stderr; nothing contacted)"},
	{ExitNotFound, "ExitNotFound", "nothing found"},
	{ExitRefused, "ExitRefused", "refused (a catalog short of the purpose's proof level)"},
	{ExitDenied, "ExitDenied", "denied (no standing grant, or not published under the roll-out)"},
	{ExitGuardRejected, "ExitGuardRejected", "rejected by the output guard"},
}

// exitError carries an exit code with its message.
type exitError struct {
	code ExitCode
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// errSaid stands for a failure whose reason was already printed on the command's stderr (by a
// child process the command ran): Run prints nothing more and exits with the exitError's code.
var errSaid = errors.New("reason already printed")

// usageErr is a bad-input error (ExitUsage).
func usageErr(format string, args ...any) error {
	return &exitError{ExitUsage, fmt.Errorf(format, args...)}
}

// notFoundErr is a nothing-found error (ExitNotFound).
func notFoundErr(format string, args ...any) error {
	return &exitError{ExitNotFound, fmt.Errorf(format, args...)}
}

// deniedErr gives an error that says the principal holds no standing grant (ledger.ErrNoGrant)
// on the source named source the ExitDenied code and the message grantErrNamed gives it; any
// other error (nil included) is returned as it is.
func deniedErr(err error, source string) error {
	if !errors.Is(err, ledger.ErrNoGrant) {
		return err
	}
	return &exitError{ExitDenied, grantErrNamed(err, source)}
}

// grantErrNamed returns the *ledger.GrantError in err naming the source as the user gave it
// (source; "" for a principal's grants on every source) instead of by its row ID, without the
// ledger's prefixes; an err without one is returned as it is.
func grantErrNamed(err error, source string) error {
	var ge *ledger.GrantError
	if !errors.As(err, &ge) {
		return err
	}
	named := *ge
	if named.SourceName == "" {
		named.SourceName = source
	}
	return &named
}

// helpRequest is returned by parse for -h/--help: Run prints the command's usage and flags on
// stdout and exits ExitOK.
type helpRequest struct {
	usage string
	flags string // the flags with their defaults, as flag.PrintDefaults prints them
}

func (h *helpRequest) Error() string { return "usage: " + h.usage }

// exitCodeOf maps the error a command returned to the exit code.
func exitCodeOf(err error) ExitCode {
	var ee *exitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, ledger.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, ledger.ErrInvalid) || errors.Is(err, ledger.ErrSourceExists):
		return ExitUsage
	}
	return ExitFailure
}
