package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"scan", "SOURCE [--wait] [--timeout 5m] [--json]: run a discovery scan (A/B rounds) and publish a catalog", scanCmd})
	register(command{"catalog", "SOURCE [--purpose display|integrity] [--consumer NAME] [--json]: the source's newest catalog, if the purpose may have it (refused: exit 4)", catalogCmd})
}

func scanCmd(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync scan SOURCE [--wait] [--timeout 5m] [--json]"
	fs := flag.NewFlagSet("scan", flag.ContinueOnError)
	wait := fs.Bool("wait", false, "wait for the scan, showing its progress, and print its catalog")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long --wait waits")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "SOURCE")
	if err != nil {
		return err
	}
	if err := positive("timeout", *timeout); err != nil {
		return err
	}
	if isSet(fs, "timeout") && !*wait {
		return usageErr("--timeout applies only with --wait")
	}
	st, src, err := e.storeLiveSource(ctx, pos[0])
	if err != nil {
		return err
	}
	tc, err := e.temporal(ctx)
	if err != nil {
		return err
	}
	if *wait {
		// Without a worker the scan would never start: say so now, not after --timeout.
		if err := awaitWorker(ctx, tc); err != nil {
			return err
		}
	}
	wfID := contract.SourceWorkflowID(src.Name)
	reqID := "cli/" + newID()
	if _, err := tc.SignalWithStartWorkflow(ctx, wfID, contract.SignalScanRequest,
		contract.ScanRequest{ID: reqID, Reason: "requested by mcpsync scan"},
		client.StartWorkflowOptions{ID: wfID, TaskQueue: contract.TaskQueue},
		contract.SourceWorkflowName, contract.SourceInput{SourceID: src.ID, Source: src.Name}); err != nil {
		return fmt.Errorf("requesting a scan from %s: %w", wfID, err)
	}
	if !*wait {
		if *asJSON {
			return writeJSON(e.Stdout, map[string]string{"sourceWorkflowId": wfID, "requestId": reqID})
		}
		fmt.Fprintf(e.Stdout, "scan of %s requested (request %s, workflow %s); mcpsync catalog %s shows the result\n", src.Name, reqID, wfID, src.Name)
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// --timeout ran out (not an interrupt): the scan was requested and goes on without us. The
	// error may be the context's or the server's deadline status: wctx says which happened.
	timedOut := func(err error) error {
		if errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("%w; not done within --timeout %s: the scan goes on, mcpsync catalog %s shows its result", err, *timeout, visible(src.Name))
		}
		return err
	}
	scanID, err := assignedScan(wctx, tc, wfID, reqID)
	if err != nil {
		return timedOut(err)
	}
	if !*asJSON {
		fmt.Fprintf(e.Stdout, "scan %s of %s started\n", scanID, src.Name)
	}
	res, err := followScan(wctx, tc, st, scanID, e.Stdout, !*asJSON)
	if err != nil {
		return timedOut(err)
	}
	rounds, err := st.ScansOfWorkflow(ctx, scanID)
	if err != nil {
		return err
	}
	if *asJSON {
		j := scanJSON{ScanWorkflowID: scanID, Result: res}
		for _, r := range rounds {
			j.Rounds = append(j.Rounds, roundOf(r))
		}
		if err := writeJSON(e.Stdout, j); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.Stdout, "catalog %d of %s: %s after %d rounds: %d resources, %d templates, set %s\n",
			res.CatalogID, visible(src.Name), res.Level, res.Rounds, res.Resources, res.Templates, orDash(res.SetDigest))
		fmt.Fprintf(e.Stdout, "  measured %s, staleness bound %s, next check %s\n  %s\n",
			res.MeasuredAt.UTC().Format(time.RFC3339), (time.Duration(res.StalenessBoundSeconds) * time.Second).String(),
			res.NextCheckAt.UTC().Format(time.RFC3339), visible(res.Reason))
	}
	if res.Level == contract.ProofReconciliationRequired {
		return fmt.Errorf("no two rounds agreed: catalog %d needs reconciliation (%s)", res.CatalogID, res.Reason)
	}
	return nil
}

