package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"watch", "[SOURCE] [--from-start] [--json]: print each accepted version (URI, ordinal, digest) as it is accepted, until interrupted", watch})
}

// Kinds of the ledger's outbox rows that watch prints. The ledger writes "version" with each
// accepted version and "tombstone" with each confirmed deletion (R21); a tombstone version has
// the kind "tombstone" too.
const (
	outboxVersion   = "version"
	outboxTombstone = "tombstone"
)

// watchJSON is one accepted version or deletion as watch --json prints it.
type watchJSON struct {
	Time        time.Time `json:"time"`
	Kind        string    `json:"kind"`
	Source      string    `json:"source"`
	Principal   string    `json:"principal"`
	URI         string    `json:"uri"`
	ReadOrdinal int64     `json:"readOrdinal"`
	Digest      string    `json:"digest,omitempty"`
}

func watch(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync watch [SOURCE] [--from-start] [--json]"
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fromStart := fs.Bool("from-start", false, "print versions accepted before the command started too")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	pos, err := parse(fs, args, usage, "[SOURCE]")
	if err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	var only int64
	if len(pos) == 1 {
		src, err := sourceNamed(ctx, st, pos[0])
		if err != nil {
			return err
		}
		only = src.ID
	}
	var cur ledger.OutboxCursor
	if !*fromStart {
		if cur, err = st.OutboxHead(ctx); err != nil {
			return err
		}
	}
	for {
		rows, _, err := st.OutboxBatch(ctx, cur, 500)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, r := range rows {
			cur = r.Cursor
			if r.Shadow || r.SourceID == nil || (only != 0 && *r.SourceID != only) || (r.Kind != outboxVersion && r.Kind != outboxTombstone) {
				continue
			}
			name := r.SourceName
			var ord int64
			if r.ReadOrdinal != nil {
				ord = *r.ReadOrdinal
			}
			if *asJSON {
				if err := json.NewEncoder(e.Stdout).Encode(watchJSON{Time: r.CreatedAt.UTC(), Kind: r.Kind, Source: name,
					Principal: r.Principal, URI: r.URI, ReadOrdinal: ord, Digest: r.Digest}); err != nil {
					return err
				}
				continue
			}
			what := r.Digest
			if r.Kind == outboxTombstone {
				what = "deleted"
			}
			fmt.Fprintf(e.Stdout, "%s  %s  %s  ordinal=%d  %s\n", r.CreatedAt.UTC().Format(time.RFC3339), visible(name), r.URI, ord, visible(what))
		}
		if len(rows) > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}
