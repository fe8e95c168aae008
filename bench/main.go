// Command mcpsync-bench runs one of mcpsync's benchmarks, named by its first argument, with the
// rest of the command line as that benchmark's flags:
//
//	go run ./bench throughput [-subscriptions 1000] [-rate 150] ...
//	bin/bench/mcpsync-bench scan -resources 5000 -runs 1
//
// Every benchmark is a package under bench/ (bench/throughput, bench/scan, ...) whose Main reads
// os.Args; gate is the release gate's command line (cmd/mcpsync-gate), which `make bench` uses
// for its duplicate-notification storm. They share one binary so that `make bench` and `make
// bench-quick` link the embedded Temporal server once, not once per benchmark. An unknown or
// missing name prints one line naming the benchmarks and exits 2. The process runs the
// collector target of mcpsync's long-running processes (gcpolicy) and prints it first.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/mcpsync/mcpsync/bench/gateway"
	"github.com/mcpsync/mcpsync/bench/ledger"
	"github.com/mcpsync/mcpsync/bench/machine"
	"github.com/mcpsync/mcpsync/bench/outside"
	"github.com/mcpsync/mcpsync/bench/persistence"
	"github.com/mcpsync/mcpsync/bench/prune"
	"github.com/mcpsync/mcpsync/bench/revoke"
	"github.com/mcpsync/mcpsync/bench/scale"
	"github.com/mcpsync/mcpsync/bench/scan"
	"github.com/mcpsync/mcpsync/bench/throughput"
	"github.com/mcpsync/mcpsync/internal/gcpolicy"
	"github.com/mcpsync/mcpsync/internal/harness/gate"
)

// benchmarks maps a benchmark's name to its entry point, which reads os.Args[1:] and the
// global flag set.
var benchmarks = map[string]func(){
	"gate":        func() { os.Exit(gate.Main(os.Args[1:], os.Stdout, os.Stderr)) },
	"gateway":     gateway.Main,
	"ledger":      ledger.Main,
	"machine":     machine.Main,
	"outside":     outside.Main,
	"persistence": persistence.Main,
	"prune":       prune.Main,
	"revoke":      revoke.Main,
	"scale":       scale.Main,
	"scan":        scan.Main,
	"throughput":  throughput.Main,
}

func main() {
	run, err := choose(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-bench:", err)
		os.Exit(2)
	}
	// The benchmark sees itself as the program: its flags start at os.Args[1].
	name := "mcpsync-bench " + os.Args[1]
	os.Args = append([]string{name}, os.Args[2:]...)
	flag.CommandLine = flag.NewFlagSet(name, flag.ExitOnError)
	// The benchmark's process plays mcpsync-dev and the worker (the embedded server, in-process
	// workers): it runs the collector target they run.
	fmt.Printf("garbage collector target (GOGC): %s\n", gcpolicy.Apply())
	run()
}

// choose returns the entry point of the benchmark args[0] names, or an error naming them all.
func choose(args []string) (func(), error) {
	names := make([]string, 0, len(benchmarks))
	for n := range benchmarks {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return nil, fmt.Errorf("name a benchmark first (one of %s), then its flags", strings.Join(names, ", "))
	}
	run, ok := benchmarks[args[0]]
	if !ok {
		return nil, fmt.Errorf("unknown benchmark %q (have %s)", args[0], strings.Join(names, ", "))
	}
	return run, nil
}
