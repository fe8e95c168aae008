package histstats

import (
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// StartCost is what a subscription's start cost Temporal (issue 16 item 4): from the run's
// first event to the local activity marker that carries its first accepted version.
type StartCost struct {
	// Events is the number of history events up to and including that marker.
	Events int
	// WorkflowTasks is the number of WorkflowTaskCompleted events among them.
	WorkflowTasks int
	// ActivityTasks is the number of ActivityTaskScheduled events among them (the host
	// queue's subscribe and read).
	ActivityTasks int
	// LocalSubscribe: the subscribe was decided on the fast path (contract.ActLocalSubscribe
	// answered here, not handed off).
	LocalSubscribe bool
}

// Start reports what hist's start cost until its first accepted version; ok is false when
// hist has no accepted version.
func Start(hist *historypb.History) (cost StartCost, ok bool, err error) {
	dc := converter.GetDefaultDataConverter()
	for _, ev := range hist.GetEvents() {
		cost.Events++
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			cost.WorkflowTasks++
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			cost.ActivityTasks++
		}
		m := ev.GetMarkerRecordedEventAttributes()
		if m == nil || m.GetMarkerName() != "LocalActivity" || m.GetDetails()["result"] == nil {
			continue
		}
		var md markerData
		if err := dc.FromPayloads(m.GetDetails()["data"], &md); err != nil {
			return cost, false, fmt.Errorf("local activity marker of event %d: %w", ev.GetEventId(), err)
		}
		result := m.GetDetails()["result"]
		switch md.ActivityType {
		case contract.ActLocalSubscribe:
			var ls contract.LocalSubscribeOutput
			if err := dc.FromPayloads(result, &ls); err != nil {
				return cost, false, fmt.Errorf("%s result of event %d: %w", md.ActivityType, ev.GetEventId(), err)
			}
			cost.LocalSubscribe = ls.Here && !ls.HandedOff
		case contract.ActLocalRead:
			var lr contract.LocalReadOutput
			if err := dc.FromPayloads(result, &lr); err != nil {
				return cost, false, fmt.Errorf("%s result of event %d: %w", md.ActivityType, ev.GetEventId(), err)
			}
			if lr.Settled && lr.Outcome == mcpsync.OutcomeAccepted {
				return cost, true, nil
			}
		case contract.ActAcceptResourceVersion:
			var acc contract.AcceptOutput
			if err := dc.FromPayloads(result, &acc); err != nil {
				return cost, false, fmt.Errorf("%s result of event %d: %w", md.ActivityType, ev.GetEventId(), err)
			}
			if acc.Outcome == mcpsync.OutcomeAccepted {
				return cost, true, nil
			}
		}
	}
	return cost, false, nil
}
