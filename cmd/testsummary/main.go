// Command testsummary reads `go test -json` on stdin, prints each package's result as it
// finishes, then a summary: packages and tests passed, failed and skipped, and the output of
// every failed test. A test binary that dies mid-test (os.Exit, a fatal runtime error) leaves
// its running tests without a result: those are listed with their output under their failed
// package, since that output holds the cause. It exits 1 if anything failed or the stream
// reports a build failure.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	os.Exit(summarize(os.Stdin, os.Stdout, time.Now()))
}

// summarize reads the `go test -json` stream in, writes the report to w and returns the exit
// code: 1 if a package or test failed, or nothing but non-JSON lines (a build failure) came.
func summarize(in io.Reader, w io.Writer, start time.Time) int {
	type key struct{ pkg, test string }
	output := map[key]*strings.Builder{}
	running := map[key]bool{} // tests with a "run" event and no result yet
	var failedTests []key
	counts := map[string]int{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	nonJSON := 0
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Build errors and other plain lines: show them as they come.
			fmt.Fprintln(w, string(line))
			nonJSON++
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "run":
			running[k] = true
		case "output":
			b := output[k]
			if b == nil {
				b = &strings.Builder{}
				output[k] = b
			}
			if b.Len() < 1<<20 {
				b.WriteString(e.Output)
			}
		case "pass", "fail", "skip":
			if e.Test != "" {
				delete(running, k)
				counts["test "+e.Action]++
				if e.Action == "fail" {
					failedTests = append(failedTests, k)
				}
				if e.Action != "fail" {
					delete(output, k)
				}
				continue
			}
			counts["package "+e.Action]++
			status := map[string]string{"pass": "ok  ", "fail": "FAIL", "skip": "----"}[e.Action]
			fmt.Fprintf(w, "%s %-60s %7.1fs\n", status, e.Package, e.Elapsed)
			if e.Action != "fail" {
				continue
			}
			if b := output[key{e.Package, ""}]; b != nil {
				fmt.Fprint(w, indent(tail(b.String(), 60)))
			}
			var unfinished []key
			for r := range running {
				if r.pkg == e.Package {
					unfinished = append(unfinished, r)
				}
			}
			sort.Slice(unfinished, func(i, j int) bool { return unfinished[i].test < unfinished[j].test })
			for _, r := range unfinished {
				delete(running, r)
				counts["test unfinished"]++
				fmt.Fprintf(w, "    --- NO RESULT %s (the test binary ended while it ran)\n", r.test)
				if b := output[r]; b != nil {
					fmt.Fprint(w, indent(indent(tail(b.String(), 80))))
				}
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "go test summary")
	fmt.Fprintf(w, "  packages: %d ok, %d failed, %d without tests\n", counts["package pass"], counts["package fail"], counts["package skip"])
	fmt.Fprintf(w, "  tests:    %d passed, %d failed, %d skipped\n", counts["test pass"], counts["test fail"], counts["test skip"])
	if n := counts["test unfinished"]; n > 0 {
		fmt.Fprintf(w, "            %d without a result (their test binary ended while they ran)\n", n)
	}
	fmt.Fprintf(w, "  elapsed:  %s\n", time.Since(start).Round(time.Second))
	sort.Slice(failedTests, func(i, j int) bool {
		return failedTests[i].pkg+failedTests[i].test < failedTests[j].pkg+failedTests[j].test
	})
	for _, k := range failedTests {
		fmt.Fprintf(w, "\n--- FAIL %s %s\n", k.pkg, k.test)
		if b := output[k]; b != nil {
			fmt.Fprint(w, indent(tail(b.String(), 80)))
		}
	}
	if counts["package fail"] > 0 || counts["test fail"] > 0 || nonJSON > 0 && counts["package pass"] == 0 {
		return 1
	}
	return 0
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = append([]string{fmt.Sprintf("... (%d lines cut)", len(parts)-lines)}, parts[len(parts)-lines:]...)
	}
	return strings.Join(parts, "\n") + "\n"
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
