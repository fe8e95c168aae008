package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

func init() {
	register(command{"gate", "[--shuffles 100000] [--resources 1000] [--revocations 1000] [--only a,b] [--json] [--database URL]: run the release gate (mcpsync-gate) and print its table", gate})
}

// gate runs mcpsync-gate (built next to mcpsync; it embeds a whole deployment, so the CLI does
// not carry it) with the same arguments, passing its output and exit code through.
func gate(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync gate [--shuffles N] [--resources N] [--converge-for D] [--revocations N] [--storm-resources N] [--storm-rounds N] [--only a,b] [--json] [--database URL] [--log-level L] [--log-file F]"
	// The flags of mcpsync-gate (cmd/mcpsync-gate; keep the two in step), declared here so
	// that bad input is rejected with one line before a whole deployment starts. The section
	// names of --only are checked by mcpsync-gate itself.
	fs := flag.NewFlagSet("gate", flag.ContinueOnError)
	shuffles := fs.Int("shuffles", 100000, "shuffled interleavings (R26)")
	fs.Bool("json", false, "print the table as JSON")
	fs.String("database", "", "admin URL of a Postgres server to use (empty: MCPSYNC_GATE_DATABASE_URL, or a private one)")
	fs.String("only", "", "comma-separated sections to run (shuffles,discovery,storm,converge,revocation); the invariants always run")
	resources := fs.Int("resources", 1000, "active resources of the convergence run (R28)")
	revocations := fs.Int("revocations", 1000, "principals revoked with reads in flight for the revocation latency (R29)")
	stormResources := fs.Int("storm-resources", 50, "resources of the duplicate-notification storm (R27)")
	stormRounds := fs.Int("storm-rounds", 10, "changes of every storm resource, one round each (R27)")
	convergeFor := fs.Duration("converge-for", 60*time.Second, "how long the convergence run (R28) mutates resources, per era")
	fs.String("log-level", "warn", "log level of the deployment's component logs")
	fs.String("log-file", "", "file for the deployment's component logs (empty: a new temporary file, named on the console)")
	if _, err := parse(fs, args, usage); err != nil {
		return err
	}
	if *shuffles < 0 {
		return usageErr("--shuffles must not be negative, got %d", *shuffles)
	}
	if *resources <= 0 {
		return usageErr("--resources must be positive, got %d", *resources)
	}
	if *revocations <= 0 {
		return usageErr("--revocations must be positive, got %d", *revocations)
	}
	if *stormResources <= 0 {
		return usageErr("--storm-resources must be positive, got %d", *stormResources)
	}
	if *stormRounds <= 0 {
		return usageErr("--storm-rounds must be positive, got %d", *stormRounds)
	}
	if *convergeFor <= 0 {
		return usageErr("--converge-for must be positive, got %s", *convergeFor)
	}
	path, err := gateBinary()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = e.Stdout, e.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code := ExitCode(exit.ExitCode())
		if code == ExitUsage {
			// Bad input mcpsync-gate found itself (an unknown --only section): it said so in
			// one line, and no gate ran, so none "did not pass".
			return &exitError{code, errSaid}
		}
		return &exitError{code, fmt.Errorf("the release gate did not pass (exit %d)", code)}
	}
	return err
}

func gateBinary() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "mcpsync-gate")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("mcpsync-gate"); err == nil {
		return p, nil
	}
	return "", errors.New("mcpsync-gate not found next to mcpsync or on PATH; build it with `make build`")
}
