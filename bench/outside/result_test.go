package outside

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A phase's changes are counted as seen (with the time to their watch line and to their
// acceptance), superseded (the resource changed again and that text was seen or is pending)
// or missing (infinitely late), and the figures say so.
func TestSummarize(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	a, b1, b2, c := key{"demo://items/0001", "a"}, key{"demo://items/0002", "b1"}, key{"demo://items/0002", "b2"}, key{"demo://items/0003", "c"}
	changes := []made{{a, at(0)}, {b1, at(100)}, {b2, at(200)}, {c, at(300)}}
	latest := map[string]key{a.uri: a, b1.uri: b2, c.uri: c}
	seen := map[key]seenVersion{
		a:  {arrived: at(60), accepted: at(50)},
		b2: {arrived: at(280), accepted: at(260)},
	}
	r := summarize(30, changes, latest, seen, time.Second)
	got := []any{r.changes, r.accepted, r.superseded, r.missing, r.p50, r.p99, r.max, r.ledgerP50, r.ledgerP99}
	want := []any{4, 2, 1, 1, 80 * time.Millisecond, never, never, 60 * time.Millisecond, never}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("changes, accepted, superseded, missing, p50, p99, max, ledger p50, p99 (-want +got):\n%s", diff)
	}
	if r.offered != 4 || r.perSec != 2 {
		t.Errorf("offered %v/s, seen %v/s; want 4 and 2", r.offered, r.perSec)
	}
	var out bytes.Buffer
	r.print(&out, "outside", nil)
	for _, line := range []string{
		"bench: outside-p50-30 80 ms (baseline outside-ledger-p50-30 60 ms, ratio 1.33)",
		"bench: outside-p99-30 +Inf ms (baseline outside-ledger-p99-30 +Inf ms, ratio n/a)",
		"bench: outside-accepted-30 2 /s (baseline outside-offered-30 4 /s, ratio 0.50)",
		"bench: outside-superseded-30 25 %",
	} {
		if !strings.Contains(out.String(), line+"\n") {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}
	out.Reset()
	r.print(&out, "outside-loaded", &result{p50: 40 * time.Millisecond, p99: 100 * time.Millisecond, perSec: 4})
	if line := "bench: outside-loaded-p50-30 80 ms (baseline outside-p50-30 40 ms, ratio 2.00)"; !strings.Contains(out.String(), line+"\n") {
		t.Errorf("output lacks %q:\n%s", line, out.String())
	}
}

func TestPct(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		p    int
		want time.Duration
	}{{50, 5}, {99, 10}, {100, 10}, {10, 1}, {0, 1}} {
		if got := pct(ds, c.p); got != c.want {
			t.Errorf("pct(%d) = %d, want %d", c.p, got, c.want)
		}
	}
	if got := pct(nil, 50); got != 0 {
		t.Errorf("pct of none = %d, want 0", got)
	}
}

func TestParseRates(t *testing.T) {
	got, err := parseRates("10, 30,2.5")
	if diff := cmp.Diff([]float64{10, 30, 2.5}, got); diff != "" || err != nil {
		t.Errorf("parseRates: %v (-want +got):\n%s", err, diff)
	}
	for _, bad := range []string{"", "10,", "0", "-3", "x", "Inf", "NaN"} {
		if _, err := parseRates(bad); err == nil {
			t.Errorf("parseRates(%q) succeeded", bad)
		}
	}
}
