package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// setDetails keeps the workflow's current details (the Temporal UI's detail page, issue 17
// part 7) up to date: state as the ledger names it, last accepted ordinal and digest,
// freshness, the reason when not ACTIVE. It formats only when one of them changed since the
// last call, and records nothing in history (current details are served by the metadata
// query), so it is cheap and replays deterministically.
func (w *subscription) setDetails() {
	p := contract.SubscriptionProgress{
		State: w.m.State().Ledger(), LastAcceptedOrdinal: w.st.LastAcceptedOrdinal,
		LastAcceptedDigest: w.st.LastAcceptedDigest, LastReadSentAt: w.st.LastReadSentAt,
		SessionGeneration: w.st.SessionGeneration, ContinuedAsNew: w.st.ContinuedAsNew,
	}
	if p.State != mcpsync.StateActive {
		p.Reason = w.st.Reason
	}
	if w.detailsSet && p.State == w.details.State && p.Reason == w.details.Reason &&
		p.LastAcceptedOrdinal == w.details.LastAcceptedOrdinal && p.LastAcceptedDigest == w.details.LastAcceptedDigest &&
		p.LastReadSentAt.Equal(w.details.LastReadSentAt) && p.SessionGeneration == w.details.SessionGeneration &&
		p.ContinuedAsNew == w.details.ContinuedAsNew {
		return
	}
	w.details, w.detailsSet = p, true
	workflow.SetCurrentDetails(w.ctx, contract.SubscriptionDetails(w.in, p))
}
