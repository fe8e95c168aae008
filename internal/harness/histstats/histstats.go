// Package histstats reads a subscription workflow's history and reports what each accepted
// update cost Temporal (issue 16 item 2): history events and workflow tasks from the update's
// signal to the acceptance, and whether the read ran on the fast path (contract.ActLocalRead,
// settled in the workflow's own worker) or on the host queue. Tests and benches use it; it
// only reads histories.
package histstats

import (
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// Update is what one accepted update cost: from the first ResourceUpdated signal after the
// previous acceptance (or the start of the workflow task that accepted the first
// resource-updated workflow update after it) to the end of the workflow task's commands that
// carried its acceptance.
type Update struct {
	// Events is the number of history events, the signal included.
	Events int
	// WorkflowTasks is the number of WorkflowTaskCompleted events among them.
	WorkflowTasks int
	// Local: the acceptance was a settled fast-path read (ActLocalRead); otherwise an
	// ActAcceptResourceVersion after a read on the host queue.
	Local bool
	// Ordinal is the accepted read's ordinal on the fast path (0 on the host-queue path, whose
	// acceptance result does not carry it).
	Ordinal int64
}

// markerData is the part of a local activity marker's "data" detail read here.
type markerData struct {
	ActivityType string
}

// Updates lists the accepted updates of hist that a ResourceUpdated signal or workflow update
// started, in order.
// Accepted reads with no signal before them (the initial read, backstop reads) are left out.
func Updates(hist *historypb.History) ([]Update, error) {
	dc := converter.GetDefaultDataConverter()
	var out []Update
	var cur *Update // the update being counted, from its signal on
	var done *Update
	// task counts the events of the workflow task in progress while no update is counted: a
	// notification delivered as a workflow update is accepted in the task that handles it, so
	// its cost starts with that task's events.
	var task Update
	for _, ev := range hist.GetEvents() {
		t := ev.GetEventType()
		if done != nil {
			// The rest of the acceptance's workflow task (the memo, other commands).
			if t == enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED || t == enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED {
				out = append(out, *done)
				done = nil
			} else {
				done.Events++
				continue
			}
		}
		if t == enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED && cur == nil &&
			ev.GetWorkflowExecutionSignaledEventAttributes().GetSignalName() == contract.SignalResourceUpdated {
			cur = &Update{}
		}
		if t == enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED && cur == nil &&
			ev.GetWorkflowExecutionUpdateAcceptedEventAttributes().GetAcceptedRequest().GetInput().GetName() == contract.UpdateResourceUpdated {
			c := task
			cur = &c
		}
		if cur == nil {
			if t == enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED {
				task = Update{}
			}
			task.Events++
			if t == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
				task.WorkflowTasks++
			}
			continue
		}
		cur.Events++
		if t == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			cur.WorkflowTasks++
		}
		m := ev.GetMarkerRecordedEventAttributes()
		if m == nil || m.GetMarkerName() != "LocalActivity" {
			continue
		}
		var md markerData
		if err := dc.FromPayloads(m.GetDetails()["data"], &md); err != nil {
			return nil, fmt.Errorf("local activity marker of event %d: %w", ev.GetEventId(), err)
		}
		result := m.GetDetails()["result"]
		if result == nil {
			continue // a failed local activity
		}
		switch md.ActivityType {
		case contract.ActLocalRead:
			var lr contract.LocalReadOutput
			if err := dc.FromPayloads(result, &lr); err != nil {
				return nil, fmt.Errorf("%s result of event %d: %w", md.ActivityType, ev.GetEventId(), err)
			}
			if lr.Settled && lr.Outcome == mcpsync.OutcomeAccepted {
				cur.Local, cur.Ordinal = true, lr.Alloc.Ordinal
				done, cur = cur, nil
			}
		case contract.ActAcceptResourceVersion:
			var acc contract.AcceptOutput
			if err := dc.FromPayloads(result, &acc); err != nil {
				return nil, fmt.Errorf("%s result of event %d: %w", md.ActivityType, ev.GetEventId(), err)
			}
			if acc.Outcome == mcpsync.OutcomeAccepted {
				done, cur = cur, nil
			}
		}
	}
	if done != nil {
		out = append(out, *done)
	}
	return out, nil
}

// Mean is the mean events and workflow tasks per update of us (zeros when us is empty).
func Mean(us []Update) (events, workflowTasks float64) {
	if len(us) == 0 {
		return 0, 0
	}
	for _, u := range us {
		events += float64(u.Events)
		workflowTasks += float64(u.WorkflowTasks)
	}
	return events / float64(len(us)), workflowTasks / float64(len(us))
}
