// Package gate is mcpsync's release gate (SPEC R24–R29): it brings up a whole deployment in
// this process (localstack: real Temporal server, Postgres ledger, workers, fault-injecting
// MCP servers), runs each measurement the seed's release table names, and reports every
// metric against its threshold. A release passes only if every row passes.
package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/harness/localstack"
)

// Options configure a gate run. Zero sizes take the release defaults.
type Options struct {
	// AdminURL is a Postgres admin URL; empty starts a private cluster.
	AdminURL string
	// Progress receives one line per step (nil: discarded).
	Progress io.Writer
	// Logger receives the deployment's logs (nil: discarded).
	Logger *zap.Logger

	// Shuffles is the number of shuffled notification/read/close interleavings (R26;
	// default 100,000).
	Shuffles int
	// StormResources, StormRounds and StormCopies size the duplicate-notification storm
	// (R27; defaults 50 resources × 10 changes, each notified 100 times). The storm runs
	// once per MCP era (2025-11-25, 2026-07-28) at this size, one row each.
	StormResources, StormRounds, StormCopies int
	// StormSpacing is the gap between the copies of one notification (default 2 ms): copies
	// arrive as separate messages, so they reach the workflow as separate signals instead of
	// being merged by the host within one routing batch only.
	StormSpacing time.Duration
	// ConvergeResources, ConvergeRate, ConvergeFor and DropRate size the convergence run
	// (R28; defaults 1,000 resources, 20 mutations/s for 60 s, 20 % of notifications dropped).
	// The run happens once per MCP era at this size, one row each.
	ConvergeResources int
	ConvergeRate      float64
	ConvergeFor       time.Duration
	DropRate          float64
	// Within is the convergence deadline of R28 (default 60 s).
	Within time.Duration
	// Revocations is the number of principals revoked, each with reads in flight, for the
	// revocation latency of R29 (default 1,000).
	Revocations int
	// Only, if set, runs only the sections named (shuffles, discovery, storm, converge,
	// revocation); the checker self-test and the invariants always run.
	Only []string
}

func (o *Options) defaults() {
	if o.Shuffles == 0 {
		o.Shuffles = 100000
	}
	if o.StormResources == 0 {
		o.StormResources = 50
	}
	if o.StormRounds == 0 {
		o.StormRounds = 10
	}
	if o.StormCopies == 0 {
		o.StormCopies = 100
	}
	if o.StormSpacing == 0 {
		o.StormSpacing = 2 * time.Millisecond
	}
	if o.ConvergeResources == 0 {
		o.ConvergeResources = 1000
	}
	if o.ConvergeRate == 0 {
		o.ConvergeRate = 20
	}
	if o.ConvergeFor == 0 {
		o.ConvergeFor = 60 * time.Second
	}
	if o.DropRate == 0 {
		o.DropRate = 0.2
	}
	if o.Within == 0 {
		o.Within = 60 * time.Second
	}
	if o.Revocations == 0 {
		o.Revocations = 1000
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
}

func (o *Options) runs(section string) bool {
	if len(o.Only) == 0 {
		return true
	}
	for _, s := range o.Only {
		if s == section {
			return true
		}
	}
	return false
}

// Row is one line of the release table.
type Row struct {
	Requirement string  `json:"requirement"`
	Metric      string  `json:"metric"`
	Threshold   string  `json:"threshold"`
	Measured    string  `json:"measured"`
	Value       float64 `json:"value"`
	Pass        bool    `json:"pass"`
	Detail      string  `json:"detail,omitempty"`
}

// Result is a gate run's table.
type Result struct {
	Rows    []Row         `json:"rows"`
	Pass    bool          `json:"pass"`
	Elapsed time.Duration `json:"elapsedNanos"`
}

// zero is a row whose threshold is "= 0".
func zero(req, metric string, n int, detail string) Row {
	return Row{Requirement: req, Metric: metric, Threshold: "= 0", Measured: fmt.Sprint(n), Value: float64(n), Pass: n == 0, Detail: detail}
}

// section is one measurement of the gate.
type section struct {
	name string
	run  func(ctx context.Context, g *run) ([]Row, error)
}

// run is the state of one gate run.
type run struct {
	opts  Options
	stack *localstack.Stack
}

func (g *run) progress(format string, args ...any) {
	fmt.Fprintf(g.opts.Progress, "gate: "+format+"\n", args...)
}

var sections []section

// Run brings the deployment up, runs every section and the R24 invariants, and tears the
// deployment down. An error means the gate could not measure (not that a metric failed).
func Run(ctx context.Context, opts Options) (Result, error) {
	opts.defaults()
	start := time.Now()
	g := &run{opts: opts}
	g.progress("starting Temporal, Postgres and a worker")
	st, err := localstack.Start(ctx, localstack.Options{AdminURL: opts.AdminURL, Logger: opts.Logger})
	if err != nil {
		return Result{}, fmt.Errorf("gate: deployment: %w", err)
	}
	defer st.Stop()
	g.stack = st
	var res Result
	// The checker self-test runs first and the invariants last, whatever Only says.
	all := append(append([]section{selfTestSection}, sections...), invariantsSection)
	for _, s := range all {
		if s.name != invariantsSection.name && s.name != selfTestSection.name && !opts.runs(s.name) {
			continue
		}
		t := time.Now()
		g.progress("%s: running", s.name)
		rows, err := s.run(ctx, g)
		if err != nil {
			return res, fmt.Errorf("gate: %s: %w", s.name, err)
		}
		for _, r := range rows {
			status := "pass"
			if !r.Pass {
				status = "FAIL"
			}
			g.progress("%s: %s = %s (%s) %s", s.name, r.Metric, r.Measured, r.Threshold, status)
		}
		g.progress("%s: done in %s", s.name, time.Since(t).Round(time.Millisecond))
		res.Rows = append(res.Rows, rows...)
	}
	res.Pass = true
	for _, r := range res.Rows {
		res.Pass = res.Pass && r.Pass
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// WriteTable prints the release table.
func (r Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REQ\tMETRIC\tSEED THRESHOLD\tMEASURED\tRESULT")
	for _, row := range r.Rows {
		status := "pass"
		if !row.Pass {
			status = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", row.Requirement, row.Metric, row.Threshold, row.Measured, status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	var notes []string
	for _, row := range r.Rows {
		if row.Detail != "" {
			notes = append(notes, fmt.Sprintf("  %s %s: %s", row.Requirement, row.Metric, row.Detail))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:\n"+strings.Join(notes, "\n"))
	}
	_, err := fmt.Fprintf(w, "\nrelease gate: %s (%d rows, %s)\n", verdict, len(r.Rows), r.Elapsed.Round(time.Second))
	return err
}

// WriteJSON prints the result as JSON.
func (r Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Sections lists the names of the gate's sections, in the order they run.
func Sections() []string {
	var out []string
	for _, s := range sections {
		out = append(out, s.name)
	}
	return out
}

// Known reports whether name is a section.
func Known(name string) bool {
	for _, s := range sections {
		if s.name == name {
			return true
		}
	}
	return false
}
