package readguard_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/readguard"
)

func TestIsText(t *testing.T) {
	for _, tt := range []struct {
		in   []byte
		want bool
	}{
		{[]byte("plain\n"), true},
		{[]byte("ü and \x1b[31m"), true},
		{[]byte{}, true},
		{[]byte{0xff, 'a'}, false},
		{[]byte("a\x00b"), false},
	} {
		if got := readguard.IsText(tt.in); got != tt.want {
			t.Errorf("IsText(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// The evaluator maps the guard's verdict onto the ledger's: outcome, reasons, stripped count,
// the policy's description, and the bytes that may be delivered.
func TestEvaluator(t *testing.T) {
	pol := readguard.Policy()
	eval := readguard.Evaluator(pol)
	for _, tt := range []struct {
		name, mime, body string
		want             ledger.GuardVerdict
		delivered        string
	}{
		{"pass", "text/plain", "hello\n", ledger.GuardVerdict{Policy: pol.String(), Outcome: ledger.VerdictPass}, "hello\n"},
		{"sanitized", "text/plain", "a\x1bb", ledger.GuardVerdict{Policy: pol.String(), Outcome: ledger.VerdictSanitized,
			Stripped: 1, Reasons: []string{"controls: stripped 1 control character(s), first U+001B"}}, "ab"},
		{"rejected", "application/octet-stream", "x", ledger.GuardVerdict{Policy: pol.String(), Outcome: ledger.VerdictRejected,
			Reasons: []string{`mime: "application/octet-stream" is not allowed`}}, ""},
	} {
		got, delivered, err := eval(t.Context(), ledger.Version{URI: "demo://x", MIMEType: tt.mime}, []byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("%s: verdict (-want +got):\n%s", tt.name, d)
		}
		if string(delivered) != tt.delivered {
			t.Errorf("%s: delivered %q, want %q", tt.name, delivered, tt.delivered)
		}
	}
}
