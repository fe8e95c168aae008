package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/launch"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"subscribe", "SOURCE URI [URI...] [--uris-file F] [--parallel 16] [--window 200] [--principal P] [--wait 20s] [--json]: subscribe (idempotent) and wait until ACTIVE; many URIs at once with a summary", subscribe})
	register(command{"unsubscribe", "SOURCE URI [--principal P] [--wait 20s] [--json]: pass the close fence and unsubscribe", unsubscribe})
	register(command{"status", "[SOURCE [URI]] [--principal P] [--json]: state, generations, ordinals, digest of subscriptions", status})
}

// subscribeOne subscribes one URI (the single-URI form of mcpsync subscribe) and waits up to
// wait for it to become ACTIVE.
func subscribeOne(ctx context.Context, e *runEnv, t subTarget, principal *string, wait *time.Duration, asJSON *bool) error {
	norm := t.uri
	st, src, err := e.storeLiveSource(ctx, t.source)
	if err != nil {
		return err
	}
	if err := st.CheckGrant(ctx, *principal, src.ID); err != nil {
		return deniedErr(err, src.Name)
	}
	tc, err := e.temporal(ctx)
	if err != nil {
		return err
	}
	if *wait > 0 {
		// Nothing would ever run the workflow: say so now instead of after the whole wait.
		if err := awaitWorker(ctx, tc); err != nil {
			return err
		}
	}
	wfID := contract.SubscriptionWorkflowID(*principal, src.Name, norm)
	// A CLOSED row (unsubscribed, or its resource deleted) is the previous generation: the run
	// started below opens the next one (ledger.EnsureSubscription), so wait for that one and
	// never take the old close for the answer. The run that closed it may still be finishing
	// (settling late reads); a start now would join it, so let it end first.
	var closedGen int64
	if prev, err := st.SubscriptionByKey(ctx, *principal, src.Name, norm); err == nil && prev.State == mcpsync.StateClosed {
		closedGen = prev.Generation
		if err := awaitEndedRun(ctx, tc, wfID, *wait); err != nil {
			return err
		}
	} else if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return err
	}
	run, err := launch.Subscription(ctx, tc, e.Config.Namespace, wfID, contract.SubscriptionInput{
		Principal: *principal, Source: src.Name, SourceID: src.ID, URI: norm, ServerURI: t.raw,
		BackstopSeconds: src.BackstopSeconds, PollSeconds: src.PollSeconds,
	})
	if err != nil {
		return fmt.Errorf("starting subscription workflow %s: %w", wfID, err)
	}
	// RECONCILIATION_REQUIRED is not final: the workflow re-establishes on the live session (its
	// reason may even be left from before the worker restarted), so wait for ACTIVE or a close.
	sub, err := waitFor(ctx, st, *principal, src.Name, norm, *wait, func(s ledger.Subscription) bool {
		return s.WorkflowID == wfID && s.Generation > closedGen && (s.State == mcpsync.StateActive || s.State.Closing())
	})
	if *wait == 0 && (errors.Is(err, ledger.ErrNotFound) || (err == nil && sub.Generation <= closedGen)) {
		// The workflow has not written (or reopened) its ledger row yet: it starts DISCOVERED.
		if *asJSON {
			return writeJSON(e.Stdout, statusJSON{Source: src.Name, URI: norm, ServerURI: t.raw, Principal: *principal,
				State: mcpsync.StateDiscovered, WorkflowID: wfID})
		}
		fmt.Fprintf(e.Stdout, "subscription workflow %s started (run %s)\n", wfID, run.GetRunID())
		return nil
	}
	if errors.Is(err, ledger.ErrNotFound) {
		return fmt.Errorf("workflow %s has not written its subscription to the ledger after %s; is mcpsync-worker healthy?", wfID, *wait)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(e.Stdout, statusOf(ctx, st, sub)); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.Stdout, "%s %s %s: %s (generation %d, session %d, workflow %s)\n",
			visible(sub.SourceName), sub.URI, visible(sub.Principal), sub.State, sub.Generation, sub.SessionGeneration, sub.WorkflowID)
	}
	switch {
	case sub.State == mcpsync.StateActive:
		return nil
	case sub.Generation <= closedGen:
		return fmt.Errorf("not reopened after %s: workflow %s has not opened the generation after %d (%s) yet", *wait, wfID, sub.Generation, sub.State)
	case sub.State == mcpsync.StateClosed:
		return fmt.Errorf("subscription closed again in generation %d (%s)", sub.Generation, sub.StateReason)
	case sub.State.Closing():
		return fmt.Errorf("subscription is closing (%s: %s); subscribe again once it is CLOSED", sub.State, sub.StateReason)
	case *wait == 0:
		return nil
	default:
		return fmt.Errorf("not ACTIVE after %s: %s %s%s", *wait, sub.State, orDash(sub.StateReason), sourceNotLive(ctx, st, src))
	}
}

