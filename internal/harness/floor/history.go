package floor

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
)

// History is what CountHistory counted in one workflow's history within a time window.
type History struct {
	// Events is the number of history events whose time falls in the window.
	Events int
	// WorkflowTasks is the number of workflow tasks started in the window (each attempt
	// counts).
	WorkflowTasks int
	// Runs is the number of runs whose history was read (more than 1 after continue-as-new).
	Runs int
	// ByType counts Events by event type name (e.g. WorkflowExecutionSignaled), so that a
	// bench can say which events an update costs.
	ByType map[string]int
}

// Add returns the sum of h and o.
func (h History) Add(o History) History {
	by := make(map[string]int, len(h.ByType)+len(o.ByType))
	for t, n := range h.ByType {
		by[t] += n
	}
	for t, n := range o.ByType {
		by[t] += n
	}
	return History{Events: h.Events + o.Events, WorkflowTasks: h.WorkflowTasks + o.WorkflowTasks, Runs: h.Runs + o.Runs, ByType: by}
}

// PerUpdate formats ByType divided by updates, largest first, as "TYPE 1.02, TYPE 0.50, …".
func (h History) PerUpdate(updates int) string {
	types := make([]string, 0, len(h.ByType))
	for t := range h.ByType {
		types = append(types, t)
	}
	slices.SortFunc(types, func(a, b string) int {
		return cmp.Or(cmp.Compare(h.ByType[b], h.ByType[a]), cmp.Compare(a, b))
	})
	parts := make([]string, len(types))
	for i, t := range types {
		parts[i] = fmt.Sprintf("%s %.2f", t, float64(h.ByType[t])/float64(max(updates, 1)))
	}
	return strings.Join(parts, ", ")
}

// CountHistory counts the history events and workflow tasks of workflowID whose event time is
// in [from, to], following continue-as-new back from the current run until a run that started
// before from. It reads histories with GetWorkflowHistory, so it works for any workflow on any
// server the client reaches.
func CountHistory(ctx context.Context, c client.Client, workflowID string, from, to time.Time) (History, error) {
	h := History{ByType: map[string]int{}}
	runID := ""
	for {
		it := c.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		h.Runs++
		prev, first := "", true
		var runStart time.Time
		for it.HasNext() {
			ev, err := it.Next()
			if err != nil {
				return History{}, fmt.Errorf("history of %s run %q: %w", workflowID, runID, err)
			}
			at := ev.GetEventTime().AsTime()
			if first {
				first = false
				runStart = at
				if a := ev.GetWorkflowExecutionStartedEventAttributes(); a != nil {
					prev = a.GetContinuedExecutionRunId()
				}
			}
			if at.Before(from) || at.After(to) {
				continue
			}
			h.Events++
			h.ByType[ev.GetEventType().String()]++
			if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED {
				h.WorkflowTasks++
			}
		}
		if prev == "" || !runStart.After(from) {
			return h, nil
		}
		runID = prev
	}
}
