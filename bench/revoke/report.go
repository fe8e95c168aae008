// Latency summaries and the printed report of the revocation bench.

package revoke

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/benchline"
)

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

type summary struct {
	N      int     `json:"n"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	MeanMs float64 `json:"meanMs"`
}

func summarize(ds []time.Duration) summary {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	s := summary{N: len(ds), P50Ms: ms(quantile(ds, 0.50)), P99Ms: ms(quantile(ds, 0.99)), MaxMs: ms(quantile(ds, 1))}
	if len(ds) > 0 {
		s.MeanMs = ms(sum / time.Duration(len(ds)))
	}
	return s
}

// loadAverage is the 1, 5 and 15 minute load average of the machine, when known.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func (b *bench) report(r results) {
	out := struct {
		Subscriptions               int     `json:"subscriptions"`
		Principals                  int     `json:"principals"`
		Indexes                     int     `json:"indexes"`
		LineageEntries              int     `json:"lineageEntries"`
		SeedSeconds                 float64 `json:"seedSeconds"`
		LoadAverage                 string  `json:"loadAverage"`
		RevokeToIndexesDelivered    summary `json:"revokeToIndexesDelivered"`
		RevokeToCloseFence          summary `json:"revokeToCloseFence"`
		RevokeToSubscriptionsClosed summary `json:"revokeToSubscriptionsClosed"`
		RevokeCommand               summary `json:"revokeCommand"`
		BaselineInsertToDelivered   summary `json:"baselineInsertToDelivered"`
	}{
		Subscriptions: b.o.subscriptions, Principals: b.o.principals, Indexes: b.o.indexes,
		LineageEntries: b.o.subscriptions * b.o.indexes, SeedSeconds: r.Seed.Seconds(), LoadAverage: loadAverage(),
		RevokeToIndexesDelivered: summarize(r.Delivered), RevokeToCloseFence: summarize(r.Fenced), RevokeToSubscriptionsClosed: summarize(r.Closed),
		RevokeCommand: summarize(r.Command), BaselineInsertToDelivered: summarize(r.Baseline),
	}
	if b.o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return
	}
	fmt.Printf("revokebench: %d subscriptions (%d principals x %d), %d indexes, %d lineage entries; seed %.1f s\n",
		out.Subscriptions, out.Principals, b.o.subscriptions/b.o.principals, out.Indexes, out.LineageEntries, out.SeedSeconds)
	fmt.Printf("machine: %d CPUs, load average %s (other processes share them)\n", runtime.NumCPU(), out.LoadAverage)
	fmt.Printf("background: every subscription re-reads its resource every %s (backstop)\n", b.o.backstop)
	fmt.Printf("each revocation: 1 principal, %d subscriptions to close, %d indexes x %d entries invalidated\n",
		r.Subscriptions, b.o.indexes, r.Entries)
	line := func(what string, s summary) {
		fmt.Printf("  %-58s n=%-4d p50 %8.1f ms  p99 %8.1f ms  max %8.1f ms\n", what, s.N, s.P50Ms, s.P99Ms, s.MaxMs)
	}
	line("revoke -> every index's invalidation delivered (goal p99 <= 2 s)", out.RevokeToIndexesDelivered)
	line("revoke -> the principal's subscriptions past the close fence", out.RevokeToCloseFence)
	line("revoke -> the principal's subscriptions CLOSED", out.RevokeToSubscriptionsClosed)
	line("revoke command (ledger transaction + signals)", out.RevokeCommand)
	line("baseline: outbox insert -> delivered to every consumer", out.BaselineInsertToDelivered)

	// The issue-16 lines: one figure each, next to the baseline where there is one.
	n := out.Subscriptions
	fig := func(name string, v float64) benchline.Figure {
		return benchline.Figure{Name: fmt.Sprintf("%s-%d", name, n), Value: v, Unit: "ms"}
	}
	base := func(name string, v float64) benchline.Figure {
		return benchline.Figure{Name: name, Value: v, Unit: "ms"}
	}
	fmt.Println()
	benchline.PrintVs(os.Stdout, fig("revoke-delivered-p50", out.RevokeToIndexesDelivered.P50Ms), base("outbox-delivered-p50", out.BaselineInsertToDelivered.P50Ms))
	benchline.PrintVs(os.Stdout, fig("revoke-delivered-p99", out.RevokeToIndexesDelivered.P99Ms), base("outbox-delivered-p99", out.BaselineInsertToDelivered.P99Ms))
	benchline.Print(os.Stdout, fig("revoke-fenced-p99", out.RevokeToCloseFence.P99Ms))
	benchline.Print(os.Stdout, fig("revoke-closed-p99", out.RevokeToSubscriptionsClosed.P99Ms))
	benchline.Print(os.Stdout, fig("revoke-command-p99", out.RevokeCommand.P99Ms))
}
