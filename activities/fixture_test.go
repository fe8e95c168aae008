package activities_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// serveChaos serves srv over streamable HTTP on a free loopback port until the test ends and
// returns its URL.
func serveChaos(t *testing.T, srv *chaosmcp.Server) string {
	t.Helper()
	hs, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	return hs.URL
}

// hosted is a source registered in a test's ledger with a running session host (runHost)
// that holds its session of generation gen.
type hosted struct {
	store *ledger.Store
	src   ledger.Source
	host  *mcphost.Host
	gen   int64
}

// hostSource registers spec in store, grants principal "p" standing access to it when grant
// is set, runs a session host on queue logging at level, and waits (30 s at most) until that
// host holds the source's session.
func hostSource(ctx context.Context, t *testing.T, store *ledger.Store, spec ledger.SourceSpec, grant bool, queue string, level zapcore.Level) hosted {
	t.Helper()
	src, _, err := store.AddSource(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if grant {
		if _, _, err := store.GrantAccess(ctx, "p", src.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	h := runHost(ctx, t, store, queue, level)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	c, err := h.WaitSession(wctx, src.ID, 0)
	if err != nil {
		t.Fatalf("no session for source %q: %v", spec.Name, err)
	}
	return hosted{store: store, src: src, host: h, gen: c.Generation()}
}

// activeSubscription opens principal "p"'s subscription to u (server URI u) in the ledger and
// takes it through BeginSubscribe and Activate on the hosted session's generation, as a
// workflow establishing it does.
func (hs hosted) activeSubscription(ctx context.Context, t *testing.T, u, workflowID string) ledger.Subscription {
	t.Helper()
	sub, err := hs.store.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "p", SourceID: hs.src.ID, URI: u, ServerURI: u, WorkflowID: workflowID})
	if err != nil {
		t.Fatal(err)
	}
	led := &activities.Ledger{Store: hs.store}
	for _, step := range []func(context.Context, contract.TransitionInput) (contract.TransitionOutput, error){led.BeginSubscribe, led.Activate} {
		if out, err := step(ctx, contract.TransitionInput{SubscriptionID: sub.ID, Generation: sub.Generation, SessionGeneration: hs.gen}); err != nil || out.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("activate: %+v %v", out, err)
		}
	}
	return sub
}
