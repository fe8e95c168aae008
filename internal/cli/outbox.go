package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"outbox tail", "--consumer NAME [--follow] [--json] [--batch 200] [--from-now] [--limit N]: deliver " +
		"invalidations past the consumer's stored offset, at least once, committing the offset after printing", outboxTail})
	register(command{"outbox consumers", "[--json]: named outbox consumers with their offsets and lag", outboxConsumers})
}

// outboxEventJSON is one outbox row as outbox tail --json prints it (one object per line).
// Receivers deduplicate by idempotencyKey: a row is printed again after a crash before its
// batch's offset was committed.
type outboxEventJSON struct {
	Cursor         string          `json:"cursor"` // "<txid>:<id>", the consumer's position after this row
	Kind           string          `json:"kind"`
	IdempotencyKey string          `json:"idempotencyKey"`
	Principal      string          `json:"principal,omitempty"`
	Source         string          `json:"source,omitempty"`
	URI            string          `json:"uri,omitempty"`
	Digest         string          `json:"digest,omitempty"`
	ReadOrdinal    *int64          `json:"readOrdinal,omitempty"`
	SubscriptionID *int64          `json:"subscriptionId,omitempty"`
	CreatedAt      time.Time       `json:"createdAt"`
	Detail         json.RawMessage `json:"detail,omitempty"`
}

func cursorString(c ledger.OutboxCursor) string { return fmt.Sprintf("%d:%d", c.TxID, c.ID) }

func outboxTail(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync outbox tail --consumer NAME [--follow [--poll 1s]] [--json] [--batch 200] [--from-now] [--limit N]"
	fs := flag.NewFlagSet("outbox tail", flag.ContinueOnError)
	name := fs.String("consumer", "", "consumer name: its offset is stored in the ledger")
	follow := fs.Bool("follow", false, "keep delivering new rows until interrupted")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	batch := fs.Int("batch", 200, "rows printed before each offset commit (a crash replays at most one batch)")
	fromNow := fs.Bool("from-now", false, "a new consumer starts at the current head instead of the beginning")
	poll := fs.Duration("poll", time.Second, "fallback read period while following (NOTIFY wakes it sooner)")
	limit := fs.Int("limit", 0, "stop after this many rows (0: no limit)")
	if _, err := parse(fs, args, usage); err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(*name) == "":
		return usageErr("--consumer NAME is required (usage: %s)", usage)
	case *batch <= 0:
		return usageErr("--batch must be positive, got %d", *batch)
	case *limit < 0:
		return usageErr("--limit must not be negative, got %d", *limit)
	case isSet(fs, "poll") && !*follow:
		return usageErr("--poll applies only with --follow")
	}
	if err := positive("poll", *poll); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	deliver := func(_ context.Context, rows []ledger.OutboxEvent) error {
		for _, r := range rows {
			if err := printOutboxEvent(e.Stdout, r, *asJSON); err != nil {
				return err
			}
		}
		if f, ok := e.Stdout.(interface{ Sync() error }); ok {
			_ = f.Sync() // a terminal or pipe cannot sync; a file is flushed before the commit
		}
		return nil
	}
	_, err = consumers.Run(ctx, st, consumers.Options{Consumer: *name, Batch: *batch, Follow: *follow,
		PollInterval: *poll, StartAtHead: *fromNow, Limit: *limit}, deliver)
	switch {
	case errors.Is(err, ledger.ErrConsumerBusy):
		return fmt.Errorf("%w; stop the other outbox tail --consumer %s first", err, *name)
	case *follow && ctx.Err() != nil:
		return nil // interrupted: every printed batch was committed
	}
	return err
}

func printOutboxEvent(w io.Writer, r ledger.OutboxEvent, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(outboxEventJSON{Cursor: cursorString(r.Cursor), Kind: r.Kind,
			IdempotencyKey: r.IdempotencyKey, Principal: r.Principal, Source: r.SourceName, URI: r.URI, Digest: r.Digest,
			ReadOrdinal: r.ReadOrdinal, SubscriptionID: r.SubscriptionID, CreatedAt: r.CreatedAt.UTC(), Detail: r.Detail})
	}
	what := r.Digest
	switch r.Kind {
	case ledger.OutboxIndexInvalidation:
		var d struct {
			Revocation int64             `json:"revocation"`
			Index      string            `json:"index"`
			Entries    []json.RawMessage `json:"entries"`
		}
		_ = json.Unmarshal(r.Detail, &d)
		what = fmt.Sprintf("revocation=%d index=%s entries=%d", d.Revocation, d.Index, len(d.Entries))
	case ledger.OutboxRevocation:
		var d struct {
			Revocation int64    `json:"revocation"`
			Indexes    []string `json:"indexes"`
		}
		_ = json.Unmarshal(r.Detail, &d)
		what = fmt.Sprintf("revocation=%d indexes=%s", d.Revocation, orDash(strings.Join(d.Indexes, ",")))
	}
	_, err := fmt.Fprintf(w, "%s  %s  %s  key=%s  principal=%s  source=%s  uri=%s  %s\n",
		r.CreatedAt.UTC().Format(time.RFC3339Nano), cursorString(r.Cursor), r.Kind, r.IdempotencyKey,
		visible(orDash(r.Principal)), visible(orDash(r.SourceName)), orDash(r.URI), visible(orDash(what)))
	return err
}

type consumerJSON struct {
	Name      string    `json:"name"`
	Cursor    string    `json:"cursor"`
	Delivered int64     `json:"delivered"`
	Lag       int64     `json:"lag"`
	UpdatedAt time.Time `json:"updatedAt"`
}

func outboxConsumers(ctx context.Context, e *runEnv, args []string) error {
	fs := flag.NewFlagSet("outbox consumers", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, "mcpsync outbox consumers [--json]"); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	cs, err := st.ConsumerOffsets(ctx)
	if err != nil {
		return err
	}
	out := make([]consumerJSON, 0, len(cs))
	for _, c := range cs {
		out = append(out, consumerJSON{Name: c.Name, Cursor: cursorString(c.Cursor), Delivered: c.Delivered, Lag: c.Lag, UpdatedAt: c.UpdatedAt.UTC()})
	}
	if *asJSON {
		return writeJSON(e.Stdout, out)
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tCURSOR\tDELIVERED\tLAG\tUPDATED AT")
	for _, c := range out {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", c.Name, c.Cursor, c.Delivered, c.Lag, c.UpdatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}
