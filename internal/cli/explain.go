package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"explain", "SOURCE URI [--principal P] [--ordinal N] [--json]: why this is (or is not) the current version: " +
		"the subscription's timeline from the ledger (exit 3: no such subscription or read)", explain})
}

// explainLimits is what --help says a timeline can and cannot show (issue 17 part 4).
const explainLimits = `The timeline is read from the ledger alone, in one consistent snapshot, ordered by time, then
read ordinal (a time is its transaction's start; the subscription's receipts keep the order
their fences decided in). It shows: the source's sessions; notifications that routed nothing
(old session, out of order, after close, malformed URI) and queue overflows, from their audit
receipts; each dispatch (ordinal, request ID, reason, session, its answer or "no answer
recorded") and each refused allocation; each answer's receipt: ACCEPTED with the version's
digest, size, MIME type, server name and version and the watermark before -> after, REVALIDATED,
TOO_LARGE, TOMBSTONE_PENDING, and every refusal (STALE with the watermark and the read that set
it, STALE_AFTER_CLOSE, OLD_SESSION, DUPLICATE, REVOKED, ...); the subscription's outbox rows
with the named consumers whose committed offset has passed each, and those that have not; guard
verdicts on the accepted digests; the derived indexes that took each version (lineage) and their
invalidation; revocations; state transitions, the close fence, tombstone probes, confirmations
and refusals.

It cannot show: each notification routed to the subscription (the ledger keeps only the last
(session generation, sequence) pair it recorded, shown in the header) nor which notification
caused a "notification" read; when a consumer read a row (only whether its offset has passed
it); the server's version for a refused answer (the session's capability receipt is shown,
marked "(session's)"); what happens inside the worker between steps (see the Temporal UI).
--ordinal N keeps the events of read N and what followed from it: its dispatch, answers, outbox
row, guard verdict, lineage, tombstone steps, and the STALE refusals its watermark caused.`

// explainJSON is what explain --json prints: the ledger's timeline with the current version
// in the CLI's JSON spelling.
type explainJSON struct {
	ledger.Timeline
	Current *versionJSON `json:"current,omitempty"`
}

// versionJSON is an accepted version as explain --json prints it.
type versionJSON struct {
	VersionID         int64     `json:"versionId"`
	Kind              string    `json:"kind"`
	ReadOrdinal       int64     `json:"readOrdinal"`
	Generation        int64     `json:"generation"`
	SessionGeneration int64     `json:"sessionGeneration"`
	RequestID         string    `json:"requestId"`
	Digest            string    `json:"digest,omitempty"`
	MIMEType          string    `json:"mimeType,omitempty"`
	Size              int64     `json:"size"`
	ServerName        string    `json:"serverName,omitempty"`
	ServerVersion     string    `json:"serverVersion,omitempty"`
	AcceptedAt        time.Time `json:"acceptedAt"`
}

func explain(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync explain SOURCE URI [--principal P] [--ordinal N] [--json]"
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	principal := fs.String("principal", "default", "principal the subscription is for")
	ordinal := fs.Int64("ordinal", 0, "only read N and what followed from it")
	asJSON := fs.Bool("json", false, "print the typed timeline as JSON")
	t, err := parseTarget(fs, args, usage, principal)
	var h *helpRequest
	if errors.As(err, &h) {
		h.flags += "\n" + explainLimits + "\n"
		return h
	}
	if err != nil {
		return err
	}
	if isSet(fs, "ordinal") && *ordinal <= 0 {
		return usageErr("--ordinal must be a read ordinal above 0, got %d", *ordinal)
	}
	st, src, err := e.storeSource(ctx, t.source)
	if err != nil {
		return err
	}
	tl, err := st.Explain(ctx, ledger.ExplainRequest{Principal: *principal, Source: src.Name, URI: t.uri, Ordinal: *ordinal})
	if errors.Is(err, ledger.ErrNotFound) {
		return explainNotFound(ctx, st, *principal, src.Name, t.uri, *ordinal)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		out := explainJSON{Timeline: tl}
		if v := tl.Current; v != nil {
			out.Current = &versionJSON{VersionID: v.ID, Kind: v.Kind, ReadOrdinal: v.ReadOrdinal, Generation: v.Generation,
				SessionGeneration: v.SessionGeneration, RequestID: v.RequestID, Digest: v.Digest, MIMEType: v.MIMEType,
				Size: v.Size, ServerName: v.ServerName, ServerVersion: v.ServerVersion, AcceptedAt: v.AcceptedAt.UTC()}
		}
		return writeJSON(e.Stdout, out)
	}
	return writeTimeline(e.Stdout, tl)
}

