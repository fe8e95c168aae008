package devtemporal_test

import (
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
)

// The search attribute caches are read from the database on every use only while a change may
// be missing from one of them: for SearchAttributeCacheTTL after each call that adds or removes
// search attributes (issue 16 item 4).
func TestSearchAttributeRefreshWindow(t *testing.T) {
	tests := []struct {
		name   string
		steps  func(c *devtemporal.SearchAttributeRefresh)
		forced bool
	}{
		{"at the start", func(*devtemporal.SearchAttributeRefresh) {}, false},
		{"just after an add", func(c *devtemporal.SearchAttributeRefresh) {
			c.Intercept("/temporal.api.operatorservice.v1.OperatorService/AddSearchAttributes")
		}, true},
		{"just before the TTL after an add ends", func(c *devtemporal.SearchAttributeRefresh) {
			c.Intercept("/temporal.api.operatorservice.v1.OperatorService/AddSearchAttributes")
			c.Pass(devtemporal.SearchAttributeCacheTTL - time.Second)
		}, true},
		{"an add reopens it", func(c *devtemporal.SearchAttributeRefresh) {
			c.Pass(devtemporal.SearchAttributeCacheTTL + time.Second)
			c.Intercept("/temporal.api.operatorservice.v1.OperatorService/AddSearchAttributes")
		}, true},
		{"a remove reopens it", func(c *devtemporal.SearchAttributeRefresh) {
			c.Pass(devtemporal.SearchAttributeCacheTTL + time.Second)
			c.Intercept("/temporal.server.api.adminservice.v1.AdminService/RemoveSearchAttributes")
		}, true},
		{"the window after an add ends too", func(c *devtemporal.SearchAttributeRefresh) {
			c.Pass(devtemporal.SearchAttributeCacheTTL + time.Second)
			c.Intercept("/temporal.api.operatorservice.v1.OperatorService/AddSearchAttributes")
			c.Pass(devtemporal.SearchAttributeCacheTTL + time.Second)
		}, false},
		{"a list does not reopen it", func(c *devtemporal.SearchAttributeRefresh) {
			c.Pass(devtemporal.SearchAttributeCacheTTL + time.Second)
			c.Intercept("/temporal.api.operatorservice.v1.OperatorService/ListSearchAttributes")
			c.Intercept("/temporal.api.workflowservice.v1.WorkflowService/StartWorkflowExecution")
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := devtemporal.NewSearchAttributeRefresh()
			tt.steps(c)
			if got := c.Forced(); got != tt.forced {
				t.Errorf("forced refresh = %v, want %v", got, tt.forced)
			}
		})
	}
}

// A search attribute added at run time can be used by the next start at once, although the
// server no longer reads the search attributes from the database on every use: the add opens
// the window again. Without that, the start fails ("not defined") until the cache the first
// start loaded expires, a minute later.
func TestSearchAttributeAddedAtRunTimeUsableAtOnce(t *testing.T) {
	s := start(t, devtemporal.Options{DataDir: t.TempDir(), DisableUI: true})
	sw := devtemporal.SearchAttributeCache(s)
	if sw == nil {
		t.Fatal("the server has no search attribute refresh switch")
	}
	sw.End() // as on a server whose last change is long past
	if sw.Forced() {
		t.Fatal("the refresh is still forced after End")
	}
	c := dial(t, s)
	ctx := ctxFor(t)
	source := temporal.NewSearchAttributeKeyKeyword("McpsyncSource")
	// The first start loads the caches with the search attributes as they are now.
	if _, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: "before-add", TaskQueue: taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(source.ValueSet("a")),
	}, Greet, "a"); err != nil {
		t.Fatalf("start with a registered search attribute: %v", err)
	}
	if sw.Forced() {
		t.Fatal("a start opened the window")
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace:        s.Namespace(),
		SearchAttributes: map[string]enumspb.IndexedValueType{"McpsyncLateAttribute": enumspb.INDEXED_VALUE_TYPE_KEYWORD},
	}); err != nil {
		t.Fatalf("add search attribute: %v", err)
	}
	if !sw.Forced() {
		t.Error("the add did not open the window")
	}
	late := temporal.NewSearchAttributeKeyKeyword("McpsyncLateAttribute")
	if _, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: "after-add", TaskQueue: taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(source.ValueSet("b"), late.ValueSet("x")),
	}, Greet, "b"); err != nil {
		t.Fatalf("start with the search attribute added just before: %v", err)
	}
}
