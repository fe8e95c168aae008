package scan_test

import (
	"testing"
	"time"

	"github.com/mcpsync/mcpsync/bench/scan"
)

// TestPairRatios: each run's scan against its own raw listing, two decimals, in run order (the
// line the spread is read from).
func TestPairRatios(t *testing.T) {
	tests := []struct {
		scans, raws []time.Duration
		want        string
	}{
		{[]time.Duration{1100 * time.Millisecond}, []time.Duration{500 * time.Millisecond}, "2.20"},
		{[]time.Duration{1313 * time.Millisecond, 1256 * time.Millisecond}, []time.Duration{477 * time.Millisecond, 445 * time.Millisecond}, "2.75 2.82"},
		{[]time.Duration{999 * time.Millisecond}, []time.Duration{1000 * time.Millisecond}, "1.00"},
		{nil, nil, ""},
	}
	for _, tt := range tests {
		var got []float64
		for i := range tt.scans {
			got = append(got, scan.PairRatio(tt.scans[i], tt.raws[i]))
		}
		if s := scan.Ratios(got); s != tt.want {
			t.Errorf("ratios of %v over %v = %q, want %q", tt.scans, tt.raws, s, tt.want)
		}
	}
}