// sourceNotLive is what keeps subscriptions of src from becoming ACTIVE when its session is
// not live — "; source NAME: " and the health line status prints (its state, reconnects, next
// attempt, last error) — or "" when a host holds it LIVE (or the ledger did not answer).
func sourceNotLive(ctx context.Context, st *ledger.Store, src ledger.Source) string {
	h, err := st.SourceHealth(ctx, src.ID)
	if err != nil || (h.Reported && h.Held && h.State == ledger.HealthLive) {
		return ""
	}
	return "; source " + visible(src.Name) + ": " + toHealthJSON(h).line(time.Now())
}

// awaitEndedRun waits up to timeout for a running run of workflow wfID to end, so that a new
// run can be started in its place; without a running run it returns at once.
func awaitEndedRun(ctx context.Context, tc client.Client, wfID string, timeout time.Duration) error {
	err := launch.AwaitEndedRun(ctx, tc, wfID, timeout)
	if errors.Is(err, launch.ErrStillRunning) {
		return fmt.Errorf("the run of %s that closed the subscription is still finishing after %s; subscribe again once it has ended", wfID, timeout)
	}
	return err
}

// waitFor polls the ledger until done(subscription) or the timeout; it returns the last view.
func waitFor(ctx context.Context, st *ledger.Store, principal, source, norm string, timeout time.Duration, done func(ledger.Subscription) bool) (ledger.Subscription, error) {
	deadline := time.Now().Add(timeout)
	for {
		sub, err := st.SubscriptionByKey(ctx, principal, source, norm)
		if err != nil && !errors.Is(err, ledger.ErrNotFound) {
			return sub, err
		}
		if err == nil && done(sub) {
			return sub, nil
		}
		if !time.Now().Before(deadline) {
			return sub, err
		}
		select {
		case <-ctx.Done():
			return sub, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func unsubscribe(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync unsubscribe SOURCE URI [--principal P] [--wait 20s] [--json]"
	fs := flag.NewFlagSet("unsubscribe", flag.ContinueOnError)
	principal := fs.String("principal", "default", "principal the subscription is for")
	wait := fs.Duration("wait", 20*time.Second, "how long to wait for CLOSED (0: do not wait)")
	asJSON := fs.Bool("json", false, "print JSON")
	t, err := parseTarget(fs, args, usage, principal)
	if err != nil {
		return err
	}
	if err := nonNegative("wait", *wait); err != nil {
		return err
	}
	norm := t.uri
	st, src, err := e.storeSource(ctx, t.source)
	if err != nil {
		return err
	}
	sub, err := st.SubscriptionByKey(ctx, *principal, src.Name, norm)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundErr("no subscription of %s to %s on %s", *principal, norm, src.Name)
	}
	if err != nil {
		return err
	}
	if sub.State != mcpsync.StateClosed {
		tc, err := e.temporal(ctx)
		if err != nil {
			return err
		}
		err = tc.SignalWorkflow(ctx, sub.WorkflowID, "", contract.SignalUnsubscribe, contract.Unsubscribe{ID: newID(), Reason: "requested by mcpsync unsubscribe"})
		var nf *serviceerror.NotFound
		if errors.As(err, &nf) {
			return fmt.Errorf("subscription workflow %s is not running while the ledger says %s; run mcpsync reconcile %s", sub.WorkflowID, sub.State, src.Name)
		}
		if err != nil {
			return fmt.Errorf("signalling %s: %w", sub.WorkflowID, err)
		}
		if *wait == 0 {
			if *asJSON { // the state before the close fence: the workflow passes it next
				return writeJSON(e.Stdout, statusOf(ctx, st, sub))
			}
			fmt.Fprintf(e.Stdout, "%s %s %s: unsubscribe requested (workflow %s)\n", sub.SourceName, sub.URI, sub.Principal, sub.WorkflowID)
			return nil
		}
		sub, err = waitFor(ctx, st, *principal, src.Name, norm, *wait, func(s ledger.Subscription) bool { return s.State == mcpsync.StateClosed })
		if err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(e.Stdout, statusOf(ctx, st, sub))
	}
	fmt.Fprintf(e.Stdout, "%s %s %s: %s (close ordinal %s, epoch %d)%s\n", visible(sub.SourceName), sub.URI, visible(sub.Principal),
		sub.State, ordinalOrDash(sub.CloseOrdinal), sub.CloseEpoch, visible(reasonSuffix(sub)))
	if !sub.State.Closing() {
		return fmt.Errorf("close fence not passed after %s (state %s)", *wait, sub.State)
	}
	return nil
}

func ordinalOrDash(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func reasonSuffix(s ledger.Subscription) string {
	if s.StateReason == "" {
		return ""
	}
	return ": " + s.StateReason
}

// statusJSON is one subscription as status reports it.
type statusJSON struct {
	Source              string        `json:"source"`
	URI                 string        `json:"uri"`
	ServerURI           string        `json:"serverUri"`
	Principal           string        `json:"principal"`
	State               mcpsync.State `json:"state"`
	Reason              string        `json:"reason,omitempty"`
	WorkflowID          string        `json:"workflowId"`
	Generation          int64         `json:"generation"`
	SessionGeneration   int64         `json:"sessionGeneration"`
	LastIssuedOrdinal   int64         `json:"lastIssuedOrdinal"`
	LastAcceptedOrdinal int64         `json:"lastAcceptedOrdinal"`
	CloseOrdinal        *int64        `json:"closeOrdinal,omitempty"`
	CloseEpoch          int64         `json:"closeEpoch"`
	Digest              string        `json:"digest,omitempty"`
	MIMEType            string        `json:"mimeType,omitempty"`
	Size                int64         `json:"size,omitempty"`
	AcceptedAt          *time.Time    `json:"acceptedAt,omitempty"`
	VerifiedAt          *time.Time    `json:"verifiedAt,omitempty"`
	Deleted             bool          `json:"deleted,omitempty"`
	// Refresh is how the subscription learns of changes: "notify" (resources.subscribe plus a
	// backstop re-read) or "poll" (jittered periodic reads, R11). StalenessBoundSeconds is the
	// longest a change can go unseen while the session is live: one refresh period plus jitter.
	// Watch is "not acknowledged" when the server left the URI out of its 2026-07-28
	// subscriptions/listen acknowledgement on the live session: it is not watched, so Refresh
	// is "poll" whatever the session's capabilities say (issue 13 item 3, R9, R11).
	Refresh               string `json:"refresh,omitempty"`
	StalenessBoundSeconds int    `json:"stalenessBoundSeconds,omitempty"`
	Watch                 string `json:"watch,omitempty"`
	// SourceHealth is the health of the subscription's source (status only; issue 14, item 2).
	SourceHealth *healthJSON `json:"sourceHealth,omitempty"`
}

// watchNotAcknowledged is statusJSON.Watch for a URI the server left out of its listen
// acknowledgement.
const watchNotAcknowledged = "not acknowledged"

func statusOf(ctx context.Context, st *ledger.Store, s ledger.Subscription) statusJSON {
	j := statusJSON{
		Source: s.SourceName, URI: s.URI, ServerURI: s.ServerURI, Principal: s.Principal, State: s.State,
		Reason: s.StateReason, WorkflowID: s.WorkflowID, Generation: s.Generation, SessionGeneration: s.SessionGeneration,
		LastIssuedOrdinal: s.LastIssuedOrdinal, LastAcceptedOrdinal: s.LastAcceptedOrdinal,
		CloseOrdinal: s.CloseOrdinal, CloseEpoch: s.CloseEpoch, Digest: s.LastAcceptedDigest,
		AcceptedAt: s.LastAcceptedAt, VerifiedAt: s.LastVerifiedAt,
	}
	if v, err := st.LatestVersion(ctx, s.ID); err == nil {
		j.MIMEType, j.Size, j.Deleted = v.MIMEType, v.Size, v.Kind == outboxTombstone
	}
	if s.State == mcpsync.StateActive || s.State == mcpsync.StateTombstonePending {
		if sess, err := st.CurrentSession(ctx, s.SourceID); err == nil && sess.Generation == s.SessionGeneration {
			if src, err := st.SourceByID(ctx, s.SourceID); err == nil {
				period := src.PollSeconds
				j.Refresh = "poll"
				switch {
				case s.NotAcknowledged: // left out of the listen ack: never real-time (R11)
					j.Watch = watchNotAcknowledged
				case sess.Caps.Subscribe:
					period, j.Refresh = src.BackstopSeconds, "notify"
				}
				j.StalenessBoundSeconds = period + (period+4)/5 // the jitter spreads a period over ±20 %
			}
		}
	}
	return j
}

func status(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync status [SOURCE [URI]] [--principal P] [--json]"
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	principal := fs.String("principal", "", "only this principal")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "[SOURCE]", "[URI]")
	if err != nil {
		return err
	}
	f := ledger.SubscriptionFilter{Principal: *principal}
	if len(pos) == 2 {
		if f.URI, err = normalizeURI(pos[1]); err != nil {
			return err
		}
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	// The sources shown, in order, each with its health line (issue 14, item 2).
	var shown []ledger.Source
	if len(pos) >= 1 {
		src, err := sourceNamed(ctx, st, pos[0])
		if err != nil {
			return err
		}
		f.Source = pos[0]
		shown = append(shown, src)
	}
	subs, err := st.ListSubscriptions(ctx, f)
	if err != nil {
		return err
	}
	if len(subs) == 0 && len(pos) == 2 {
		return notFoundErr("no subscription to %s on %s", f.URI, f.Source)
	}
	health, err := st.SourcesHealth(ctx)
	if err != nil {
		return err
	}
	var sources map[int64]ledger.Source
	if len(pos) == 0 {
		list, err := st.ListSources(ctx)
		if err != nil {
			return err
		}
		sources = make(map[int64]ledger.Source, len(list))
		for _, src := range list {
			sources[src.ID] = src
		}
	}
	out := make([]statusJSON, 0, len(subs))
	for _, s := range subs {
		j := statusOf(ctx, st, s)
		if h, ok := health[s.SourceID]; ok {
			j.SourceHealth = toHealthJSON(h)
		}
		// ListSubscriptions orders by source name: each source once.
		if len(pos) == 0 && (len(shown) == 0 || shown[len(shown)-1].ID != s.SourceID) {
			src, ok := sources[s.SourceID]
			if !ok { // added after the list
				src = ledger.Source{ID: s.SourceID, SourceSpec: ledger.SourceSpec{Name: s.SourceName}}
			}
			shown = append(shown, src)
		}
		out = append(out, j)
	}
	if *asJSON {
		return writeJSON(e.Stdout, out)
	}
	now := time.Now()
	for _, src := range shown {
		switch h, ok := health[src.ID]; {
		case src.RemovedAt != nil: // its last health is history
			fmt.Fprintf(e.Stdout, "source %s: REMOVED %s\n", visible(src.Name), removedWhen(src))
		case ok:
			fmt.Fprintf(e.Stdout, "source %s: %s\n", visible(src.Name), toHealthJSON(h).line(now))
		}
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tURI\tPRINCIPAL\tSTATE\tGEN\tSESSION\tISSUED\tACCEPTED\tDIGEST\tMIME\tACCEPTED AT\tFRESHNESS\tREASON")
	for _, s := range out {
		fresh := "-"
		if s.Refresh != "" {
			mode := s.Refresh
			if s.Watch != "" {
				mode += " (" + s.Watch + ")"
			}
			fresh = fmt.Sprintf("%s, stale <= %ds", mode, s.StalenessBoundSeconds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", visible(s.Source), s.URI, visible(s.Principal), s.State,
			s.Generation, s.SessionGeneration, s.LastIssuedOrdinal, s.LastAcceptedOrdinal, orDash(s.Digest),
			visible(orDash(s.MIMEType)), fmtTime(s.AcceptedAt), fresh, visible(orDash(s.Reason)))
	}
	return tw.Flush()
}
