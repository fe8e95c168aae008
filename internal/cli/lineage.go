package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"lineage", "[--index NAME] [--principal P] [--revocation ID] [--live] [--json]: which versions each derived index took", lineageCmd})
}

// lineageJSON is one lineage entry as lineage --json prints it.
type lineageJSON struct {
	ID              int64      `json:"id"`
	Index           string     `json:"index"`
	Principal       string     `json:"principal"`
	Source          string     `json:"source"`
	URI             string     `json:"uri"`
	VersionID       int64      `json:"versionId"`
	ReadOrdinal     int64      `json:"readOrdinal"`
	Digest          string     `json:"digest"`
	DeliveredDigest string     `json:"deliveredDigest"`
	Policy          string     `json:"policy"`
	GrantEpoch      int64      `json:"grantEpoch"`
	FirstTakenAt    time.Time  `json:"firstTakenAt"`
	LastTakenAt     time.Time  `json:"lastTakenAt"`
	Takes           int64      `json:"takes"`
	RevocationID    *int64     `json:"revocationId,omitempty"`
	InvalidatedAt   *time.Time `json:"invalidatedAt,omitempty"`
}

func lineageCmd(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync lineage [--index NAME] [--principal P] [--revocation ID] [--live] [--json]"
	fs := flag.NewFlagSet("lineage", flag.ContinueOnError)
	index := fs.String("index", "", "only this derived index")
	principal := fs.String("principal", "", "only content taken through this principal")
	revocation := fs.Int64("revocation", 0, "only entries this revocation invalidated")
	live := fs.Bool("live", false, "only entries no revocation invalidated")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, usage); err != nil {
		return err
	}
	switch {
	case *revocation < 0:
		return usageErr("--revocation must be a revocation ID above 0, got %d", *revocation)
	case *live && *revocation != 0:
		return usageErr("--live and --revocation exclude each other: a revocation's entries are not live")
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	if *revocation != 0 {
		if _, err := revocationByID(ctx, st, *revocation); err != nil {
			return err
		}
	}
	entries, err := st.Lineage(ctx, ledger.LineageFilter{Index: *index, Principal: *principal, RevocationID: *revocation, LiveOnly: *live})
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]lineageJSON, 0, len(entries))
		for _, l := range entries {
			out = append(out, lineageJSON{ID: l.ID, Index: l.Index, Principal: l.Principal, Source: l.SourceName, URI: l.URI,
				VersionID: l.VersionID, ReadOrdinal: l.ReadOrdinal, Digest: l.Digest, DeliveredDigest: l.DeliveredDigest,
				Policy: l.PolicyID, GrantEpoch: l.GrantEpoch, FirstTakenAt: l.FirstTakenAt.UTC(), LastTakenAt: l.LastTakenAt.UTC(),
				Takes: l.Takes, RevocationID: l.RevocationID, InvalidatedAt: l.InvalidatedAt})
		}
		return writeJSON(e.Stdout, out)
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tPRINCIPAL\tSOURCE\tURI\tORDINAL\tDIGEST\tTAKEN AT\tREVOCATION")
	for _, l := range entries {
		rev := "-"
		if l.RevocationID != nil {
			rev = strconv.FormatInt(*l.RevocationID, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", l.Index, l.Principal, l.SourceName, l.URI, l.ReadOrdinal,
			l.Digest, fmtTime(&l.LastTakenAt), rev)
	}
	return tw.Flush()
}
