package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/mcpsync/mcpsync/internal/consumers"
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

// watchPoll is how long watch waits between reads of the outbox when no notification wakes it
// (versions notify only while the gateway has turned them on, ledger.SetOutboxNotify).
var watchPoll = 200 * time.Millisecond

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
	// Listen before reading the head: a version accepted after the head was read wakes the
	// loop below at its commit (when its kind notifies: the gateway turns versions on), not
	// only on the next poll. Without a listener, watch polls.
	l, err := st.ListenOutbox(ctx, "")
	if err != nil {
		l = nil
	}
	defer func() {
		if l != nil {
			l.Close()
		}
	}()
	w := consumers.NewWaiter(l, watchPoll)
	var cur ledger.OutboxCursor
	if !*fromStart {
		if cur, err = st.OutboxHead(ctx); err != nil {
			return err
		}
	}
	for {
		rows, heldBack, err := st.OutboxBatch(ctx, cur, 500)
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
			w.Delivered()
			continue
		}
		if _, err := w.Wait(ctx, heldBack); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// The listener's connection failed: poll from now on.
			l.Close()
			l = nil
			w = consumers.NewWaiter(nil, watchPoll)
		}
	}
}