// explainNotFound says what is missing: the read asked for, or the subscription (naming the
// principals that do hold one, so the right --principal is one look away).
func explainNotFound(ctx context.Context, st *ledger.Store, principal, source, uri string, ordinal int64) error {
	if sub, err := st.SubscriptionByKey(ctx, principal, source, uri); err == nil && ordinal > 0 {
		return notFoundErr("no read with ordinal %d of %s on %s for %s (last issued ordinal %d)", ordinal, uri, source, principal, sub.LastIssuedOrdinal)
	}
	others, err := st.ListSubscriptions(ctx, ledger.SubscriptionFilter{Source: source, URI: uri})
	if err != nil {
		return err
	}
	var names []string
	for _, s := range others {
		names = append(names, s.Principal)
	}
	if len(names) > 0 {
		return notFoundErr("no subscription of %s to %s on %s (subscribed by: %s; give --principal)", principal, uri, source, strings.Join(names, ", "))
	}
	return notFoundErr("no subscription of %s to %s on %s", principal, uri, source)
}

// writeTimeline prints the header, the "why" lines and the timeline table. Every cell goes
// through visible: server names, versions, MIME types and reasons are the server's words.
func writeTimeline(w io.Writer, tl ledger.Timeline) error {
	var b strings.Builder
	line := func(format string, args ...any) { b.WriteString(visible(fmt.Sprintf(format, args...)) + "\n") }
	line("%s %s for %s (subscription %d, workflow %s)", tl.Source, tl.URI, tl.Principal, tl.SubscriptionID, tl.WorkflowID)
	state := string(tl.State)
	if tl.StateReason != "" {
		state += " (" + tl.StateReason + ")"
	}
	fence := ""
	if tl.CloseOrdinal != nil {
		fence = fmt.Sprintf(", close fence at ordinal %d", *tl.CloseOrdinal)
	}
	line("state %s, generation %d, session %d; watermark %d, last issued ordinal %d%s", state, tl.Generation,
		tl.SessionGeneration, tl.Watermark, tl.LastIssuedOrdinal, fence)
	if tl.LastNotificationSeq > 0 || tl.LastNotificationGen > 0 {
		line("last notification recorded: session %d seq %d (routed notifications are kept only as this last pair)",
			tl.LastNotificationGen, tl.LastNotificationSeq)
	} else {
		line("no notification recorded for it")
	}
	if v := tl.Current; v != nil && v.Kind == "content" {
		from := ""
		if s := explainServer(v.ServerName, v.ServerVersion); s != "-" {
			from = " from " + s
		}
		line("current version: ordinal %d %s (%s, %d B)%s, accepted %s; last verified %s", v.ReadOrdinal, v.Digest,
			orDash(v.MIMEType), v.Size, from, fmtMillis(v.AcceptedAt), fmtMillisPtr(tl.LastVerifiedAt))
	} else if v != nil {
		line("current version: tombstone at ordinal %d, accepted %s", v.ReadOrdinal, fmtMillis(v.AcceptedAt))
	} else {
		line("current version: none accepted")
	}
	for _, why := range whyLines(tl) {
		line("why: %s", why)
	}
	if tl.Ordinal > 0 {
		line("showing read %d and what followed from it", tl.Ordinal)
	}
	b.WriteString("\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tORD\tEVENT\tDETAIL")
	for _, ev := range tl.Events {
		ord := "-"
		if ev.Ordinal > 0 {
			ord = fmt.Sprintf("%d", ev.Ordinal)
		}
		label, detail := describe(ev)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", fmtMillis(ev.At), ord, visible(label), visible(detail))
	}
	return tw.Flush()
}

