package contract

import "github.com/mcpsync/mcpsync"

// Ledger activities that confirm the deletion of a URI only a resource template produces, by
// repeated not-found reads (R21). They run as local activities, like the other ledger
// activities.
const (
	ActRecordTombstoneProbe    = "RecordTombstoneProbe"
	ActConfirmTombstoneByReads = "ConfirmTombstoneByReads"
)

// TombstoneProbeInput reports that a read of a TOMBSTONE_PENDING subscription's URI, sent on
// SessionGeneration with RequestID, answered not-found again.
type TombstoneProbeInput struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	RequestID         string
}

// TombstoneProbeOutput is the ledger's answer: Outcome ACCEPTED (recorded), ALREADY_DONE (a
// replay, counted once) or REFUSED (the subscription is no longer TOMBSTONE_PENDING in that
// generation and session: State says where it is). Probes counts the probes recorded for
// the pending read; Required is how many ConfirmTombstoneByReads needs.
type TombstoneProbeOutput struct {
	Outcome  mcpsync.Outcome
	State    mcpsync.State
	Probes   int64
	Required int64
}

// ConfirmByReadsInput asks the ledger to confirm a TOMBSTONE_PENDING subscription's deletion
// by its recorded not-found probes; the answer is a ConfirmTombstoneOutput.
type ConfirmByReadsInput struct {
	SubscriptionID int64
	Generation     int64
}
