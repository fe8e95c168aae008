package contract

import "time"

// ActLocalSubscribe is the subscribe fast path (issue 16 item 4): a local activity that, when
// the worker running the workflow task holds the subscription's live session (same process,
// same session generation), makes the server watch the URI on it exactly as ActMCPSubscribe
// does on the host queue (R9) — so that BeginSubscribe, the subscribe, Activate and the first
// read chain in one workflow task. It never subscribes on a session it does not hold: the
// workflow then subscribes on the host queue (ActMCPSubscribe) as before. The ledger fences
// (BeginSubscribe before, Activate after) are not part of it and are unchanged.
const ActLocalSubscribe = "LocalSubscribe"

// LocalSubscribeInput asks for one subscribe on the fast path: the same call ActMCPSubscribe
// takes, and how long it may keep the workflow task here before it is handed to the host
// queue.
type LocalSubscribeInput struct {
	Call SessionCall
	// Handoff bounds the subscribe in the local activity (the workflow task takes no signal
	// meanwhile): one not answered by then goes on in this process, and ActMCPSubscribe of
	// the same subscription joins it (the host serialises subscribes of one URI, and the
	// first holder's server call is the only one sent).
	Handoff time.Duration
}

// LocalSubscribeOutput is what the fast path did; exactly one of these holds:
//   - !Here: this worker does not hold the session generation: subscribe on the host queue
//     (ActMCPSubscribe), which answers StaleSession if no host holds it;
//   - HandedOff: the subscribe did not answer here within Handoff: subscribe on the host
//     queue, which joins it;
//   - otherwise the URI is subscribed and Subscribe is ActMCPSubscribe's answer.
//
// A subscribe that failed here is the activity's error, classified as ActMCPSubscribe's
// (StaleSession and Permanent are non-retryable; anything else the workflow hands to the host
// queue, whose retries apply).
type LocalSubscribeOutput struct {
	Here      bool            `json:",omitempty"`
	HandedOff bool            `json:",omitempty"`
	Subscribe SubscribeOutput `json:",omitzero"`
}
