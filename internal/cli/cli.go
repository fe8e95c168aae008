// Package cli is the mcpsync command line. Run executes one command and returns its ExitCode
// (see exit.go for the table: 0 success, 1 failure, 2 bad input, 3 nothing found, 4 refused,
// 5 denied, 6 rejected by the output guard). Every command validates its whole input before it
// contacts Temporal or the ledger, so bad input gets ExitUsage and one line on stderr naming
// the problem with or without a running stack. Commands that report state accept --json.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// Env is what a command runs with. Zero fields are filled from the environment.
type Env struct {
	Stdout, Stderr io.Writer
	Config         config.Env
	// Store and Temporal, if set, are used instead of connecting (tests).
	Store    *ledger.Store
	Temporal client.Client
}

// command is one registered command; name is one word, or two for a group ("source add").
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *runEnv, args []string) error
}

var commands []command

func register(c command) { commands = append(commands, c) }

// lookup returns the registered command called name, or nil.
func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// subcommands returns the second words of the commands of group ("add", "list" for "source"),
// sorted; none if group is not a group.
func subcommands(group string) []string {
	var subs []string
	for _, c := range commands {
		if g, sub, ok := strings.Cut(c.name, " "); ok && g == group {
			subs = append(subs, sub)
		}
	}
	slices.Sort(subs)
	return subs
}

// Run executes the command in args (without the program name) and returns the exit code.
func Run(ctx context.Context, env Env, args []string) ExitCode {
	if env.Config == (config.Env{}) {
		env.Config = config.FromEnv()
	}
	e := &runEnv{Env: env}
	defer e.close()
	if len(args) == 0 {
		printUsage(env.Stdout)
		fmt.Fprintln(env.Stderr, "mcpsync: missing command (see mcpsync help)")
		return ExitUsage
	}
	switch args[0] {
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" {
			return Run(ctx, env, append(slices.Clone(args[1:]), "--help"))
		}
		printUsage(env.Stdout)
		return ExitOK
	}
	name, rest := args[0], args[1:]
	if subs := subcommands(name); len(subs) > 0 {
		if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help") {
			printUsage(env.Stdout)
			return ExitOK
		}
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			fmt.Fprintf(env.Stderr, "mcpsync %s: missing subcommand (%s; see mcpsync help)\n", name, strings.Join(subs, ", "))
			return ExitUsage
		}
		name, rest = name+" "+rest[0], rest[1:]
	}
	cmd := lookup(name)
	if cmd == nil {
		fmt.Fprintf(env.Stderr, "mcpsync: unknown command %q (see mcpsync help)\n", name)
		return ExitUsage
	}
	err := cmd.run(ctx, e, rest)
	var h *helpRequest
	if errors.As(err, &h) {
		fmt.Fprintf(env.Stdout, "usage: %s\n%s", h.usage, h.flags)
		return ExitOK
	}
	if err != nil && !errors.Is(err, errSaid) {
		fmt.Fprintf(env.Stderr, "mcpsync %s: %s\n", name, visible(oneLine(redact.Text(err.Error()))))
	}
	return exitCodeOf(err)
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: mcpsync <command> [flags] [args]   (mcpsync help <command>: its flags)")
	fmt.Fprintln(w)
	sorted := append([]command(nil), commands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range sorted {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "environment: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, DATABASE_URL (defaults match mcpsync-dev)")
	fmt.Fprintln(w, "exit codes:")
	for _, r := range exitCodes {
		fmt.Fprintf(w, "  %d  %s\n", r.Code, r.Meaning)
	}
}
