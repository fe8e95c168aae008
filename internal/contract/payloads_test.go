package contract_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// Recorded workflow histories carry these payloads as JSON and are replayed, so typing the
// fields with the mcpsync vocabulary (and embedding mcpsync.ReadID) must not change a byte of
// their encoding.
func TestPayloadJSON(t *testing.T) {
	sent := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name    string
		payload any
		want    string
	}{
		{"accept input", contract.AcceptInput{
			ReadID: mcpsync.ReadID{SubscriptionID: 1, Generation: 2, SessionGeneration: 3, URI: "demo://a", Ordinal: 4, RequestID: "r"},
			Read:   contract.ReadOutput{Found: true, Digest: "sha256:00", SentAt: sent},
		}, `{"SubscriptionID":1,"Generation":2,"SessionGeneration":3,"URI":"demo://a","Ordinal":4,"RequestID":"r",` +
			`"Read":{"Found":true,"Digest":"sha256:00","MIMEType":"","Size":0,"ServerName":"","ServerVersion":"","LastModified":"","SentAt":"2026-01-02T03:04:05Z"}}`},
		{"allocate input", contract.AllocateInput{SubscriptionID: 1, Generation: 2, SessionGeneration: 3, URI: "demo://a", RequestID: "r", Reason: mcpsync.ReasonSessionChange},
			`{"SubscriptionID":1,"Generation":2,"SessionGeneration":3,"URI":"demo://a","RequestID":"r","Reason":"session_change"}`},
		{"allocate output", contract.AllocateOutput{Outcome: mcpsync.OutcomeNotActive, Ordinal: 0, State: mcpsync.StateClosed},
			`{"Outcome":"NOT_ACTIVE","Ordinal":0,"State":"CLOSED"}`},
		{"confirm tombstone output", contract.ConfirmTombstoneOutput{Outcome: mcpsync.OutcomeRefused, Refusal: mcpsync.TombstoneResourcePresent, State: mcpsync.StateTombstonePending},
			`{"Outcome":"REFUSED","Refusal":"RESOURCE_PRESENT","State":"TOMBSTONE_PENDING","ReadOrdinal":0,"CloseOrdinal":0,"CloseEpoch":0,"VersionID":0}`},
		{"counters", contract.Counters{Reads: 2, ReadsByReason: map[mcpsync.ReadReason]int64{mcpsync.ReasonPoll: 1, mcpsync.ReasonInitial: 1}},
			`{"Notifications":0,"NotificationsStale":0,"PulsesCovered":0,"Reads":2,"ReadsByReason":{"initial":1,"poll":1},"Accepted":0,"Revalidated":0,"Refused":0,"NotFound":0,"ReadFailures":0}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("JSON changed (-want +got):\n%s", diff)
			}
		})
	}
}
