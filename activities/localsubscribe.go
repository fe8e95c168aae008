package activities

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// LocalSubscribe is the subscribe fast path (issue 16 item 4), run as a local activity in the
// process of the workflow task: when this process holds the subscription's live session
// generation, it subscribes on it with the very call MCPSubscribe makes on the host queue
// (mcphost.Conn.Watch, R9), so a start needs no activity task and no second workflow task. It
// never subscribes on a session it does not hold, and a subscribe that does not answer within
// the input's Handoff is left running here for MCPSubscribe of the same subscription to join
// (Conn.Watch serialises the subscribes of one URI and sends the server call once).
type LocalSubscribe struct {
	// Session is this process's session-bound activities (the same value registered on the
	// host queue); nil or a nil Host: no session is ever held here.
	Session *Session
}

// Register registers the fast path under its contract name; register it on the workflow
// task queue's worker, as a local activity.
func (a *LocalSubscribe) Register(r Registry) {
	r.RegisterActivityWithOptions(a.LocalSubscribe, activity.RegisterOptions{Name: contract.ActLocalSubscribe})
}

// subscribeTimeout bounds a subscribe started here, like MCPSubscribe's start-to-close timeout
// in the workflow: a handed-off subscribe outlives the local activity that started it.
const subscribeTimeout = 30 * time.Second

// LocalSubscribe subscribes when the session is held here; see contract.LocalSubscribeOutput
// for what each result asks the workflow to do. An error is the subscribe's own failure,
// classified as MCPSubscribe classifies it (StaleSession and Permanent non-retryable).
func (a *LocalSubscribe) LocalSubscribe(ctx context.Context, in contract.LocalSubscribeInput) (contract.LocalSubscribeOutput, error) {
	if a.Session == nil || a.Session.Host == nil {
		return contract.LocalSubscribeOutput{}, nil
	}
	c, err := a.Session.Host.Conn(in.Call.SourceID, in.Call.SessionGeneration)
	if err != nil {
		// Not held here (another worker's session, or an ended generation): the host queue
		// decides, and answers StaleSession when no host holds it.
		return contract.LocalSubscribeOutput{}, nil
	}
	type answer struct {
		res mcphost.WatchResult
		err error
	}
	done := make(chan answer, 1)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), subscribeTimeout)
	go func() {
		defer cancel()
		res, err := c.Watch(wctx, in.Call.ServerURI, in.Call.SubscriptionID)
		done <- answer{res, err}
	}()
	handoff := time.NewTimer(max(in.Handoff, time.Millisecond))
	defer handoff.Stop()
	var ans answer
	select {
	case ans = <-done:
	case <-handoff.C:
		return contract.LocalSubscribeOutput{Here: true, HandedOff: true}, nil
	case <-ctx.Done():
		return contract.LocalSubscribeOutput{Here: true, HandedOff: true}, nil
	}
	if ans.err != nil {
		return contract.LocalSubscribeOutput{}, boundError(a.Session.classify(c, "subscribe", ans.err))
	}
	return contract.LocalSubscribeOutput{Here: true, Subscribe: contract.SubscribeOutput{NotAcknowledged: ans.res.NotAcknowledged}}, nil
}
