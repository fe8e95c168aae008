package main

import (
	"strings"
	"testing"
)

// TestChoose: every benchmark is reachable by its name; a missing name, a flag in its place and
// an unknown name are errors that list the benchmarks.
func TestChoose(t *testing.T) {
	for name := range benchmarks {
		if run, err := choose([]string{name, "-x"}); err != nil || run == nil {
			t.Errorf("choose(%q): %v", name, err)
		}
	}
	for _, args := range [][]string{nil, {"-resources", "10"}, {"nosuch"}} {
		_, err := choose(args)
		if err == nil || !strings.Contains(err.Error(), "throughput") || !strings.Contains(err.Error(), "gate") {
			t.Errorf("choose(%q) = %v, want an error naming the benchmarks", args, err)
		}
	}
}
