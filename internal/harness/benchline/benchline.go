// Package benchline prints benchmark figures in the one-line format every mcpsync bench uses
// (issue 16 item 6), so that runs can be compared by grepping "bench: ":
//
//	bench: <name> <value> <unit> (baseline <name> <value> <unit>, ratio <r>)
//	bench: <name> <value> <unit>
//
// The ratio is value / baseline value, printed with two decimals.
package benchline

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Figure is one measured value: Name has no spaces (e.g. "e2e-accepted-1000"), Unit is short
// (e.g. "/s", "ms", "s", "GiB"; empty for a pure number).
type Figure struct {
	Name  string
	Value float64
	Unit  string
}

// String renders "<name> <value> <unit>" (the unit left out when empty), the value formatted
// by Number.
func (f Figure) String() string {
	s := strings.ReplaceAll(f.Name, " ", "-") + " " + Number(f.Value)
	if f.Unit != "" {
		s += " " + f.Unit
	}
	return s
}

// Number formats v as the lines do: no decimals from 100 up or for a whole number, one from
// 10, two below (three below 0.1); NaN and infinities as Go prints them.
func Number(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'f', -1, 64)
	case a >= 100 || (v == math.Trunc(v) && a < 1e15):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 0.1 || a == 0:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// Line is the line for f alone, without a newline.
func Line(f Figure) string { return "bench: " + f.String() }

// LineVs is the line for f next to its baseline and the ratio f/baseline, without a newline;
// the ratio is "n/a" when it is not a finite number (a baseline of 0, an infinite or NaN
// value).
func LineVs(f, baseline Figure) string {
	ratio := "n/a"
	if r := f.Value / baseline.Value; !math.IsNaN(r) && !math.IsInf(r, 0) && !math.IsInf(baseline.Value, 0) {
		ratio = strconv.FormatFloat(r, 'f', 2, 64)
	}
	return fmt.Sprintf("bench: %s (baseline %s, ratio %s)", f, baseline, ratio)
}

// Print writes Line(f) and a newline to w.
func Print(w io.Writer, f Figure) { fmt.Fprintln(w, Line(f)) }

// PrintVs writes LineVs(f, baseline) and a newline to w.
func PrintVs(w io.Writer, f, baseline Figure) { fmt.Fprintln(w, LineVs(f, baseline)) }
