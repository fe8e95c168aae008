package contract_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// Issue 17 part 7: what the Temporal UI shows of a subscription is one bounded line for the
// summary, never a credential of a URI, and current details with state, ordinal, short digest
// and freshness.
func TestSubscriptionUIMetadata(t *testing.T) {
	long := "demo://notes/" + strings.Repeat("é", 300)
	tests := []struct {
		name string
		in   contract.SubscriptionInput
		want string
	}{
		{"plain", contract.SubscriptionInput{Source: "docs", URI: "demo://notes/1", Principal: "alice"},
			"docs demo://notes/1 for alice"},
		{"credentials in a URI", contract.SubscriptionInput{Source: "web", URI: "https://bob:hunter2@example.com/r?token=abc&x=1", Principal: "p"},
			"web https://bob:***@example.com/r?token=***&x=1 for p"},
		{"line breaks", contract.SubscriptionInput{Source: "s", URI: "demo://a\nb", Principal: "p\r\nq"},
			"s demo://a b for p  q"},
		// 13 ASCII bytes then 2-byte runes: the cut backs off to the rune boundary below the bound.
		{"long URI", contract.SubscriptionInput{Source: "s", URI: long, Principal: "p"},
			"s " + long[:contract.UIFieldMax-1] + "… for p"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := contract.SubscriptionSummary(tt.in)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
			if !utf8.ValidString(got) || strings.ContainsAny(got, "\r\n") {
				t.Errorf("summary %q is not one valid line", got)
			}
			for _, secret := range []string{"hunter2", "token=abc"} {
				if strings.Contains(contract.SubscriptionStaticDetails(tt.in), secret) {
					t.Errorf("static details show %q", secret)
				}
			}
		})
	}
}

func TestSubscriptionDetails(t *testing.T) {
	in := contract.SubscriptionInput{Source: "docs", URI: "demo://notes/1", Principal: "alice"}
	digest := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		name string
		p    contract.SubscriptionProgress
		want string
	}{
		{"active", contract.SubscriptionProgress{State: mcpsync.StateActive, Reason: "ignored when active",
			LastAcceptedOrdinal: 7, LastAcceptedDigest: digest, LastReadSentAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)),
			SessionGeneration: 2, ContinuedAsNew: 1},
			"**ACTIVE** · version #7 `sha256:abababababab…` · current as of 2026-01-02T02:04:05Z  \n" +
				"docs demo://notes/1 for alice · session generation 2 · continued as new 1 times"},
		{"nothing yet", contract.SubscriptionProgress{State: mcpsync.StateDiscovered},
			"**DISCOVERED** · no version accepted yet  \n" +
				"docs demo://notes/1 for alice · session generation 0 · continued as new 0 times"},
		{"reason redacted", contract.SubscriptionProgress{State: mcpsync.StateReconciliationRequired,
			Reason: "connect https://u:pw@h/x failed", LastAcceptedOrdinal: 3, LastAcceptedDigest: digest},
			"**RECONCILIATION_REQUIRED** · version #3 `sha256:abababababab…`  \n" +
				"**Reason** connect https://u:***@h/x failed  \n" +
				"docs demo://notes/1 for alice · session generation 0 · continued as new 0 times"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, contract.SubscriptionDetails(in, tt.p)); diff != "" {
				t.Errorf("details (-want +got):\n%s", diff)
			}
		})
	}
}
