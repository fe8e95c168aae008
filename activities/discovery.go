package activities

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/discovery"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// progressEvery is how often a running round writes its progress to the ledger.
const progressEvery = 500 * time.Millisecond

// Discovery runs discovery rounds on the live sessions this worker's host holds; register it
// on the host's own task queue, next to Session.
type Discovery struct {
	Host  *mcphost.Host
	Store *ledger.Store
	// CursorKey keys the stored cursor digests; nil means a random key made once per process,
	// so a digest says whether two cursors of this process were equal and nothing more.
	CursorKey []byte
	// MaxPageEntries and MaxRoundEntries cap the entries of one page and of one round (issue
	// 14 item 6); 0 means discovery.DefaultMaxPageEntries and discovery.DefaultMaxEntries. A
	// round over either fails as ENTRY_CAP.
	MaxPageEntries  int
	MaxRoundEntries int

	keyOnce sync.Once
	// counts holds, per source ID, the entries of the source's last complete round on this
	// worker: the next round's discovery.Options.EntriesHint (round B's is round A's count).
	counts sync.Map
}

// Register registers the session-bound discovery activities under their contract names.
func (a *Discovery) Register(r Registry) {
	r.RegisterActivityWithOptions(a.DiscoveryRound, activity.RegisterOptions{Name: contract.ActDiscoveryRound})
	r.RegisterActivityWithOptions(a.DiscoveryRoundPair, activity.RegisterOptions{Name: contract.ActDiscoveryRoundPair})
}

// DiscoveryRoundPair runs rounds A and B back to back on one session (issue 16 item 5), each
// as DiscoveryRound runs it, without a workflow task and an activity dispatch between them:
// see PairRounds.
func (a *Discovery) DiscoveryRoundPair(ctx context.Context, in contract.RoundPairInput) ([]contract.RoundResult, error) {
	return PairRounds(ctx, in, a.DiscoveryRound, a.Store.AbandonScan)
}

// PairRounds runs round A of in with round, then, only if A completed, round B: B begins once
// A's end is committed. It returns A's result, then B's if B ran. An error is A's (nothing of
// B happened). A round B that could not run or end (its session ended before it began, the
// ledger failed) is failed in the ledger with abandon and returned as a failed round, as the
// workflow does with a failed round activity (R24: a RUNNING round never proves anything).
func PairRounds(ctx context.Context, in contract.RoundPairInput,
	round func(context.Context, contract.RoundInput) (contract.RoundResult, error),
	abandon func(ctx context.Context, scanKey, reason string) (bool, error)) ([]contract.RoundResult, error) {
	ra, err := round(ctx, in.A)
	if err != nil {
		return nil, err
	}
	if !ra.Complete {
		return []contract.RoundResult{ra}, nil
	}
	rb, err := round(ctx, in.B)
	if err != nil {
		kind := contract.RoundAbandoned
		if app, ok := errors.AsType[*temporal.ApplicationError](err); ok && app.Type() == contract.ErrTypeStaleSession {
			kind = contract.RoundStaleSession
		}
		msg := ledger.Bounded(err.Error(), ledger.MaxPayloadString)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, aerr := abandon(actx, in.B.ScanKey, kind+": "+msg); aerr != nil {
			activity.GetLogger(ctx).Warn("abandoning round B in the ledger failed", "scanKey", in.B.ScanKey, "error", aerr)
		}
		rb = contract.RoundResult{Round: in.B.Round, SessionGeneration: in.B.SessionGeneration, FailureKind: kind, Failure: msg}
	}
	return []contract.RoundResult{ra, rb}, nil
}

func (a *Discovery) cursorKey() []byte {
	a.keyOnce.Do(func() {
		if a.CursorKey == nil {
			a.CursorKey = make([]byte, 32)
			rand.Read(a.CursorKey) // crypto/rand.Read never returns an error (it crashes instead)
		}
	})
	return a.CursorKey
}

