package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

func init() {
	register(command{"gate", "[--shuffles 100000] [--json] [--only a,b]: run the release gate (mcpsync-gate) and print its table", gate})
}

// gate runs mcpsync-gate (built next to mcpsync; it embeds a whole deployment, so the CLI does
// not carry it) with the same arguments, passing its output and exit code through.
func gate(ctx context.Context, e *runEnv, args []string) error {
	path, err := gateBinary()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = e.Stdout, e.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return &exitError{exit.ExitCode(), fmt.Errorf("the release gate did not pass (exit %d)", exit.ExitCode())}
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
