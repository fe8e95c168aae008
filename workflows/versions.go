package workflows

import "go.temporal.io/sdk/workflow"

// Workflow code changes that alter the commands a run issues are patches (docs/UPGRADE.md,
// issue 17 part 5): the new branch is taken only by runs that reach the change after the new
// code is deployed (workflow.GetVersion records a version marker), while a run whose history
// reached it before replays the old branch, so live subscriptions survive the deploy.

// patches are the change IDs of every patch still in the code, oldest first, with the commit
// that made it. Each has histories recorded before the change in testdata/histories that
// replay against the current code (replay_test.go); an old branch is removed only once no
// open run predates the patch (docs/UPGRADE.md).
var patches = []string{
	versionRecordEveryListChanged, // f773392, SourceWorkflow
	versionCoverAfterRead,         // d9eceaa, SubscriptionWorkflow
	versionCloseOnEndedSession,    // dffcd2d, SubscriptionWorkflow
	versionLocalRead,              // issue 16 item 2, SubscriptionWorkflow
	versionLocalSubscribe,         // issue 16 item 4, SubscriptionWorkflow
	versionRoundPair,              // issue 16 item 5, DiscoveryScanWorkflow
	versionCloseUngranted,         // issue 16 (seen and mended), SubscriptionWorkflow
}

// unguardedPatches, set only by tests, makes every patch take its new branch without a
// version marker: what the code would do had the change been made without workflow.GetVersion.
// Replaying a pre-patch history that way must fail, which shows the history exercises the
// change.
var unguardedPatches bool

// patched reports whether this run takes the new branch of patch change: version 1 of
// workflow.GetVersion, recorded in history the first time the run gets here, and
// DefaultVersion when the history got here before the patch existed.
func patched(ctx workflow.Context, change string) bool {
	if unguardedPatches {
		return true
	}
	return workflow.GetVersion(ctx, change, workflow.DefaultVersion, 1) == 1
}
