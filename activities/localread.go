package activities

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// LocalRead is the read fast path (issue 16 item 2), run as a local activity in the process of
// the workflow task: it allocates the ordinal and, when this process holds the subscription's
// live session, reads and offers the answer to the acceptance point — in one activity
// execution, the body stored in the acceptance's own transaction (one commit for both,
// ledger.AcceptRequest.Body). Every step is the same ledger statement as on the regular path
// (Ledger.AllocateReadOrdinal, Ledger.AcceptResourceVersion, Ledger.RecordNotFound), so every
// fence holds unchanged (R14, R16, R17, R19, R23); it never reads on a session it does not
// hold, and a read that does not answer within the input's Handoff is left in flight for
// MCPRead of the same request ID to join.
type LocalRead struct {
	// Session is this process's session-bound activities (the same value registered on the
	// host queue, so that MCPRead joins reads handed off here); nil or a nil Host: no
	// session is ever held here.
	Session *Session
	Ledger  *Ledger
}

// Register registers the fast path under its contract name; register it on the workflow
// task queue's worker, as a local activity.
func (a *LocalRead) Register(r Registry) {
	r.RegisterActivityWithOptions(a.LocalRead, activity.RegisterOptions{Name: contract.ActLocalRead})
}

// LocalRead allocates, and reads and settles when the session is held here; see
// contract.LocalReadOutput for what each result asks the workflow to do. An error means the
// allocation's outcome is unknown: the workflow allocates again on the regular path (the
// request ID makes that return the first outcome, R14).
func (a *LocalRead) LocalRead(ctx context.Context, in contract.LocalReadInput) (contract.LocalReadOutput, error) {
	var c *mcphost.Conn
	if a.Session != nil && a.Session.Host != nil {
		// Looked up before allocating: only a session held here now is read on.
		c, _ = a.Session.Host.Conn(in.SourceID, in.Allocate.SessionGeneration)
	}
	alloc, err := a.Ledger.AllocateReadOrdinal(ctx, in.Allocate)
	if err != nil {
		return contract.LocalReadOutput{}, err
	}
	out := contract.LocalReadOutput{Alloc: alloc}
	if alloc.Outcome != mcpsync.OutcomeAllocated || c == nil {
		return out, nil
	}
	out.Here = true
	rin := contract.ReadInput{SourceID: in.SourceID, SessionGeneration: in.Allocate.SessionGeneration,
		ServerURI: in.ServerURI, Ordinal: alloc.Ordinal, RequestID: in.Allocate.RequestID}
	r := startRead(ctx, c, rin)
	handoff := time.NewTimer(max(in.Handoff, time.Millisecond))
	defer handoff.Stop()
	select {
	case <-r.done:
	case <-handoff.C:
		a.Session.putInflight(rin.RequestID, r)
		out.HandedOff = true
		return out, nil
	case <-ctx.Done():
		a.Session.putInflight(rin.RequestID, r)
		out.HandedOff = true
		return out, nil
	}
	read, body, err := a.Session.answerRead(c, r)
	if err != nil {
		// The regular path reads again under the same ordinal, with its retries and its
		// error handling (a stale session, a permanent refusal).
		out.HandedOff = true
		return out, nil
	}
	if body != nil {
		read.Digest = ledger.Digest(body)
	}
	out.Read = read
	id := mcpsync.ReadID{SubscriptionID: in.Allocate.SubscriptionID, Generation: in.Allocate.Generation,
		SessionGeneration: in.Allocate.SessionGeneration, URI: in.Allocate.URI, Ordinal: alloc.Ordinal, RequestID: in.Allocate.RequestID}
	if !read.Found {
		o, err := a.Ledger.RecordNotFound(ctx, contract.AcceptInput{ReadID: id})
		if err != nil {
			return out, nil // the workflow records it, with its retries
		}
		out.Settled, out.Outcome = true, o
		return out, nil
	}
	// The body is stored in the acceptance's own transaction: one commit for both.
	acc, err := a.Ledger.accept(ctx, contract.AcceptInput{ReadID: id, Read: read}, body)
	if err != nil {
		// The workflow offers the answer again, with its retries, naming the body by its
		// digest: it must be stored first, as the regular path stores it. If it cannot be,
		// the read goes on on the host queue under the same ordinal, which stores the body
		// of its own answer.
		if body != nil {
			if _, err := a.Session.Store.PutBlob(ctx, body, read.MIMEType); err != nil {
				out.Read, out.HandedOff = contract.ReadOutput{}, true
				return out, nil
			}
		}
		return out, nil
	}
	out.Settled, out.Outcome, out.VersionID = true, acc.Outcome, acc.VersionID
	return out, nil
}
