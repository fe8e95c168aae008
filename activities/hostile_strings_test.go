package activities_test

import (
	"context"
	"testing"

	"go.temporal.io/sdk/testsuite"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A server whose serverInfo, resource names and MIME types carry NULs and terminal escape
// sequences is served like any other through the real session host and activities: the
// session opens, a discovery round stores the catalog, a read stores its blob and the
// version is accepted — every such string stored escaped (ledger.SafeText), none failing a
// statement on every retry.
func TestHostileServerStringsThroughHost(t *testing.T) {
	const (
		hostileName = "evil\x00server\x1b]0;pwned\x07"
		hostileMIME = "text/plain\x00\x1b[2J"
		uri         = "demo://hostile/1"
	)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	srv := chaosmcp.New(chaosmcp.Options{Name: hostileName, Version: "1.0\x00"})
	t.Cleanup(func() { srv.Close() })
	srv.Put(chaosmcp.Resource{URI: uri, Name: "name\x00\r\u009b", MIMEType: hostileMIME, Text: "hello\n"})
	// A server with a hostile serverInfo gets its session.
	hs := hostSource(ctx, t, store, ledger.SourceSpec{Name: "hostile", Transport: ledger.TransportHTTP, URL: serveChaos(t, srv)}, true, "host-hostile", zap.ErrorLevel)
	src, h, gen := hs.src, hs.host, hs.gen
	sess, err := store.CurrentSession(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := ledger.SafeText(hostileName); sess.Caps.ServerName != want || sess.Caps.ServerVersion != `1.0\u0000` {
		t.Errorf("stored serverInfo %q %q, want %q %q", sess.Caps.ServerName, sess.Caps.ServerVersion, want, `1.0\u0000`)
	}

	// A discovery round stores the hostile name and MIME type.
	disc := &activities.Discovery{Host: h, Store: store}
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	env.RegisterActivity(disc.DiscoveryRound)
	val, err := env.ExecuteActivity(disc.DiscoveryRound, contract.RoundInput{
		ScanKey: "hostile/run/round-1", ScanRun: "hostile/run", ScanWorkflowID: "hostile", Round: 1,
		SourceID: src.ID, SessionGeneration: gen, MaxPages: 10,
	})
	if err != nil {
		t.Fatalf("discovery round over hostile entries: %v", err)
	}
	var round contract.RoundResult
	if err := val.Get(&round); err != nil {
		t.Fatal(err)
	}
	if !round.Complete || round.Resources != 1 {
		t.Fatalf("round: %+v", round)
	}
	// Round A's entries are stored in the background while round B would page (issue 16 item
	// 5); the storing transaction holds the round's row lock until they are in.
	if _, err := store.Pool().Exec(ctx, `SELECT 1 FROM discovery_scans WHERE id = $1 FOR SHARE`, round.ScanID); err != nil {
		t.Fatal(err)
	}
	var name, mime string
	if err := store.Pool().QueryRow(ctx, `SELECT e.name, e.mime_type FROM catalog_entries e WHERE e.scan_id = $1`, round.ScanID).Scan(&name, &mime); err != nil {
		t.Fatal(err)
	}
	if name != `name\u0000`+"\r\u009b" || mime != ledger.SafeText(hostileMIME) {
		t.Errorf("stored entry %q %q", name, mime)
	}

	// A read of the resource is accepted as a version.
	sub := hs.activeSubscription(ctx, t, uri, "wf-hostile")
	led := &activities.Ledger{Store: store}
	alloc, err := led.AllocateReadOrdinal(ctx, contract.AllocateInput{SubscriptionID: sub.ID, Generation: sub.Generation, SessionGeneration: gen, URI: uri, RequestID: "r1", Reason: mcpsync.ReasonNotification})
	if err != nil || alloc.Outcome != mcpsync.OutcomeAllocated {
		t.Fatalf("allocate: %+v %v", alloc, err)
	}
	sa := &activities.Session{Host: h, Store: store}
	read, err := sa.MCPRead(ctx, contract.ReadInput{SourceID: src.ID, SessionGeneration: gen, ServerURI: uri, Ordinal: alloc.Ordinal, RequestID: "r1"})
	if err != nil || !read.Found {
		t.Fatalf("read: %+v %v", read, err)
	}
	acc, err := led.AcceptResourceVersion(ctx, contract.AcceptInput{
		ReadID: mcpsync.ReadID{SubscriptionID: sub.ID, Generation: sub.Generation, SessionGeneration: gen, URI: uri, Ordinal: alloc.Ordinal, RequestID: "r1"},
		Read:   read,
	})
	if err != nil || acc.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("accept a version with a hostile MIME type and serverInfo: %+v %v", acc, err)
	}
	vs, err := store.Versions(ctx, sub.ID)
	if err != nil || len(vs) != 1 {
		t.Fatalf("versions: %+v %v", vs, err)
	}
	v := vs[0]
	if v.MIMEType != ledger.SafeText(hostileMIME) || v.ServerName != ledger.SafeText(hostileName) {
		t.Errorf("stored version MIME %q server %q", v.MIMEType, v.ServerName)
	}
}
