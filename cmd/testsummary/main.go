// Command testsummary reads `go test -json` on stdin, prints each package's result as it
// finishes, then a summary: packages and tests passed, failed and skipped, and the output of
// every failed test. It exits 1 if anything failed or the stream reports a build failure.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
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
	type key struct{ pkg, test string }
	output := map[key]*strings.Builder{}
	var failedTests []key
	counts := map[string]int{}
	pkgResult := map[string]string{}
	start := time.Now()
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	nonJSON := 0
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Build errors and other plain lines: show them as they come.
			fmt.Println(string(line))
			nonJSON++
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
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
				counts["test "+e.Action]++
				if e.Action == "fail" {
					failedTests = append(failedTests, k)
				}
				if e.Action != "fail" {
					delete(output, k)
				}
				continue
			}
			pkgResult[e.Package] = e.Action
			counts["package "+e.Action]++
			status := map[string]string{"pass": "ok  ", "fail": "FAIL", "skip": "----"}[e.Action]
			fmt.Printf("%s %-60s %7.1fs\n", status, e.Package, e.Elapsed)
			if e.Action == "fail" {
				if b := output[key{e.Package, ""}]; b != nil {
					fmt.Print(indent(tail(b.String(), 60)))
				}
			}
		}
	}
	fmt.Println()
	fmt.Println("go test summary")
	fmt.Printf("  packages: %d ok, %d failed, %d without tests\n", counts["package pass"], counts["package fail"], counts["package skip"])
	fmt.Printf("  tests:    %d passed, %d failed, %d skipped\n", counts["test pass"], counts["test fail"], counts["test skip"])
	fmt.Printf("  elapsed:  %s\n", time.Since(start).Round(time.Second))
	sort.Slice(failedTests, func(i, j int) bool {
		return failedTests[i].pkg+failedTests[i].test < failedTests[j].pkg+failedTests[j].test
	})
	for _, k := range failedTests {
		fmt.Printf("\n--- FAIL %s %s\n", k.pkg, k.test)
		if b := output[k]; b != nil {
			fmt.Print(indent(tail(b.String(), 80)))
		}
	}
	if counts["package fail"] > 0 || counts["test fail"] > 0 || nonJSON > 0 && counts["package pass"] == 0 {
		os.Exit(1)
	}
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
