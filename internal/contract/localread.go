package contract

import (
	"time"

	"github.com/mcpsync/mcpsync"
)

// ActLocalRead is the read fast path (issue 16 item 2): a local activity that allocates the
// read's ordinal (R14) and, when the worker running it holds the subscription's live session
// (same process), also reads on it, stores the body and offers the answer to the acceptance
// point (R16) — one workflow task per update. It never reads on a session it does not hold: the
// workflow then reads on the host queue (ActMCPRead) as before.
const ActLocalRead = "LocalRead"

// LocalReadInput asks for one read on the fast path: the allocation, where to read, and how long
// the read may take here before it is handed to the host queue.
type LocalReadInput struct {
	Allocate  AllocateInput
	SourceID  int64
	ServerURI string
	// Handoff bounds the MCP read in the local activity (the workflow task cannot take signals
	// meanwhile): a read not answered by then goes on in the host's process, and the workflow
	// joins it through ActMCPRead with the same ordinal and request ID (R19 holds for it).
	Handoff time.Duration
}

// LocalReadOutput is what the fast path did. Alloc is the allocation's outcome; nothing else is
// set unless it is ALLOCATED. Then exactly one of these holds:
//   - !Here: this worker does not hold the session: read on the host queue (ActMCPRead);
//   - HandedOff: the read did not answer here within Handoff, or failed: read on the host
//     queue under the same ordinal and request ID (a read still in flight is joined, not sent
//     again);
//   - Settled: Read went to the ledger (acceptance point, or not-found record) and Outcome is
//     its outcome (VersionID for an accepted version);
//   - otherwise Read is the answer, not yet offered to the ledger (the ledger could not be
//     reached): the workflow offers it.
type LocalReadOutput struct {
	Alloc     AllocateOutput
	Here      bool            `json:",omitempty"`
	HandedOff bool            `json:",omitempty"`
	Read      ReadOutput      `json:",omitzero"`
	Settled   bool            `json:",omitempty"`
	Outcome   mcpsync.Outcome `json:",omitempty"`
	VersionID int64           `json:",omitempty"`
}
