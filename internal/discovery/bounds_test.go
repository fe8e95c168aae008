package discovery_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/discovery"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// endless lists pages of n resources forever, each with a new cursor.
type endless struct{ n int }

func (e endless) ListResources(_ context.Context, p *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error) {
	res := &mcp.ListResourcesResult{NextCursor: p.Cursor + "x"}
	for i := range e.n {
		res.Resources = append(res.Resources, &mcp.Resource{URI: fmt.Sprintf("demo://e/%s/%d", p.Cursor, i), Name: "e"})
	}
	return res, nil
}

func (endless) ListResourceTemplates(context.Context, *mcp.ListResourceTemplatesParams) (*mcp.ListResourceTemplatesResult, error) {
	return &mcp.ListResourceTemplatesResult{}, nil
}

// A page with more entries than the per-page cap, or a round with more than the per-round
// cap, ends the round as ENTRY_CAP with a clear reason and without its entries, instead of
// holding ever more in memory (issue 14 item 6); at the caps exactly, the round completes.
func TestScanEntryCaps(t *testing.T) {
	s := newServer(t, 5, 23)
	for _, tmpl := range []string{"demo://t/{a}", "demo://t/{b}"} {
		s.SetTemplate(chaosmcp.Template{URITemplate: tmpl, Name: "t", MIMEType: "text/plain"})
	}
	cs := connect(t, s)
	type outcome struct {
		Complete    bool
		FailureKind string
		Resources   int
		Templates   int
		Entries     int
		Reason      string // the failure's text, from "over"
	}
	reason := func(r discovery.Result) string {
		if r.Err == nil {
			return ""
		}
		_, after, _ := strings.Cut(r.Err.Error(), "over ")
		return after
	}
	tests := []struct {
		name string
		l    discovery.Lister
		opts discovery.Options
		want outcome
	}{
		{"at the caps", cs, discovery.Options{MaxPageEntries: 5, MaxEntries: 25},
			outcome{Complete: true, Resources: 23, Templates: 2, Entries: 25}},
		{"page over the page cap", cs, discovery.Options{MaxPageEntries: 4},
			outcome{FailureKind: contract.RoundEntryCap, Reason: "the cap of 4 per page"}},
		{"resources over the round cap", cs, discovery.Options{MaxEntries: 12},
			outcome{FailureKind: contract.RoundEntryCap, Resources: 10, Reason: "the cap of 12 per round"}},
		{"templates count toward the round cap", cs, discovery.Options{MaxEntries: 24},
			outcome{FailureKind: contract.RoundEntryCap, Resources: 23, Reason: "the cap of 24 per round"}},
		{"default page cap", endless{n: discovery.DefaultMaxPageEntries + 1}, discovery.Options{},
			outcome{FailureKind: contract.RoundEntryCap, Reason: "the cap of 10000 per page"}},
		{"default round cap", endless{n: discovery.DefaultMaxPageEntries}, discovery.Options{},
			outcome{FailureKind: contract.RoundEntryCap, Resources: discovery.DefaultMaxEntries, Reason: "the cap of 1000000 per round"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := discovery.Scan(testCtx(t), tt.l, tt.opts)
			got := outcome{Complete: r.Complete, FailureKind: r.FailureKind, Resources: r.Resources, Templates: r.Templates,
				Entries: len(r.Entries), Reason: reason(r)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