// DiscoveryRound runs one round (R4) on the session of generation in.SessionGeneration: it
// opens the round's resourceDiscoveryScan.v1 row, pages both lists in memory (the cursors
// never leave this call, R2), stores the entries and digests under the row, and returns only
// digests and counts. Round 1 (A) returns once its end is committed and its entries' store
// holds the row lock; the entries are written while round B pages (issue 16 item 5), and the
// ledger makes everything that reads them wait (ledger.EndScanDeferred). A stale generation fails non-retryably with StaleSession; a round that
// fails (cycle, page cap, cursor error, session ended, R8) returns its result with
// FailureKind set. The list_changed notifications counted are those the session received
// between the first request and the last response.
func (a *Discovery) DiscoveryRound(ctx context.Context, in contract.RoundInput) (contract.RoundResult, error) {
	c, err := a.Host.Conn(in.SourceID, in.SessionGeneration)
	if err != nil {
		return contract.RoundResult{}, staleSession(err)
	}
	caps := c.Caps()
	out := contract.RoundResult{Round: in.Round, SessionGeneration: c.Generation(), SnapshotNegotiated: caps.SnapshotIDs}
	before := c.ListChangedCount()
	scanID, started, err := a.Store.BeginScan(ctx, ledger.ScanStart{
		Key: in.ScanKey, Run: in.ScanRun, ScanWorkflowID: in.ScanWorkflowID, Round: in.Round,
		SourceID: in.SourceID, SessionGeneration: in.SessionGeneration, HostQueue: a.Host.Queue(),
		ListChangedBefore: before,
	})
	if errors.Is(err, ledger.ErrStaleScan) {
		return contract.RoundResult{}, staleSession(err)
	}
	if err != nil {
		return contract.RoundResult{}, permanent(err)
	}
	out.ScanID, out.StartedAt = scanID, started
	var lastWrite time.Time
	hint, _ := a.counts.Load(in.SourceID)
	res := discovery.Scan(ctx, c.Session(), discovery.Options{
		// MCP 2026-07-28 (issue 13 item 7): a rejected cursor discards the round's pages and
		// starts it again, a bounded number of times; older sessions fail the round at once.
		CursorRestarts:  discovery.CursorRestartsFor(caps.ProtocolVersion),
		MaxPages:        in.MaxPages,
		MaxPageEntries:  a.MaxPageEntries,
		MaxEntries:      a.MaxRoundEntries,
		EntriesHint:     hintOf(hint), // this source's last count: no join at the round's end
		SnapshotMetaKey: discovery.SnapshotMetaKeyOf(caps.Raw),
		CursorKey:       a.cursorKey(),
		Check: func() error {
			if cur, ok := a.Host.Current(in.SourceID); !ok || cur != c {
				return fmt.Errorf("source %d generation %d ended during the round: %w", in.SourceID, in.SessionGeneration, mcphost.ErrStaleSession)
			}
			return nil
		},
		Progress: func(p discovery.Progress) {
			activity.RecordHeartbeat(ctx, p)
			if now := time.Now(); now.Sub(lastWrite) >= progressEvery {
				lastWrite = now
				// Progress is advisory (the round's end records the totals): a failed write
				// is logged, and the round goes on.
				if err := a.Store.RecordScanProgress(ctx, scanID, ledger.ScanProgress(p)); err != nil {
					activity.GetLogger(ctx).Warn("recording scan progress failed", "scan", scanID, "error", err)
				}
			}
		},
	})
	after := c.ListChangedCount()
	if res.Complete {
		a.counts.Store(in.SourceID, len(res.Entries))
	}
	if res.CursorRestarts > 0 {
		activity.GetLogger(ctx).Info("round started again after rejected cursors", "scan", scanID,
			"restarts", res.CursorRestarts, "discardedPages", res.DiscardedPages)
	}
	// Snapshot IDs are the server's words and reach both the ledger and this activity's
	// result: bounded the same way for both (equal IDs stay equal, issue 14 item 6).
	for i, id := range res.SnapshotIDs {
		res.SnapshotIDs[i] = ledger.Bounded(id, ledger.MaxPayloadString)
	}
	res.SnapshotID = ledger.Bounded(res.SnapshotID, ledger.MaxPayloadString)
	end := ledger.ScanEnd{
		ScanID: scanID, FailureKind: res.FailureKind, Progress: ledger.ScanProgress(res.Progress),
		Duplicates: res.Duplicates, ResourceCursorDigests: res.ResourceCursorDigests,
		TemplateCursorDigests: res.TemplateCursorDigests, SetDigest: res.SetDigest,
		SnapshotIDs: res.SnapshotIDs, SnapshotPages: res.SnapshotPages, SnapshotID: res.SnapshotID,
		ListChangedAfter: after,
	}
	if res.Err != nil {
		// A list error carries the server's message: bounded (issue 14 item 6).
		end.Failure = ledger.Bounded(res.Err.Error(), ledger.MaxPayloadString)
	}
	entries := res.Entries // the ledger's type: no copy of 100,000 entries
	// Record the end even if the activity was cancelled meanwhile: no row stays RUNNING.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var ended time.Time
	if in.Round == 1 {
		// Round A: its entries are stored while round B pages (issue 16 item 5). The end is
		// committed now; the ledger makes round B's end and the catalog's publication wait
		// for the entries, and if storing them fails, round B stores its own.
		var pending *ledger.PendingEntries
		ended, pending, err = a.Store.EndScanDeferred(ectx, end, entries)
		if pending != nil {
			log := activity.GetLogger(ctx)
			go func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
				defer cancel()
				if err := pending.Store(sctx); err != nil {
					log.Warn("storing round A's entries failed; round B stores them", "scan", scanID, "error", err)
				}
			}()
		}
	} else {
		ended, err = a.Store.EndScan(ectx, end, entries)
	}
	if err != nil {
		return contract.RoundResult{}, boundError(err)
	}
	out.Complete, out.FailureKind, out.Failure = res.Complete, res.FailureKind, end.Failure
	out.ResourcePages, out.TemplatePages = res.ResourcePages, res.TemplatePages
	out.Resources, out.Templates, out.Duplicates = res.Resources, res.Templates, res.Duplicates
	out.SetDigest, out.CursorChainDigest = res.SetDigest, res.CursorChainDigest
	out.SnapshotIDs, out.SnapshotPages, out.SnapshotID = res.SnapshotIDs, res.SnapshotPages, res.SnapshotID
	out.ListChangedObserved = max(after-before, 0)
	out.EndedAt = ended
	return out, nil
}

