package cli

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"prune", "[--older-than 720h] [--dry-run] [--batch 5000] [--json]: delete ledger rows no fence, " +
		"consumer or derived index needs (SPEC Retention), with rows and bytes per table", prune})
}

// pruneJSON is what prune --json prints.
type pruneJSON struct {
	DryRun     bool                `json:"dryRun"`
	OlderThan  string              `json:"olderThan"`
	Cutoff     time.Time           `json:"cutoff"`
	BlobCutoff time.Time           `json:"blobCutoff"`
	Deleted    int64               `json:"deleted"`
	ElapsedMs  int64               `json:"elapsedMs"`
	Tables     []ledger.PruneTable `json:"tables"`
}

// prune runs the ledger's retention (issue 17 item 6): every row older than --older-than that
// the keep rules let go is deleted in bounded batches, or, with --dry-run, counted.
func prune(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync prune [--older-than 720h] [--dry-run] [--batch 5000] [--json]"
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	olderThan := fs.Duration("older-than", ledger.DefaultPruneOlderThan, "keep rows younger than this (content blobs: at least "+ledger.BlobGrace.String()+")")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted; delete nothing")
	batch := fs.Int("batch", ledger.DefaultPruneBatch, "rows one statement examines")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, usage); err != nil {
		return err
	}
	if err := nonNegative("older-than", *olderThan); err != nil {
		return err
	}
	if *batch <= 0 {
		return usageErr("--batch must be positive, got %d", *batch)
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	rep, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: *olderThan, DryRun: *dryRun, BatchSize: *batch})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.Stdout, pruneJSON{DryRun: rep.DryRun, OlderThan: olderThan.String(), Cutoff: rep.Cutoff.UTC(),
			BlobCutoff: rep.BlobCutoff.UTC(), Deleted: rep.Deleted(), ElapsedMs: rep.Elapsed.Milliseconds(), Tables: rep.Tables})
	}
	return writePruneReport(e, rep, *olderThan)
}

func writePruneReport(e *runEnv, rep ledger.PruneReport, olderThan time.Duration) error {
	verb := "deleted"
	if rep.DryRun {
		verb = "would delete"
	}
	fmt.Fprintf(e.Stdout, "prune of rows older than %s (before %s; blobs before %s): %s %d rows in %s\n",
		olderThan, rep.Cutoff.UTC().Format(time.RFC3339), rep.BlobCutoff.UTC().Format(time.RFC3339), verb, rep.Deleted(),
		rep.Elapsed.Round(time.Millisecond))
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TABLE\tROWS BEFORE\tDELETED\tROWS AFTER\tFREED\tSIZE BEFORE\tSIZE AFTER\t")
	for _, t := range rep.Tables {
		after := t.RowsAfter
		if rep.DryRun {
			after = t.RowsBefore - t.Deleted
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t\n", t.Table, t.RowsBefore, t.Deleted, after,
			byteSize(t.FreedBytes), byteSize(t.BytesBefore), byteSize(t.BytesAfter))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.DryRun {
		fmt.Fprintln(e.Stdout, "dry run: nothing was deleted; ROWS AFTER is what would remain")
	} else {
		fmt.Fprintln(e.Stdout, "FREED is the size of the deleted rows, reused by new rows; SIZE AFTER falls only after VACUUM FULL")
	}
	return nil
}

// byteSize renders n bytes in binary units (B, KiB, MiB, GiB) with one decimal.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 2 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, []string{"KiB", "MiB", "GiB"}[i])
}
