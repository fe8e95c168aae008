package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Bad input to prune exits 2 with one line, before the ledger is contacted (the rows of
// TestBadInput for this command; cli_test.go keeps one of them so that its coverage check
// sees the command).
func TestPruneBadInput(t *testing.T) {
	usage := "(usage: mcpsync prune [--older-than 720h] [--dry-run] [--batch 5000] [--json])"
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"prune", "--older-than", "-1h"}, "mcpsync prune: --older-than must not be negative, got -1h0m0s"},
		{[]string{"prune", "--older-than", "garbage"}, `mcpsync prune: invalid value "garbage" for flag -older-than: parse error ` + usage},
		{[]string{"prune", "--older-than", "30"}, `mcpsync prune: invalid value "30" for flag -older-than: parse error ` + usage},
		{[]string{"prune", "--older-than="}, `mcpsync prune: invalid value "" for flag -older-than: parse error ` + usage},
		{[]string{"prune", "--batch", "0"}, "mcpsync prune: --batch must be positive, got 0"},
		{[]string{"prune", "--batch", "x"}, `mcpsync prune: invalid value "x" for flag -batch: parse error ` + usage},
		{[]string{"prune", "--dry-run=maybe"}, `mcpsync prune: invalid boolean value "maybe" for -dry-run: parse error ` + usage},
		{[]string{"prune", "now"}, `mcpsync prune: unexpected argument "now" ` + usage},
		{[]string{"prune", "--bogus"}, "mcpsync prune: flag provided but not defined: -bogus " + usage},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, errOut, code := run(t, tt.args...)
			if code != cli.ExitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, cli.ExitUsage, errOut)
			}
			if diff := cmp.Diff(tt.want+"\n", errOut); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}
}

// prune reports rows and bytes per table, counts without deleting on --dry-run, and deletes
// the same rows for real: here the receipts and dispatches of superseded reads, the consumed
// outbox rows and the superseded versions of a subscription with three accepted reads.
func TestPruneCommand(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "demo", Transport: ledger.TransportStdio, Command: []string{"srv"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, "host", time.Minute); err != nil {
		t.Fatal(err)
	}
	sess, _, err := st.OpenSession(ctx, src.ID, "host", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "default", SourceID: src.ID, URI: "demo://a", ServerURI: "demo://a", WorkflowID: "wf"})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
		if r, err := step(ctx, sub.ID, sub.Generation, sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("activate: %+v %v", r, err)
		}
	}
	for i := range 3 {
		req := string(rune('a' + i))
		d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sess.Generation, URI: "demo://a", RequestID: req, Reason: mcpsync.ReasonPoll})
		if err != nil {
			t.Fatal(err)
		}
		digest, err := st.PutBlob(ctx, []byte(req), "")
		if err != nil {
			t.Fatal(err)
		}
		if r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sess.Generation, URI: "demo://a", Ordinal: d.Ordinal, RequestID: req,
			Version: ledger.VersionInfo{Digest: digest, Size: 1}}); err != nil || r.Outcome != mcpsync.OutcomeAccepted {
			t.Fatalf("accept: %+v %v", r, err)
		}
	}
	prune := func(args ...string) (map[string]int64, string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb, Store: st, Config: config.Env{DatabaseURL: "unused"}},
			append([]string{"prune", "--older-than", "0s"}, args...))
		if code != cli.ExitOK {
			t.Fatalf("prune %v: exit %d, stderr %q", args, code, errb.String())
		}
		if !strings.Contains(strings.Join(args, " "), "--json") {
			return nil, out.String()
		}
		var rep struct {
			DryRun bool `json:"dryRun"`
			Tables []struct {
				Table      string `json:"table"`
				Deleted    int64  `json:"deleted"`
				RowsBefore int64  `json:"rowsBefore"`
				BytesAfter int64  `json:"bytesAfter"`
			} `json:"tables"`
		}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("prune --json: %v\n%s", err, out.String())
		}
		deleted := map[string]int64{}
		for _, tb := range rep.Tables {
			if tb.Deleted > 0 {
				deleted[tb.Table] = tb.Deleted
			}
			if tb.BytesAfter <= 0 {
				t.Errorf("%s: size after %d", tb.Table, tb.BytesAfter)
			}
		}
		return deleted, out.String()
	}
	// No consumer is registered, so every version outbox row counts as passed; the versions
	// they named, but the newest, go with them.
	want := map[string]int64{"invalidation_outbox": 3, "resource_versions": 2, "read_dispatches": 2, "receipts": 4}
	dry, _ := prune("--dry-run", "--json")
	if diff := cmp.Diff(want, dry); diff != "" {
		t.Errorf("dry run (-want +got):\n%s", diff)
	}
	_, text := prune("--dry-run")
	for _, s := range []string{"would delete 11 rows", "resource_versions", "dry run: nothing was deleted"} {
		if !strings.Contains(text, s) {
			t.Errorf("dry run table lacks %q:\n%s", s, text)
		}
	}
	got, _ := prune("--json", "--batch", "1")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("prune (-want +got):\n%s", diff)
	}
	// Blobs v "a" and "b" are now named by nothing, but younger than the blob grace.
	again, _ := prune("--json")
	if diff := cmp.Diff(map[string]int64{}, again); diff != "" {
		t.Errorf("second prune (-want +got):\n%s", diff)
	}
}
