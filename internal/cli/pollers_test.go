package cli_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/mcpsync/mcpsync/internal/cli"
)

// fakeQueue answers DescribeTaskQueue with fixed pollers, recording what was asked.
type fakeQueue struct {
	pollers   []*taskqueue.PollerInfo
	err       error
	asked     string
	askedType enums.TaskQueueType
}

func (f *fakeQueue) DescribeTaskQueue(_ context.Context, q string, typ enums.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error) {
	f.asked, f.askedType = q, typ
	return &workflowservice.DescribeTaskQueueResponse{Pollers: f.pollers}, f.err
}

// A worker counts only if it polled the workflow task queue recently; the server keeps
// pollers it has not seen for minutes, which are workers that are gone (issue 14 item 7).
func TestRequireWorker(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	poller := func(ago time.Duration) *taskqueue.PollerInfo {
		return &taskqueue.PollerInfo{Identity: "w", LastAccessTime: timestamppb.New(now.Add(-ago))}
	}
	const noWorker = "no worker is polling task queue mcpsync; start mcpsync-worker (make run) and try again"
	tests := []struct {
		name    string
		q       fakeQueue
		wantErr string
	}{
		{name: "no pollers", wantErr: noWorker},
		{name: "a live poller", q: fakeQueue{pollers: []*taskqueue.PollerInfo{poller(5 * time.Second)}}},
		{name: "a stale and a live poller", q: fakeQueue{pollers: []*taskqueue.PollerInfo{poller(4 * time.Minute), poller(70 * time.Second)}}},
		{name: "only stale pollers", q: fakeQueue{pollers: []*taskqueue.PollerInfo{poller(4 * time.Minute), poller(3 * time.Minute)}}, wantErr: noWorker},
		{name: "a poller without an access time", q: fakeQueue{pollers: []*taskqueue.PollerInfo{{Identity: "w"}}}, wantErr: noWorker},
		{name: "temporal fails", q: fakeQueue{err: errors.New("boom")}, wantErr: "describing task queue mcpsync: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := cli.RequireWorker(context.Background(), &tt.q, now)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("error %q, want %q", got, tt.wantErr)
			}
			if tt.q.asked != "mcpsync" || tt.q.askedType != enums.TASK_QUEUE_TYPE_WORKFLOW {
				t.Errorf("asked about %q (%v), want the workflow task queue mcpsync", tt.q.asked, tt.q.askedType)
			}
		})
	}
}