// whyLines says, from the timeline, why the current version is what it is.
func whyLines(tl ledger.Timeline) []string {
	var out []string
	refused, unanswered := tl.RefusedAnswers, tl.UnansweredDispatches
	switch v := tl.Current; {
	case v == nil:
		out = append(out, "no read has been accepted yet")
	case v.Kind != "content":
		out = append(out, fmt.Sprintf("the resource was deleted: a tombstone at ordinal %d is the newest version", v.ReadOrdinal))
	default:
		out = append(out, fmt.Sprintf("ordinal %d is the newest read the acceptance point accepted with new content", v.ReadOrdinal))
		if tl.Watermark > v.ReadOrdinal {
			out = append(out, fmt.Sprintf("reads up to ordinal %d passed the fence without a new version (REVALIDATED, TOO_LARGE or TOMBSTONE_PENDING)", tl.Watermark))
		}
	}
	if len(refused) > 0 {
		kinds := make([]string, 0, len(refused))
		for k, n := range refused {
			kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
		}
		sort.Strings(kinds)
		out = append(out, "answers refused: "+strings.Join(kinds, ", ")+" (each kept only its receipt)")
	}
	if unanswered > 0 {
		out = append(out, fmt.Sprintf("%d dispatched read(s) have no answer recorded", unanswered))
	}
	if tl.CloseOrdinal != nil {
		out = append(out, fmt.Sprintf("the close fence at ordinal %d refuses every later answer (STALE_AFTER_CLOSE)", *tl.CloseOrdinal))
	} else if tl.State != mcpsync.StateActive {
		out = append(out, fmt.Sprintf("state %s: no read is accepted until it is ACTIVE again", tl.State))
	}
	if !tl.Published {
		out = append(out, "not published under the roll-out: consumers skip its versions (see mcpsync rollout status)")
	}
	return out
}

