package outside

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/benchline"
)

// never stands for the latency of a change whose version never arrived.
const never = time.Duration(math.MaxInt64)

// result is one phase at one offered rate.
type result struct {
	rate                          float64
	changes                       int
	offered                       float64 // changes per second made
	accepted, superseded, missing int
	perSec                        float64 // versions of the changes seen per second
	p50, p99, max                 time.Duration
	ledgerP50, ledgerP99          time.Duration // the same changes to their acceptance
	// The CPU over the phase and its drain: the machine's total and busy time (every CPU's),
	// mcpsync-dev's with its PostgreSQL, the worker's with its stdio servers.
	wall, machineBusy, devCPU, workerCPU time.Duration
	elapsed                              time.Duration // the phase and its drain
}

// summarize reads a phase: changes in the order made, each resource's last change, the
// versions seen by the watch, and how long the changes were offered. A change whose version
// was seen counts as accepted with the time to its line (and to its acceptance); one whose
// resource changed again afterwards and was not seen counts as superseded (its resource's
// later text was accepted instead, or is pending); any other one as missing, infinitely late.
func summarize(rate float64, changes []made, latest map[string]key, seen map[key]seenVersion, offeredFor time.Duration) result {
	r := result{rate: rate, changes: len(changes), offered: float64(len(changes)) / offeredFor.Seconds()}
	var lat, led []time.Duration
	last := time.Time{}
	var first time.Time
	for i, c := range changes {
		if i == 0 {
			first = c.at
		}
		v, ok := seen[c.k]
		switch {
		case ok:
			r.accepted++
			lat = append(lat, v.arrived.Sub(c.at))
			led = append(led, v.accepted.Sub(c.at))
			if v.arrived.After(last) {
				last = v.arrived
			}
		case latest[c.k.uri] != c.k:
			r.superseded++
		default:
			r.missing++
			lat = append(lat, never)
			led = append(led, never)
		}
	}
	if r.accepted > 0 {
		r.perSec = float64(r.accepted) / max(offeredFor, last.Sub(first)).Seconds()
	}
	r.p50, r.p99, r.max = pct(lat, 50), pct(lat, 99), pct(lat, 100)
	r.ledgerP50, r.ledgerP99 = pct(led, 50), pct(led, 99)
	return r
}

// pct is the p-th percentile of ds by nearest rank (0 for none).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(float64(p)/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// ms is d in milliseconds for a figure; never is +Inf.
func ms(d time.Duration) float64 {
	if d == never {
		return math.Inf(1)
	}
	return float64(d) / float64(time.Millisecond)
}

func share(part, whole time.Duration) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// print writes the phase's summary line and its figures named prefix-*-<rate>; with base,
// the latency and rate figures stand next to base's (the same rate on the quieter stack)
// instead of the acceptance latency and the offered rate.
func (r result) print(w io.Writer, prefix string, base *result) {
	rate := benchline.Number(r.rate)
	fmt.Fprintf(w, "%s: %s/s offered for %.0f s: %d changes, %d seen by mcpsync watch, %d superseded, %d missing; "+
		"to the watch line p50 %s p99 %s max %s, to acceptance p50 %s p99 %s; mcpsync-dev %.0f %% of a core, worker %.0f %%, machine %.0f %% busy\n",
		prefix, rate, float64(r.changes)/r.offered, r.changes, r.accepted, r.superseded, r.missing,
		fmtMS(r.p50), fmtMS(r.p99), fmtMS(r.max), fmtMS(r.ledgerP50), fmtMS(r.ledgerP99),
		share(r.devCPU, r.elapsed), share(r.workerCPU, r.elapsed), share(r.machineBusy, r.wall))
	fig := func(name string, v float64, unit string) benchline.Figure {
		return benchline.Figure{Name: fmt.Sprintf("%s-%s-%s", prefix, name, rate), Value: v, Unit: unit}
	}
	// Baselines: the same changes' acceptance and the offered rate, or base's figures.
	bp50 := benchline.Figure{Name: "outside-ledger-p50-" + rate, Value: ms(r.ledgerP50), Unit: "ms"}
	bp99 := benchline.Figure{Name: "outside-ledger-p99-" + rate, Value: ms(r.ledgerP99), Unit: "ms"}
	brate := benchline.Figure{Name: "outside-offered-" + rate, Value: r.offered, Unit: "/s"}
	if base != nil {
		bp50 = benchline.Figure{Name: "outside-p50-" + rate, Value: ms(base.p50), Unit: "ms"}
		bp99 = benchline.Figure{Name: "outside-p99-" + rate, Value: ms(base.p99), Unit: "ms"}
		brate = benchline.Figure{Name: "outside-accepted-" + rate, Value: base.perSec, Unit: "/s"}
	}
	benchline.PrintVs(w, fig("p50", ms(r.p50), "ms"), bp50)
	benchline.PrintVs(w, fig("p99", ms(r.p99), "ms"), bp99)
	benchline.PrintVs(w, fig("accepted", r.perSec, "/s"), brate)
	benchline.Print(w, fig("superseded", 100*float64(r.superseded)/float64(max(r.changes, 1)), "%"))
	benchline.Print(w, fig("dev-cpu", share(r.devCPU, r.elapsed), "%")) // of one core
}

func fmtMS(d time.Duration) string {
	if d == never {
		return "never"
	}
	return fmt.Sprintf("%.0f ms", ms(d))
}
