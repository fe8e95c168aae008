package workerapp

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// SourceEventSignaler returns the session host's SourceEvents hook: it signals-with-start the
// source's SourceWorkflow, with a scan request for a new session and a list-changed signal for
// list_changed, so that every source with a session has its discovery workflow running.
func SourceEventSignaler(c client.Client, log *zap.Logger) func(context.Context, mcphost.SourceEvent) {
	return func(ctx context.Context, ev mcphost.SourceEvent) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		signal, arg := contract.SignalListChanged, any(contract.ListChanged{SessionGeneration: ev.Generation, Count: ev.ListChanged})
		if ev.Kind == mcphost.SessionOpened {
			signal, arg = contract.SignalScanRequest, contract.ScanRequest{
				ID:     fmt.Sprintf("session/%d/%d", ev.SourceID, ev.Generation),
				Reason: fmt.Sprintf("new session generation %d", ev.Generation),
			}
		}
		_, err := c.SignalWithStartWorkflow(ctx, contract.SourceWorkflowID(ev.Source), signal, arg,
			client.StartWorkflowOptions{ID: contract.SourceWorkflowID(ev.Source), TaskQueue: contract.TaskQueue},
			contract.SourceWorkflowName, contract.SourceInput{SourceID: ev.SourceID, Source: ev.Source})
		if err != nil && ctx.Err() == nil {
			log.Warn("signalling the source workflow failed", zap.String("source", ev.Source), zap.String("signal", signal), zap.Error(err))
		}
	}
}
