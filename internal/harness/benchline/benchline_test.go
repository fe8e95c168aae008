package benchline_test

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/benchline"
)

func TestLines(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"with baseline", benchline.LineVs(benchline.Figure{"e2e-accepted-1000", 152, "/s"}, benchline.Figure{"floor-accepted-1000", 190, "/s"}),
			"bench: e2e-accepted-1000 152 /s (baseline floor-accepted-1000 190 /s, ratio 0.80)"},
		{"alone", benchline.Line(benchline.Figure{"e2e-p99-1000", 210.4, "ms"}), "bench: e2e-p99-1000 210 ms"},
		{"seconds", benchline.LineVs(benchline.Figure{"scan-ab-100000", 1.21, "s"}, benchline.Figure{"raw-list-100000", 0.56, "s"}),
			"bench: scan-ab-100000 1.21 s (baseline raw-list-100000 0.56 s, ratio 2.16)"},
		{"no unit", benchline.Line(benchline.Figure{"e2e-events-per-update", 14.25, ""}), "bench: e2e-events-per-update 14.2"},
		{"small", benchline.Line(benchline.Figure{"x", 0.0123, "s"}), "bench: x 0.012 s"},
		{"zero baseline", benchline.LineVs(benchline.Figure{"a", 1.5, "/s"}, benchline.Figure{"b", 0, "/s"}), "bench: a 1.50 /s (baseline b 0 /s, ratio n/a)"},
		{"whole number", benchline.Line(benchline.Figure{"e2e-superseded-1000", 21, "mutations"}), "bench: e2e-superseded-1000 21 mutations"},
		{"infinite baseline", benchline.LineVs(benchline.Figure{"e2e-p99", 45719, "ms"}, benchline.Figure{"floor-p99", math.Inf(1), "ms"}),
			"bench: e2e-p99 45719 ms (baseline floor-p99 +Inf ms, ratio n/a)"},
		{"infinite", benchline.Line(benchline.Figure{"p99", math.Inf(1), "ms"}), "bench: p99 +Inf ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