// hintOf is the entries hint a counts value gives (0: none stored).
func hintOf(v any) int {
	n, _ := v.(int)
	return n
}

// Catalog runs the ledger's catalog transitions as activities (local activities next to the
// discovery workflows and the subscription workflow).
type Catalog struct {
	Store *ledger.Store
}

// Register registers every catalog ledger activity under its contract name.
func (a *Catalog) Register(r Registry) {
	for name, fn := range map[string]any{
		contract.ActAbandonScan:        a.AbandonScan,
		contract.ActPublishCatalog:     a.PublishCatalog,
		contract.ActInvalidateCatalogs: a.InvalidateCatalogs,
		contract.ActConfirmTombstone:   a.ConfirmTombstone,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// AbandonScan fails a round whose activity ended without recording its end.
func (a *Catalog) AbandonScan(ctx context.Context, in contract.AbandonInput) (bool, error) {
	ok, err := a.Store.AbandonScan(ctx, in.ScanKey, in.Reason)
	return ok, permanent(err)
}

// PublishCatalog publishes a catalog; the ledger re-checks the basis rounds and a level they
// do not prove comes back as Published=false with the refusal (not an error).
func (a *Catalog) PublishCatalog(ctx context.Context, in contract.PublishInput) (contract.PublishOutput, error) {
	c, err := a.Store.PublishCatalog(ctx, ledger.PublishRequest{
		Key: in.CatalogKey, ScanWorkflowID: in.ScanWorkflowID, SourceID: in.SourceID,
		SessionGeneration: in.SessionGeneration, Level: ledger.ProofLevel(in.Level), Reason: in.Reason,
		RoundsUsed: in.RoundsUsed, BasisScanIDs: in.BasisScanIDs, EntriesScanID: in.EntriesScanID,
		Recheck: time.Duration(in.RecheckSeconds) * time.Second,
	})
	var refusal *ledger.ProofRefusal
	if errors.As(err, &refusal) {
		return contract.PublishOutput{Level: in.Level, Refusal: refusal.Reason}, nil
	}
	if err != nil {
		return contract.PublishOutput{}, permanent(err)
	}
	return contract.PublishOutput{
		Published: true, CatalogID: c.ID, Level: string(c.Level), MeasuredAt: c.MeasuredAt,
		NextCheckAt: c.NextCheckAt, StalenessBoundSeconds: c.StalenessBound.Seconds(),
	}, nil
}

// InvalidateCatalogs invalidates a source's catalogs after a list_changed (R3).
func (a *Catalog) InvalidateCatalogs(ctx context.Context, in contract.InvalidateInput) (int64, error) {
	n, err := a.Store.InvalidateCatalogs(ctx, in.SourceID, in.Reason)
	return n, permanent(err)
}

// ConfirmTombstone confirms a TOMBSTONE_PENDING subscription's deletion with a catalog (R21).
func (a *Catalog) ConfirmTombstone(ctx context.Context, in contract.ConfirmTombstoneInput) (contract.ConfirmTombstoneOutput, error) {
	r, err := a.Store.ConfirmTombstone(ctx, ledger.ConfirmTombstoneRequest{
		SubscriptionID: in.SubscriptionID, Generation: in.Generation, CatalogID: in.CatalogID,
	})
	if err != nil {
		return contract.ConfirmTombstoneOutput{}, permanent(err)
	}
	return contract.ConfirmTombstoneOutput{
		Outcome: r.Outcome, Refusal: r.Refusal, State: r.State,
		ReadOrdinal: r.ReadOrdinal, CloseOrdinal: r.CloseOrdinal, CloseEpoch: r.CloseEpoch, VersionID: r.VersionID,
	}, nil
}