// describe returns the EVENT and DETAIL cells of one event.
func describe(e ledger.TimelineEvent) (label, detail string) {
	var d []string
	add := func(format string, args ...any) { d = append(d, fmt.Sprintf(format, args...)) }
	label = e.Outcome
	switch e.Kind {
	case ledger.EventSession:
		add("session %d", e.SessionGeneration)
		if e.ServerName != "" || e.ServerVersion != "" {
			add("server %s", explainServer(e.ServerName, e.ServerVersion))
		}
		if e.Reason != "" {
			add("reason: %s", e.Reason)
		}
	case ledger.EventNotification:
		add("session %d seq %d routed nothing", e.SessionGeneration, e.NotificationSeq)
		if e.Reason != "" {
			add("%s", e.Reason)
		}
	case ledger.EventTransition:
		if e.State != "" {
			add("state %s", e.State)
		}
		if e.Generation > 0 {
			add("generation %d", e.Generation)
		}
		if e.Reason != "" {
			add("%s", e.Reason)
		}
	case ledger.EventDispatch:
		label = "dispatch"
		add("reason %s, request %s, session %d, generation %d", e.ReadReason, e.RequestID, e.SessionGeneration, e.Generation)
		if e.Unanswered {
			add("no answer recorded")
		} else {
			add("answered %s at %s", e.Outcome, fmtMillisPtr(e.CompletedAt))
		}
	case ledger.EventDispatchRefused:
		label = "dispatch refused: " + e.Outcome
		add("no ordinal issued (reason %s, request %s, session %d, state %s)", e.ReadReason, e.RequestID, e.SessionGeneration, orDash(e.State))
	case ledger.EventAnswer:
		if e.Digest != "" {
			add("%s", shortDigest(e.Digest))
		}
		if e.MIMEType != "" || e.Size > 0 {
			add("%s %d B", orDash(e.MIMEType), e.Size)
		}
		if e.ServerName != "" || e.ServerVersion != "" {
			src := explainServer(e.ServerName, e.ServerVersion)
			if e.ServerFromSession {
				src += " (session's)"
			}
			add("from %s", src)
		}
		add("request %s, session %d", e.RequestID, e.SessionGeneration)
		switch {
		case e.WatermarkAfter != nil:
			add("watermark %d -> %d", derefOrdinal(e.WatermarkBefore), *e.WatermarkAfter)
		case e.Outcome == string(mcpsync.OutcomeStale) && e.FencedBy > 0:
			add("refused: ordinal not above watermark %d (set by read %d)", derefOrdinal(e.WatermarkBefore), e.FencedBy)
		case e.Outcome == string(mcpsync.OutcomeStale) && e.WatermarkBefore != nil:
			add("refused: the subscription was %s, not ACTIVE; watermark was %d", orDash(e.State), *e.WatermarkBefore)
		case e.WatermarkBefore != nil:
			add("refused: %s; watermark was %d", refusalWhy[e.Outcome], *e.WatermarkBefore)
		}
		if e.VersionID > 0 {
			add("version %d", e.VersionID)
		}
		add("receipt %d", e.ReceiptID)
	case ledger.EventTombstoneProbe:
		add("not found again (session %d, request %s)", e.SessionGeneration, e.RequestID)
	case ledger.EventOutbox:
		label = "outbox " + e.OutboxKind
		add("row %d", e.OutboxID)
		if e.Digest != "" {
			add("%s", shortDigest(e.Digest))
		}
		if e.Shadow {
			add("shadow: consumers skip it (roll-out)")
		}
		add("passed by: %s", namesOrNone(e.ConsumersPassed))
		if len(e.ConsumersPending) > 0 {
			add("not yet: %s", namesOrNone(e.ConsumersPending))
		}
	case ledger.EventTombstone:
		if e.CatalogID > 0 {
			add("catalog %d", e.CatalogID)
		}
		if e.Reason != "" {
			add("%s", e.Reason)
		}
		if e.VersionID > 0 {
			add("tombstone version %d", e.VersionID)
		}
		if e.CloseOrdinal != nil {
			add("close fence at ordinal %d", *e.CloseOrdinal)
		}
	case ledger.EventCloseFence:
		add("close ordinal %d, epoch %d: later answers are STALE_AFTER_CLOSE", derefOrdinal(e.CloseOrdinal), e.CloseEpoch)
		if e.Reason != "" {
			add("reason: %s", e.Reason)
		}
	case ledger.EventGuardVerdict:
		label = "guard " + e.Outcome
		add("%s under %s", shortDigest(e.Digest), e.Policy)
		if e.DeliveredDigest != "" && e.DeliveredDigest != e.Digest {
			add("delivers %s", shortDigest(e.DeliveredDigest))
		}
		if len(e.Reasons) > 0 {
			add("%s", strings.Join(e.Reasons, "; "))
		}
	case ledger.EventLineage:
		label = "index took"
		add("index %s took version %d (%s) %d time(s), last %s", e.Index, e.VersionID, shortDigest(e.Digest), e.Takes, fmtMillisPtr(e.LastTakenAt))
	case ledger.EventIndexInvalidate:
		label = "index invalidated"
		add("revocation %d invalidated index %s's entry of version %d", e.RevocationID, e.Index, e.VersionID)
		if e.OutboxID > 0 {
			add("outbox row %d passed by: %s", e.OutboxID, namesOrNone(e.ConsumersPassed))
		}
	case ledger.EventRevocation:
		add("revocation %d, state then %s", e.RevocationID, e.State)
		if e.Reason != "" {
			add("reason: %s", e.Reason)
		}
	}
	return label, strings.Join(d, "; ")
}

// shortDigest keeps the algorithm and the first 12 hex digits of a digest.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok || len(hex) <= 12 {
		return d
	}
	return algo + ":" + hex[:12] + "…"
}

func explainServer(name, version string) string {
	s := strings.TrimSpace(name + " " + version)
	return orDash(s)
}

func namesOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func derefOrdinal(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// refusalWhy says in words why the acceptance point refused an answer (reads.go, refusalCTEs).
var refusalWhy = map[string]string{
	string(mcpsync.OutcomeStale):           "ordinal not above the watermark",
	string(mcpsync.OutcomeStaleAfterClose): "answered after the close fence (R19)",
	string(mcpsync.OutcomeOldSession):      "sent on an older session generation (R12)",
	string(mcpsync.OutcomeOldGeneration):   "sent for an older subscription generation (R12)",
	string(mcpsync.OutcomeNotDispatched):   "no such dispatch",
	string(mcpsync.OutcomeDuplicate):       "the dispatch already had its answer",
	string(mcpsync.OutcomeRevoked):         "the principal's grant was revoked (R23)",
}

// fmtMillis is a timeline time: UTC with milliseconds.
func fmtMillis(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

func fmtMillisPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return fmtMillis(*t)
}
