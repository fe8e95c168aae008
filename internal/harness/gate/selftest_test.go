package gate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The gate's checker self-test detects every fence it breaks; with any one checker silenced
// that a broken fence relies on, the self-test fails (R24, R26: the gate can fail).
func TestSelfTest(t *testing.T) {
	tests := []struct {
		name    string
		disable string
		pass    bool
	}{
		{"every checker", "", true},
		{"invariants old-session check silenced", gate.CheckerInvariantsOldSession, false},
		{"shuffle regression check silenced", gate.CheckerShuffleRegression, false},
		{"porcupine silenced", gate.CheckerPorcupine, false},
		{"versions-after-revocation count silenced", gate.CheckerRevocation, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.disable != "" {
				t.Cleanup(gate.DisableChecker(tt.disable))
			}
			row, n, err := gate.SelfTest(context.Background(), pgtest.NewPool(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s (%s)", row.Metric, row.Measured, row.Detail)
			if n < 7 {
				t.Errorf("%d broken fences, want at least 7", n)
			}
			if row.Pass != tt.pass {
				t.Errorf("self-test pass = %v, want %v: %s", row.Pass, tt.pass, row.Detail)
			}
			if want := fmt.Sprintf("checker self-test: %d of %d broken fences detected", n, n); tt.pass && row.Metric != want {
				t.Errorf("row %q, want %q", row.Metric, want)
			}
		})
	}
}
