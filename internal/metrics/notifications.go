package metrics

import (
	"sync"
	"time"
)

// Bounds of the notification receipts remembered for the notification → accepted latency.
const (
	// maxTrackedWorkflows bounds how many subscriptions have receipts remembered at once; a
	// receipt for one more is not remembered (its latency is not observed).
	maxTrackedWorkflows = 10000
	// maxReceiptsPerWorkflow bounds the receipts remembered per subscription; later ones are
	// dropped, which loses no latency: the oldest receipt covered by a read is the one measured.
	maxReceiptsPerWorkflow = 16
	// receiptTTL is how long a receipt no accepted read covers is kept (a subscription that
	// closed, or whose accept ran in another worker process).
	receiptTTL = 10 * time.Minute
)

// notifications remembers, per subscription workflow, when the session host received the
// resources/updated notifications that no accepted read has covered yet. A read covers the
// notifications its host received before it sent the read (contract.ReadOutput.SentAt, the
// same rule the workflow uses, R13); the latency observed at acceptance is from the oldest
// receipt covered. Receipts are recorded where the host signals the workflow and consumed where
// the ledger activity accepts, so only acceptances in the process that received the
// notification are observed (always, with one worker).
type notifications struct {
	mu    sync.Mutex
	byWF  map[string][]time.Time // receipt times in arrival order (host clock, monotonic)
	swept time.Time
}

func (n *notifications) init() { n.byWF = map[string][]time.Time{} }

func (n *notifications) received(wf string, at time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rs, ok := n.byWF[wf]
	if !ok && len(n.byWF) >= maxTrackedWorkflows {
		n.sweepLocked(time.Now())
		if len(n.byWF) >= maxTrackedWorkflows {
			return
		}
	}
	if len(rs) >= maxReceiptsPerWorkflow {
		return
	}
	n.byWF[wf] = append(rs, at)
}

// covered removes the receipts of wf at or before sentAt and returns the oldest of them.
func (n *notifications) covered(wf string, sentAt time.Time) (time.Time, bool) {
	if sentAt.IsZero() {
		return time.Time{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if now := time.Now(); now.Sub(n.swept) > receiptTTL {
		n.sweepLocked(now)
	}
	rs := n.byWF[wf]
	var oldest time.Time
	kept := rs[:0]
	for _, r := range rs {
		if r.After(sentAt) {
			kept = append(kept, r)
			continue
		}
		if oldest.IsZero() || r.Before(oldest) {
			oldest = r
		}
	}
	if len(kept) == 0 {
		delete(n.byWF, wf)
	} else {
		n.byWF[wf] = kept
	}
	return oldest, !oldest.IsZero()
}

// sweepLocked forgets receipts older than receiptTTL.
func (n *notifications) sweepLocked(now time.Time) {
	n.swept = now
	for wf, rs := range n.byWF {
		kept := rs[:0]
		for _, r := range rs {
			if now.Sub(r) < receiptTTL {
				kept = append(kept, r)
			}
		}
		if len(kept) == 0 {
			delete(n.byWF, wf)
		} else {
			n.byWF[wf] = kept
		}
	}
}