// assignedScan waits until the source workflow assigns request reqID to a scan and returns
// that scan's workflow ID.
func assignedScan(ctx context.Context, tc client.Client, wfID, reqID string) (string, error) {
	for {
		resp, err := tc.QueryWorkflow(ctx, wfID, "", contract.QuerySourceState)
		if err == nil {
			var v contract.SourceView
			if err := resp.Get(&v); err != nil {
				return "", fmt.Errorf("decoding the state of %s: %w", wfID, err)
			}
			if i := slices.IndexFunc(v.Assigned, func(a contract.ScanAssignment) bool { return a.RequestID == reqID }); i >= 0 {
				return v.Assigned[i].ScanWorkflowID, nil
			}
		}
		select {
		case <-ctx.Done():
			if err != nil && !errors.Is(err, ctx.Err()) {
				return "", fmt.Errorf("no scan started for request %s on %s: %w (last query error: %v)", reqID, wfID, ctx.Err(), err)
			}
			return "", fmt.Errorf("no scan started for request %s on %s: %w", reqID, wfID, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// followScan waits for scan workflow scanID, printing each round's progress as it changes
// (pages and items as they arrive, from the ledger's progress rows) when show is set.
func followScan(ctx context.Context, tc client.Client, st *ledger.Store, scanID string, out io.Writer, show bool) (contract.DiscoveryScanResult, error) {
	type done struct {
		res contract.DiscoveryScanResult
		err error
	}
	ch := make(chan done, 1)
	// The wait for the result carries no deadline of its own (the server would end a long poll
	// carrying ctx's deadline a little before it, with an error of its own): ctx's end is seen
	// below, and ends the wait when followScan returns.
	gctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	go func() {
		var d done
		for {
			d.err = tc.GetWorkflow(gctx, scanID, "").Get(gctx, &d.res)
			// The source workflow names the scan before the scan's workflow has started.
			var nf *serviceerror.NotFound
			if !errors.As(d.err, &nf) || gctx.Err() != nil {
				break
			}
			select {
			case <-gctx.Done():
			case <-time.After(25 * time.Millisecond):
			}
		}
		ch <- d
	}()
	printed := map[int64]string{}
	report := func() {
		if !show {
			return
		}
		rounds, err := st.ScansOfWorkflow(ctx, scanID)
		if err != nil {
			return
		}
		for _, r := range rounds {
			line := roundLine(r)
			if printed[r.ID] != line {
				printed[r.ID] = line
				fmt.Fprintln(out, "  "+visible(line))
			}
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case d := <-ch:
			report()
			if d.err != nil {
				return d.res, fmt.Errorf("scan %s: %w", scanID, d.err)
			}
			return d.res, nil
		case <-tick.C:
			report()
		case <-ctx.Done():
			return contract.DiscoveryScanResult{}, fmt.Errorf("scan %s not finished: %w", scanID, ctx.Err())
		}
	}
}

func roundLine(r ledger.Scan) string {
	p := r.Progress
	counts := fmt.Sprintf("%d pages, %d resources, %d templates", p.ResourcePages+p.TemplatePages, p.Resources, p.Templates)
	switch r.Outcome {
	case ledger.ScanComplete:
		ids := ""
		if len(r.SnapshotIDs) > 0 {
			ids = fmt.Sprintf(", snapshot IDs %s (negotiated %t)", strings.Join(r.SnapshotIDs, ","), r.SnapshotNegotiated)
		}
		return fmt.Sprintf("round %d (session %d) complete: %s, set %s, %d list_changed%s",
			r.Round, r.SessionGeneration, counts, short(r.SetDigest), r.ListChangedObserved, ids)
	case ledger.ScanFailed:
		return fmt.Sprintf("round %d (session %d) failed after %s: %s: %s", r.Round, r.SessionGeneration, counts, r.FailureKind, r.Failure)
	default:
		return fmt.Sprintf("round %d (session %d): %s", r.Round, r.SessionGeneration, counts)
	}
}

func short(digest string) string {
	if len(digest) > 19 {
		return digest[:19] + "…"
	}
	return digest
}

// roundJSON is one round as `scan --json` reports it.
type roundJSON struct {
	ID                  int64      `json:"id"`
	Round               int        `json:"round"`
	SessionGeneration   int64      `json:"sessionGeneration"`
	Outcome             string     `json:"outcome"`
	FailureKind         string     `json:"failureKind,omitempty"`
	Failure             string     `json:"failure,omitempty"`
	ResourcePages       int        `json:"resourcePages"`
	TemplatePages       int        `json:"templatePages"`
	Resources           int        `json:"resources"`
	Templates           int        `json:"templates"`
	SetDigest           string     `json:"setDigest,omitempty"`
	SnapshotNegotiated  bool       `json:"snapshotNegotiated"`
	SnapshotIDs         []string   `json:"snapshotIds,omitempty"`
	SnapshotID          string     `json:"snapshotId,omitempty"`
	ListChangedObserved int64      `json:"listChangedObserved"`
	StartedAt           time.Time  `json:"startedAt"`
	EndedAt             *time.Time `json:"endedAt,omitempty"`
}

func roundOf(r ledger.Scan) roundJSON {
	return roundJSON{
		ID: r.ID, Round: r.Round, SessionGeneration: r.SessionGeneration, Outcome: r.Outcome,
		FailureKind: r.FailureKind, Failure: r.Failure, ResourcePages: r.Progress.ResourcePages,
		TemplatePages: r.Progress.TemplatePages, Resources: r.Progress.Resources, Templates: r.Progress.Templates,
		SetDigest: r.SetDigest, SnapshotNegotiated: r.SnapshotNegotiated, SnapshotIDs: r.SnapshotIDs,
		SnapshotID: r.SnapshotID, ListChangedObserved: r.ListChangedObserved, StartedAt: r.StartedAt, EndedAt: r.EndedAt,
	}
}

// scanJSON is what `scan --wait --json` prints.
type scanJSON struct {
	ScanWorkflowID string                       `json:"scanWorkflowId"`
	Result         contract.DiscoveryScanResult `json:"result"`
	Rounds         []roundJSON                  `json:"rounds"`
}

// catalogJSON is a catalog as `catalog --json` reports it.
type catalogJSON struct {
	ID                    int64      `json:"id"`
	Source                string     `json:"source"`
	Level                 string     `json:"level"`
	Reason                string     `json:"reason"`
	SessionGeneration     int64      `json:"sessionGeneration"`
	ScanWorkflowID        string     `json:"scanWorkflowId"`
	RoundsUsed            int        `json:"roundsUsed"`
	BasisScanIDs          []int64    `json:"basisScanIds"`
	SetDigest             string     `json:"setDigest,omitempty"`
	SnapshotID            string     `json:"snapshotId,omitempty"`
	Resources             int        `json:"resources"`
	Templates             int        `json:"templates"`
	ScansStartedAt        *time.Time `json:"scansStartedAt,omitempty"`
	MeasuredAt            time.Time  `json:"measuredAt"`
	StalenessBoundSeconds float64    `json:"stalenessBoundSeconds"`
	NextCheckAt           time.Time  `json:"nextCheckAt"`
	PublishedAt           time.Time  `json:"publishedAt"`
	InvalidatedAt         *time.Time `json:"invalidatedAt,omitempty"`
	InvalidatedReason     string     `json:"invalidatedReason,omitempty"`
}

func catalogOf(c ledger.Catalog) catalogJSON {
	return catalogJSON{
		ID: c.ID, Source: c.SourceName, Level: string(c.Level), Reason: c.Reason,
		SessionGeneration: c.SessionGeneration, ScanWorkflowID: c.ScanWorkflowID, RoundsUsed: c.RoundsUsed,
		BasisScanIDs: c.BasisScanIDs, SetDigest: c.SetDigest, SnapshotID: c.SnapshotID,
		Resources: c.Resources, Templates: c.Templates, ScansStartedAt: c.ScansStartedAt,
		MeasuredAt: c.MeasuredAt, StalenessBoundSeconds: c.StalenessBound.Seconds(),
		NextCheckAt: c.NextCheckAt, PublishedAt: c.PublishedAt, InvalidatedAt: c.InvalidatedAt,
		InvalidatedReason: c.InvalidatedReason,
	}
}

// entryJSON is one catalog entry.
type entryJSON struct {
	Kind      string `json:"kind"`
	URI       string `json:"uri"`
	ServerURI string `json:"serverUri"`
	Name      string `json:"name,omitempty"`
	MIMEType  string `json:"mimeType,omitempty"`
}

// consumedJSON is what `catalog --json` prints: an accepted catalog with its entries, or a
// refusal.
type consumedJSON struct {
	Purpose       string       `json:"purpose"`
	Consumer      string       `json:"consumer"`
	ConsumptionID int64        `json:"consumptionId"`
	Refused       bool         `json:"refused"`
	Refusal       string       `json:"refusal,omitempty"`
	Catalog       *catalogJSON `json:"catalog,omitempty"`
	Entries       []entryJSON  `json:"entries,omitempty"`
}

func catalogCmd(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync catalog SOURCE [--purpose display|integrity] [--consumer NAME] [--json]"
	fs := flag.NewFlagSet("catalog", flag.ContinueOnError)
	purpose := fs.String("purpose", string(ledger.PurposeDisplay), "what the catalog is for: display, or integrity (needs SNAPSHOT_PROVEN)")
	consumer := fs.String("consumer", "mcpsync-cli", "who consumes the catalog, for the record")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "SOURCE")
	if err != nil {
		return err
	}
	if p := ledger.CatalogPurpose(*purpose); !p.Valid() {
		return usageErr("--purpose must be display or integrity, not %q", *purpose)
	}
	if err := notEmpty("--consumer", *consumer); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	got, err := st.ConsumeCatalog(ctx, ledger.CatalogRequest{Source: pos[0], Purpose: ledger.CatalogPurpose(*purpose), Consumer: *consumer})
	var refusal *ledger.CatalogRefusal
	switch {
	case errors.As(err, &refusal):
		if *asJSON {
			j := consumedJSON{Purpose: *purpose, Consumer: *consumer, ConsumptionID: refusal.ConsumptionID, Refused: true, Refusal: refusal.Reason}
			if refusal.Catalog != nil {
				c := catalogOf(*refusal.Catalog)
				j.Catalog = &c
			}
			if err := writeJSON(e.Stdout, j); err != nil {
				return err
			}
		}
		if refusal.Reason == ledger.RefusalNoCatalog {
			return notFoundErr("source %s has no catalog yet (mcpsync scan %s --wait); refusal recorded as consumption %d", pos[0], pos[0], refusal.ConsumptionID)
		}
		c := refusal.Catalog
		return &exitError{ExitRefused, fmt.Errorf("refused for %s: catalog %d of %s is %s (%s); refusal recorded as consumption %d",
			*purpose, c.ID, pos[0], c.Level, refusal.Reason, refusal.ConsumptionID)}
	case errors.Is(err, ledger.ErrNotFound):
		return notFoundErr("unknown source %q (see mcpsync source list)", pos[0])
	case err != nil:
		return err
	}
	c := got.Catalog
	if *asJSON {
		j := consumedJSON{Purpose: *purpose, Consumer: *consumer, ConsumptionID: got.ConsumptionID}
		cj := catalogOf(c)
		j.Catalog = &cj
		j.Entries = make([]entryJSON, 0, len(got.Entries))
		for _, x := range got.Entries {
			j.Entries = append(j.Entries, entryJSON(x))
		}
		return writeJSON(e.Stdout, j)
	}
	fmt.Fprintf(e.Stdout, "catalog %d of %s: %s, %d resources, %d templates (session %d, %d rounds)\n",
		c.ID, visible(c.SourceName), c.Level, c.Resources, c.Templates, c.SessionGeneration, c.RoundsUsed)
	fmt.Fprintf(e.Stdout, "measured %s, staleness bound %s, next check %s%s\n",
		c.MeasuredAt.UTC().Format(time.RFC3339), c.StalenessBound.Round(time.Second), c.NextCheckAt.UTC().Format(time.RFC3339),
		invalidated(c))
	return writeCatalogEntries(e.Stdout, got.Entries)
}

// writeCatalogEntries writes a catalog's entries as the text table of `mcpsync catalog`, every
// server-supplied string made visible (no control sequence reaches the terminal).
func writeCatalogEntries(w io.Writer, entries []ledger.ScanEntry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tURI\tNAME\tMIME")
	for _, x := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.Kind, visible(x.ServerURI), visible(orDash(x.Name)), visible(orDash(x.MIMEType)))
	}
	return tw.Flush()
}

func invalidated(c ledger.Catalog) string {
	if c.InvalidatedAt == nil {
		return ""
	}
	return fmt.Sprintf("; INVALIDATED %s (%s): a rescan is due", c.InvalidatedAt.UTC().Format(time.RFC3339), c.InvalidatedReason)
}
