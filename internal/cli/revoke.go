package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"go.temporal.io/api/serviceerror"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"revoke", "PRINCIPAL [SOURCE] [--reason R] [--wait 20s] [--json]: revoke grants, close the principal's " +
		"subscriptions through the fence and invalidate every derived index holding its content", revokeCmd})
	register(command{"revocation", "ID [--json]: the trace of a revocation: grants, subscriptions, invalidated indexes and their consumers", revocationCmd})
}

// revokedSubJSON is one subscription a revocation closes.
type revokedSubJSON struct {
	SubscriptionID    int64         `json:"subscriptionId"`
	WorkflowID        string        `json:"workflowId"`
	Source            string        `json:"source"`
	URI               string        `json:"uri"`
	StateAtRevocation mcpsync.State `json:"stateAtRevocation"`
	State             mcpsync.State `json:"state,omitempty"`
	SignalError       string        `json:"signalError,omitempty"`
}

type indexJSON struct {
	Index          string   `json:"index"`
	Entries        int      `json:"entries"`
	OutboxKey      string   `json:"outboxKey"`
	OutboxID       int64    `json:"outboxId"`
	AckedConsumers []string `json:"ackedConsumers,omitempty"`
}

type revokedGrantJSON struct {
	Source string `json:"source"`
	Epoch  int64  `json:"epoch"`
}

// revocationJSON is what revoke --json and revocation --json print: the trace of a
// revocation to every subscription it closed and every derived index it invalidated (R24).
type revocationJSON struct {
	Revocation    int64              `json:"revocation"`
	Principal     string             `json:"principal"`
	Source        string             `json:"source,omitempty"` // empty: every source of the principal
	Reason        string             `json:"reason,omitempty"`
	RevokedAt     time.Time          `json:"revokedAt"`
	OutboxKey     string             `json:"outboxKey"`
	Grants        []revokedGrantJSON `json:"grants"`
	Subscriptions []revokedSubJSON   `json:"subscriptions"`
	Indexes       []indexJSON        `json:"indexes"`
}

func toRevocationJSON(rv ledger.Revocation, source string) revocationJSON {
	j := revocationJSON{Revocation: rv.ID, Principal: rv.Principal, Source: source, Reason: rv.Reason,
		RevokedAt: rv.RevokedAt.UTC(), OutboxKey: rv.OutboxKey,
		Grants: []revokedGrantJSON{}, Subscriptions: []revokedSubJSON{}, Indexes: []indexJSON{}}
	for _, g := range rv.Grants {
		j.Grants = append(j.Grants, revokedGrantJSON{Source: g.SourceName, Epoch: g.Epoch})
	}
	for _, s := range rv.Subscriptions {
		j.Subscriptions = append(j.Subscriptions, revokedSubJSON{SubscriptionID: s.SubscriptionID, WorkflowID: s.WorkflowID,
			Source: s.SourceName, URI: s.URI, StateAtRevocation: s.StateAtRevocation})
	}
	for _, ix := range rv.Indexes {
		j.Indexes = append(j.Indexes, indexJSON{Index: ix.Index, Entries: ix.Entries, OutboxKey: ix.OutboxKey,
			OutboxID: ix.OutboxID, AckedConsumers: ix.AckedConsumers})
	}
	return j
}

// signalParallelism bounds concurrent SignalWorkflow calls of one revocation.
const signalParallelism = 16

func revokeCmd(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync revoke PRINCIPAL [SOURCE] [--reason R] [--wait 20s] [--json]"
	fs := flag.NewFlagSet("revoke", flag.ContinueOnError)
	reason := fs.String("reason", "", "why the grant is revoked (recorded)")
	wait := fs.Duration("wait", 20*time.Second, "how long to wait for every subscription to pass the close fence (0: do not wait)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "PRINCIPAL", "[SOURCE]")
	if err != nil {
		return err
	}
	if err := notEmpty("PRINCIPAL", pos[0]); err != nil {
		return err
	}
	if err := nonNegative("wait", *wait); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	var src ledger.Source
	if len(pos) == 2 {
		if src, err = sourceNamed(ctx, st, pos[1]); err != nil {
			return err
		}
	}
	// The ledger first: content is unreadable and indexes are invalidated even when Temporal
	// is unreachable; the subscriptions are told afterwards (again by a repeated revoke).
	rv, err := st.Revoke(ctx, ledger.RevokeRequest{Principal: pos[0], SourceID: src.ID, Reason: *reason})
	if errors.Is(err, ledger.ErrNoGrant) {
		// Nothing stands; a subscription an earlier revocation failed to signal is told again.
		open, lerr := st.OpenSubscriptionsOf(ctx, pos[0], src.ID)
		if lerr != nil {
			return lerr
		}
		if len(open) == 0 {
			return notFoundErr("%v", grantErrNamed(err, src.Name))
		}
		tc, terr := e.temporal(ctx)
		if terr != nil {
			return terr
		}
		errs := signalRevoke(ctx, tc, open, "revoke-again/"+newID(), "no standing grant")
		failed := 0
		for _, err := range errs {
			if err != nil {
				failed++
			}
		}
		return notFoundErr("%v; %d open subscription(s) told to close, %d failed", grantErrNamed(err, src.Name), len(open), failed)
	}
	if err != nil {
		return err
	}
	j := toRevocationJSON(rv, src.Name)
	var tc signaler
	if len(rv.Subscriptions) > 0 {
		c, err := e.temporal(ctx)
		if err != nil {
			return fmt.Errorf("revocation %d stands (no content is readable, %d index(es) invalidated), but its %d subscription(s) were not told to close: %w; run mcpsync revoke %s again",
				rv.ID, len(rv.Indexes), len(rv.Subscriptions), err, rv.Principal)
		}
		tc = c
	}
	errs := signalRevoke(ctx, tc, rv.Subscriptions, fmt.Sprintf("revocation/%d", rv.ID), fmt.Sprintf("revocation %d %s", rv.ID, *reason))
	var failures []string
	ids := make([]int64, 0, len(rv.Subscriptions))
	for i, err := range errs {
		if err != nil {
			j.Subscriptions[i].SignalError = err.Error()
			failures = append(failures, rv.Subscriptions[i].WorkflowID)
			continue
		}
		ids = append(ids, rv.Subscriptions[i].SubscriptionID)
	}
	states, err := waitClosing(ctx, st, ids, *wait)
	if err != nil {
		return err
	}
	open := 0
	for i := range j.Subscriptions {
		s, ok := states[j.Subscriptions[i].SubscriptionID]
		if ok {
			j.Subscriptions[i].State = s
			if !s.Closing() {
				open++
			}
		}
	}
	if *asJSON {
		if err := writeJSON(e.Stdout, j); err != nil {
			return err
		}
	} else {
		names := make([]string, len(j.Indexes))
		for i, ix := range j.Indexes {
			names[i] = fmt.Sprintf("%s (%d entries)", ix.Index, ix.Entries)
		}
		fmt.Fprintf(e.Stdout, "revocation %d: %d grant(s) of %s revoked; %d subscription(s) told to close; %d index(es) invalidated: %s\n",
			rv.ID, len(rv.Grants), rv.Principal, len(rv.Subscriptions), len(j.Indexes), orDash(strings.Join(names, ", ")))
	}
	switch {
	case len(failures) > 0:
		return fmt.Errorf("revocation %d stands (no content is readable), but %d subscription workflow(s) could not be signalled (%s); run mcpsync revoke %s again or mcpsync reconcile",
			rv.ID, len(failures), strings.Join(failures, ", "), rv.Principal)
	case *wait > 0 && open > 0:
		return fmt.Errorf("revocation %d stands (no content is readable), but %d subscription(s) had not passed the close fence after %s", rv.ID, open, *wait)
	}
	return nil
}

// signalRevoke tells each subscription's workflow to pass the close fence; errs[i] is the
// outcome for subs[i]. The signal ID makes a repeated signal a no-op in the workflow.
func signalRevoke(ctx context.Context, tc signaler, subs []ledger.RevokedSubscription, id, reason string) []error {
	errs := make([]error, len(subs))
	sem := make(chan struct{}, signalParallelism)
	var wg sync.WaitGroup
	for i, s := range subs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := tc.SignalWorkflow(ctx, s.WorkflowID, "", contract.SignalRevoke, contract.Unsubscribe{ID: id, Reason: strings.TrimSpace(reason)})
			var nf *serviceerror.NotFound
			if errors.As(err, &nf) {
				err = fmt.Errorf("workflow %s is not running", s.WorkflowID)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errs
}

// signaler is the part of the Temporal client revoke uses.
type signaler interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// waitClosing polls the ledger until every subscription in ids has passed the close fence or
// the timeout passes, and returns their last states.
func waitClosing(ctx context.Context, st *ledger.Store, ids []int64, timeout time.Duration) (map[int64]mcpsync.State, error) {
	deadline := time.Now().Add(timeout)
	for {
		states, err := st.SubscriptionStates(ctx, ids)
		if err != nil {
			return nil, err
		}
		done := true
		for _, s := range states {
			done = done && s.Closing()
		}
		if done || !time.Now().Before(deadline) {
			return states, nil
		}
		select {
		case <-ctx.Done():
			return states, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func revocationCmd(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync revocation ID [--json]"
	fs := flag.NewFlagSet("revocation", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "ID")
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || id <= 0 {
		return usageErr("revocation ID %q is not a number above 0 (usage: %s)", pos[0], usage)
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	rv, err := revocationByID(ctx, st, id)
	if err != nil {
		return err
	}
	source := ""
	if rv.SourceID != nil {
		if s, err := st.SourceByID(ctx, *rv.SourceID); err == nil {
			source = s.Name
		}
	}
	j := toRevocationJSON(rv, source)
	ids := make([]int64, len(rv.Subscriptions))
	for i, s := range rv.Subscriptions {
		ids[i] = s.SubscriptionID
	}
	states, err := st.SubscriptionStates(ctx, ids)
	if err != nil {
		return err
	}
	for i := range j.Subscriptions {
		j.Subscriptions[i].State = states[j.Subscriptions[i].SubscriptionID]
	}
	if *asJSON {
		return writeJSON(e.Stdout, j)
	}
	fmt.Fprintf(e.Stdout, "revocation %d of %s on %s at %s: %s\n", j.Revocation, j.Principal, orDash(source),
		j.RevokedAt.Format(time.RFC3339), orDash(j.Reason))
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tENTRIES\tOUTBOX KEY\tCONSUMERS DONE")
	for _, ix := range j.Indexes {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", ix.Index, ix.Entries, ix.OutboxKey, orDash(strings.Join(ix.AckedConsumers, ",")))
	}
	fmt.Fprintln(tw, "SUBSCRIPTION\tSOURCE\tURI\tAT REVOCATION\tNOW")
	for _, s := range j.Subscriptions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.WorkflowID, s.Source, s.URI, s.StateAtRevocation, s.State)
	}
	return tw.Flush()
}

// revocationByID returns revocation id, or a not-found error (exit 3) that says there is none.
func revocationByID(ctx context.Context, st *ledger.Store, id int64) (ledger.Revocation, error) {
	rv, err := st.RevocationByID(ctx, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return rv, notFoundErr("no revocation %d", id)
	}
	return rv, err
}
