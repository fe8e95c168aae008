package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Explain reads, from the ledger alone, why a subscription's current version is what it is
// (issue 17 part 4): every recorded step of its history as one typed timeline. It is
// read-only: one REPEATABLE READ, READ ONLY transaction, so every part of the timeline is of
// the same instant; it performs no guarded transition.
//
// What the ledger keeps, and so what a timeline can show:
//
//   - notifications: a notification routed to the subscription is not stored one by one; the
//     subscription row keeps only the last (session generation, sequence) pair recorded
//     (Timeline.LastNotificationGen/Seq). A notification that routed nothing (old session,
//     out of order, after close, malformed URI) and a notification queue overflow of the
//     source leave an audit receipt, shown as EventNotification. A dispatch of reason
//     "notification" does not record which sequence number caused it.
//   - sessions of the source since the subscription was first opened (EventSession).
//   - each dispatch from read_dispatches (ordinal, request ID, reason, session, its settled
//     outcome or none), and each refused allocation (EventDispatchRefused).
//   - each answer's receipt (EventAnswer): ACCEPTED (with the version's digest, size, MIME
//     type, server name and version, and the watermark before → after), REVALIDATED,
//     TOO_LARGE, TOMBSTONE_PENDING, and every refusal (STALE with the watermark that refused
//     it, STALE_AFTER_CLOSE, OLD_SESSION, DUPLICATE, ...). A refused answer's server version
//     is not stored; the session's (from its capability receipt) is shown instead.
//   - the invalidation outbox rows of the subscription, with the named consumers whose
//     committed offset has passed each (it records when a consumer passed, not when it read).
//   - guard verdicts on the accepted digests (stored per digest and policy, so a verdict may
//     predate this subscription's version when another read had the same bytes).
//   - derived-index lineage of the versions, their invalidation by a revocation, and the
//     revocations that closed the subscription.
//   - state transitions, the close fence, tombstone probes, confirmations and refusals.
//
// ErrNotFound when there is no subscription of (principal, source, uri), or no dispatch with
// the ordinal asked for.
func (s *Store) Explain(ctx context.Context, req ExplainRequest) (Timeline, error) {
	if req.Principal == "" || req.Source == "" || req.URI == "" || req.Ordinal < 0 {
		return Timeline{}, fmt.Errorf("ledger: explain %+v: %w", req, ErrInvalid)
	}
	var tl Timeline
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			tl, err = explainIn(ctx, tx, req)
			return err
		})
	if err != nil {
		return Timeline{}, fmt.Errorf("ledger: explain %s %s for %q: %w", req.Source, req.URI, req.Principal, err)
	}
	return tl, nil
}

// ExplainRequest names the subscription to explain; Ordinal, if above 0, narrows the events
// to that read and what followed from it.
type ExplainRequest struct {
	Principal string
	Source    string // source name
	URI       string // normalized
	Ordinal   int64
}

// EventKind classifies a timeline event.
type EventKind string

// Timeline event kinds.
const (
	EventSession         EventKind = "session"           // SESSION_OPENED / SESSION_ENDED of the source
	EventNotification    EventKind = "notification"      // an audit receipt of a notification that routed nothing, or an overflow
	EventTransition      EventKind = "transition"        // a state change of the subscription (or a keyed refusal of one)
	EventDispatch        EventKind = "dispatch"          // a read ordinal issued (read_dispatches)
	EventDispatchRefused EventKind = "dispatch_refused"  // an allocation refused: no ordinal
	EventAnswer          EventKind = "answer"            // the acceptance point's receipt for a read's answer
	EventTombstoneProbe  EventKind = "tombstone_probe"   // a repeated not-found read while TOMBSTONE_PENDING
	EventOutbox          EventKind = "outbox"            // an invalidation outbox row of the subscription
	EventTombstone       EventKind = "tombstone"         // a deletion confirmed or refused
	EventCloseFence      EventKind = "close_fence"       // the close fence passed (R18)
	EventGuardVerdict    EventKind = "guard_verdict"     // the output guard's verdict on an accepted digest
	EventLineage         EventKind = "lineage"           // a derived index took a version
	EventRevocation      EventKind = "revocation"        // a revocation told the subscription to close
	EventIndexInvalidate EventKind = "index_invalidated" // a revocation invalidated an index's lineage entry
)

// eventRank orders events of the same time and ordinal the way they happen within one statement.
var eventRank = map[EventKind]int{
	EventSession: 0, EventNotification: 1, EventTransition: 2, EventDispatch: 3, EventDispatchRefused: 3,
	EventAnswer: 4, EventTombstoneProbe: 4, EventTombstone: 4, EventOutbox: 5, EventCloseFence: 7,
	EventGuardVerdict: 8, EventLineage: 9, EventRevocation: 10, EventIndexInvalidate: 11,
}

// TimelineEvent is one recorded step. Which fields are set depends on Kind; zero fields were
// not recorded for it. Strings a server chose (ServerName, ServerVersion, MIMEType, Reason of
// a session end) are stored as SafeText and must be escaped for display.
type TimelineEvent struct {
	At                time.Time `json:"at"`
	Kind              EventKind `json:"kind"`
	Outcome           string    `json:"outcome,omitempty"` // receipt kind, dispatch or verdict outcome
	Ordinal           int64     `json:"ordinal,omitempty"` // the read ordinal it concerns
	Generation        int64     `json:"generation,omitempty"`
	SessionGeneration int64     `json:"sessionGeneration,omitempty"`
	RequestID         string    `json:"requestId,omitempty"`
	ReadReason        string    `json:"readReason,omitempty"` // why a read was dispatched
	Phase             string    `json:"phase,omitempty"`      // accept, not_found, too_large (refused answers)
	Digest            string    `json:"digest,omitempty"`
	VersionID         int64     `json:"versionId,omitempty"`
	Size              int64     `json:"size,omitempty"`
	MIMEType          string    `json:"mimeType,omitempty"`
	ServerName        string    `json:"serverName,omitempty"`
	ServerVersion     string    `json:"serverVersion,omitempty"`
	// ServerFromSession: ServerName/ServerVersion are the session's capability receipt, not
	// recorded with the answer itself.
	ServerFromSession bool   `json:"serverFromSession,omitempty"`
	WatermarkBefore   *int64 `json:"watermarkBefore,omitempty"`
	WatermarkAfter    *int64 `json:"watermarkAfter,omitempty"`
	// FencedBy: for a STALE refusal by the ordinal fence, the ordinal whose answer set the
	// watermark that refused it (0 when STALE means the subscription was not ACTIVE: State).
	FencedBy         int64      `json:"fencedBy,omitempty"`
	Unanswered       bool       `json:"unanswered,omitempty"` // a dispatch with no answer recorded
	CompletedAt      *time.Time `json:"completedAt,omitempty"`
	NotificationSeq  int64      `json:"notificationSeq,omitempty"`
	OutboxID         int64      `json:"outboxId,omitempty"`
	OutboxKind       string     `json:"outboxKind,omitempty"`
	Shadow           bool       `json:"shadow,omitempty"`
	ConsumersPassed  []string   `json:"consumersPassed,omitempty"`
	ConsumersPending []string   `json:"consumersPending,omitempty"`
	Index            string     `json:"index,omitempty"`
	Takes            int64      `json:"takes,omitempty"`
	LastTakenAt      *time.Time `json:"lastTakenAt,omitempty"`
	Policy           string     `json:"policy,omitempty"`
	Reasons          []string   `json:"reasons,omitempty"`
	DeliveredDigest  string     `json:"deliveredDigest,omitempty"`
	RevocationID     int64      `json:"revocationId,omitempty"`
	CloseOrdinal     *int64     `json:"closeOrdinal,omitempty"`
	CloseEpoch       int64      `json:"closeEpoch,omitempty"`
	CatalogID        int64      `json:"catalogId,omitempty"`
	State            string     `json:"state,omitempty"`  // the state the step left (or found)
	Reason           string     `json:"reason,omitempty"` // a state reason, refusal or session end reason
	ReceiptID        int64      `json:"receiptId,omitempty"`

	seq    int64     // tie-breaker: the row's id
	sortAt time.Time // At, or for the subscription's own receipts their commit order (see explainIn)
}

// Timeline is a subscription's state now and its recorded history, ordered by time, then
// read ordinal. A time is its statement's transaction start (now()); the subscription's own
// receipts (with the dispatches and outbox rows written with them) keep their commit order,
// the order their fences decided in, even where a transaction that started earlier committed
// later behind the subscription's row lock.
type Timeline struct {
	SubscriptionID      int64         `json:"subscriptionId"`
	Principal           string        `json:"principal"`
	Source              string        `json:"source"`
	URI                 string        `json:"uri"`
	ServerURI           string        `json:"serverUri"`
	WorkflowID          string        `json:"workflowId"`
	State               mcpsync.State `json:"state"`
	StateReason         string        `json:"stateReason,omitempty"`
	Generation          int64         `json:"generation"`
	SessionGeneration   int64         `json:"sessionGeneration"`
	LastIssuedOrdinal   int64         `json:"lastIssuedOrdinal"`
	Watermark           int64         `json:"watermark"` // last_accepted_ordinal
	CloseOrdinal        *int64        `json:"closeOrdinal,omitempty"`
	LastNotificationGen int64         `json:"lastNotificationGeneration"`
	LastNotificationSeq int64         `json:"lastNotificationSeq"`
	LastVerifiedAt      *time.Time    `json:"lastVerifiedAt,omitempty"`
	Published           bool          `json:"published"` // the roll-out publishes its versions (R30)
	Current             *Version      `json:"current,omitempty"`
	Ordinal             int64         `json:"onlyOrdinal,omitempty"` // the --ordinal filter, if any
	// RefusedAnswers counts the whole history's refused answers by outcome, and
	// UnansweredDispatches its dispatches with no answer recorded, whatever Ordinal keeps.
	RefusedAnswers       map[string]int  `json:"refusedAnswers,omitempty"`
	UnansweredDispatches int             `json:"unansweredDispatches,omitempty"`
	Events               []TimelineEvent `json:"events"`
}

// fenceKinds are the receipt kinds of an answer that passed the ordinal fence (only they raise
// the watermark, reads.go); refusedKinds those of an answer it refused.
var (
	fenceKinds = outcomeStrings(mcpsync.OutcomeAccepted, mcpsync.OutcomeRevalidated, mcpsync.OutcomeTombstonePending,
		mcpsync.OutcomeTooLarge)
	refusedKinds = outcomeStrings(mcpsync.OutcomeStale, mcpsync.OutcomeStaleAfterClose, mcpsync.OutcomeOldSession,
		mcpsync.OutcomeOldGeneration, mcpsync.OutcomeNotDispatched, mcpsync.OutcomeDuplicate, mcpsync.OutcomeRevoked)
)

func explainIn(ctx context.Context, tx pgx.Tx, req ExplainRequest) (Timeline, error) {
	sub, err := scanSubscription(tx.QueryRow(ctx, `SELECT `+subscriptionColumns+`
		FROM subscriptions s JOIN sources so ON so.id = s.source_id
		WHERE s.principal = $1 AND so.name = $2 AND s.uri = $3`, req.Principal, req.Source, req.URI))
	if err != nil {
		return Timeline{}, notFound(err, fmt.Sprintf("subscription of %q to %s on %s", req.Principal, req.URI, req.Source))
	}
	tl := Timeline{SubscriptionID: sub.ID, Principal: sub.Principal, Source: sub.SourceName, URI: sub.URI,
		ServerURI: sub.ServerURI, WorkflowID: sub.WorkflowID, State: sub.State, StateReason: sub.StateReason,
		Generation: sub.Generation, SessionGeneration: sub.SessionGeneration, LastIssuedOrdinal: sub.LastIssuedOrdinal,
		Watermark: sub.LastAcceptedOrdinal, CloseOrdinal: sub.CloseOrdinal, LastNotificationGen: sub.LastNotificationGen,
		LastNotificationSeq: sub.LastNotificationSeq, LastVerifiedAt: sub.LastVerifiedAt, Ordinal: req.Ordinal}
	if err := tx.QueryRow(ctx, `SELECT mcpsync_published($1)`, sub.WorkflowID).Scan(&tl.Published); err != nil {
		return Timeline{}, err
	}
	if req.Ordinal > 0 {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM read_dispatches WHERE subscription_id = $1 AND ordinal = $2)`,
			sub.ID, req.Ordinal).Scan(&exists); err != nil {
			return Timeline{}, err
		}
		if !exists {
			return Timeline{}, fmt.Errorf("no read with ordinal %d (last issued %d): %w", req.Ordinal, sub.LastIssuedOrdinal, ErrNotFound)
		}
	}

	// Versions, by ordinal: the answers' details and the current version.
	rows, err := tx.Query(ctx, `SELECT `+versionColumns+` FROM resource_versions WHERE subscription_id = $1 ORDER BY read_ordinal`, sub.ID)
	if err != nil {
		return Timeline{}, err
	}
	versions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Version, error) { return scanVersion(r) })
	if err != nil {
		return Timeline{}, err
	}
	byOrdinal := map[int64]Version{}
	for _, v := range versions {
		byOrdinal[v.ReadOrdinal] = v
	}
	if n := len(versions); n > 0 {
		cur := versions[n-1]
		tl.Current = &cur
	}

	// Sessions of the source: capability receipts, for answers without their own server info.
	type sessionInfo struct{ name, version string }
	sessions := map[int64]sessionInfo{}
	rows, err = tx.Query(ctx, `SELECT generation, server_name, server_version FROM sessions WHERE source_id = $1`, sub.SourceID)
	if err != nil {
		return Timeline{}, err
	}
	var gen int64
	var si sessionInfo
	if _, err := pgx.ForEachRow(rows, []any{&gen, &si.name, &si.version}, func() error {
		sessions[gen] = si
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	var events []TimelineEvent
	add := func(e TimelineEvent) { events = append(events, e) }

	// The subscription's receipts, with the watermark each found: the highest ordinal of the
	// earlier receipts that passed the fence (only those raise it, reads.go).
	rows, err = tx.Query(ctx, `
		SELECT id, kind, coalesce(generation, 0), coalesce(session_generation, 0), coalesce(read_ordinal, 0),
		       coalesce(request_id, ''), coalesce(digest, ''), coalesce(detail, '{}'::jsonb), created_at,
		       coalesce(max(read_ordinal) FILTER (WHERE kind = ANY($2)) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
		FROM receipts WHERE subscription_id = $1 ORDER BY id`, sub.ID, fenceKinds)
	if err != nil {
		return Timeline{}, err
	}
	var r struct {
		id, gen, sgen, ord int64
		kind, req, digest  string
		detail             []byte
		at                 time.Time
		before             int64
	}
	var firstAt *time.Time
	var boundTo []int64 // session generations the subscription's receipts name
	// A receipt's created_at is its transaction's start (now()); a transaction that started
	// earlier may commit later, behind the subscription's row lock. The receipts' ids are
	// their commit order (doc.go), so each sorts no earlier than the one before it: sortAt
	// rises by at least a microsecond along the ids. Dispatches and outbox rows written with a
	// receipt sort with it.
	var lastSort time.Time
	allocSort := map[int64]time.Time{}  // ordinal -> sort time of its ALLOCATED receipt
	outboxSort := map[int64]time.Time{} // outbox row -> sort time of the receipt that wrote it
	if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.kind, &r.gen, &r.sgen, &r.ord, &r.req, &r.digest, &r.detail, &r.at, &r.before}, func() error {
		if firstAt == nil {
			at := r.at
			firstAt = &at
		}
		if r.sgen != 0 && !slices.Contains(boundTo, r.sgen) {
			boundTo = append(boundTo, r.sgen)
		}
		sortAt := r.at
		if !lastSort.IsZero() && !sortAt.After(lastSort) {
			sortAt = lastSort.Add(time.Microsecond)
		}
		lastSort = sortAt
		var d receiptDetail
		if err := json.Unmarshal(r.detail, &d); err != nil {
			return fmt.Errorf("receipt %d detail: %w", r.id, err)
		}
		e := TimelineEvent{At: r.at, Outcome: r.kind, Generation: r.gen, SessionGeneration: r.sgen, RequestID: r.req,
			Digest: r.digest, ReceiptID: r.id, seq: r.id, sortAt: sortAt, State: d.State, Reason: d.Reason}
		if d.Outbox != 0 {
			outboxSort[d.Outbox] = sortAt
		}
		switch {
		case r.kind == string(mcpsync.OutcomeAllocated):
			allocSort[r.ord] = sortAt
			return nil // the dispatch itself is shown from read_dispatches
		case d.Phase == "allocate":
			e.Kind, e.ReadReason, e.Reason = EventDispatchRefused, d.ReadReason, ""
		case slices.Contains(fenceKinds, r.kind) || (d.Phase != "" && slices.Contains(refusedKinds, r.kind)):
			e.Kind, e.Ordinal, e.Phase = EventAnswer, r.ord, d.Phase
			before := r.before
			e.WatermarkBefore = &before
			if slices.Contains(fenceKinds, r.kind) {
				after := r.ord
				e.WatermarkAfter = &after
			} else if d.Watermark != nil {
				// The refusal's own record of the watermark it found.
				e.WatermarkBefore = d.Watermark
				// STALE also labels an answer that found the subscription no longer ACTIVE
				// (its state is in the receipt) with the watermark still below it.
				if r.kind == string(mcpsync.OutcomeStale) && r.ord <= *d.Watermark {
					e.FencedBy = *d.Watermark
				}
			}
			if v, ok := byOrdinal[r.ord]; ok && r.kind == string(mcpsync.OutcomeAccepted) {
				e.VersionID, e.Size, e.MIMEType, e.ServerName, e.ServerVersion = v.ID, v.Size, v.MIMEType, v.ServerName, v.ServerVersion
			} else if s, ok := sessions[r.sgen]; ok {
				e.ServerName, e.ServerVersion, e.ServerFromSession = s.name, s.version, true
			}
			if r.kind == string(mcpsync.OutcomeTooLarge) && d.Size != nil {
				e.Size = *d.Size
			}
		case r.kind == string(mcpsync.ReceiptTombstoneProbeNotFound):
			e.Kind, e.Ordinal = EventTombstoneProbe, r.ord
		case r.kind == string(mcpsync.ReceiptCloseFence):
			e.Kind, e.CloseEpoch = EventCloseFence, d.CloseEpoch
			co := r.ord
			e.CloseOrdinal = &co
		case r.kind == string(mcpsync.ReceiptTombstoneConfirmed) || r.kind == string(mcpsync.ReceiptTombstoneRefused):
			e.Kind, e.Ordinal, e.CatalogID, e.VersionID = EventTombstone, r.ord, d.Catalog, d.Version
			if d.Refusal != "" {
				e.Reason = d.Refusal
			}
			if d.CloseOrdinal != nil {
				e.CloseOrdinal = d.CloseOrdinal
			}
		default:
			// State transitions and keyed refusals of one (detail.transition).
			e.Kind = EventTransition
			if d.Transition != "" {
				// A keyed closing transition that changed nothing: its kind is the outcome.
				e.Reason = d.Transition + " not applied"
			}
			if d.NewSessionGeneration != 0 {
				e.Reason = fmt.Sprintf("session changed to generation %d", d.NewSessionGeneration)
			}
		}
		add(e)
		return nil
	}); err != nil {
		return Timeline{}, err
	}
	since := sub.StartedAt
	if firstAt != nil {
		since = *firstAt
	}

	// Dispatches.
	rows, err = tx.Query(ctx, `SELECT ordinal, generation, session_generation, request_id, reason, issued_at,
			completed_at, coalesce(outcome, '')
		FROM read_dispatches WHERE subscription_id = $1 ORDER BY ordinal`, sub.ID)
	if err != nil {
		return Timeline{}, err
	}
	var d TimelineEvent
	var completed *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&d.Ordinal, &d.Generation, &d.SessionGeneration, &d.RequestID, &d.ReadReason,
		&d.At, &completed, &d.Outcome}, func() error {
		e := d
		e.Kind, e.seq, e.Unanswered = EventDispatch, e.Ordinal, e.Outcome == ""
		e.sortAt = allocSort[e.Ordinal]
		if completed != nil {
			c := *completed
			e.CompletedAt = &c
		}
		add(e)
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	// Source-level receipts: the sessions the subscription was bound to or that began since it
	// was first opened, and the notifications since then about this URI (or the whole
	// source's queue) that routed nothing.
	if boundTo == nil {
		boundTo = []int64{}
	}
	rows, err = tx.Query(ctx, `SELECT id, kind, coalesce(session_generation, 0), coalesce(detail, '{}'::jsonb), created_at
		FROM receipts
		WHERE source_id = $1 AND subscription_id IS NULL
		  AND ((kind IN ('SESSION_OPENED', 'SESSION_ENDED') AND (created_at >= $2 OR session_generation = ANY($5)))
		       OR (created_at >= $2 AND (kind = 'NOTIFICATION_OVERFLOW' OR (kind LIKE 'NOTIFICATION\_%' AND uri IN ($3, $4)))))
		ORDER BY id`, sub.SourceID, since, sub.URI, sub.ServerURI, boundTo)
	if err != nil {
		return Timeline{}, err
	}
	if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.kind, &r.sgen, &r.detail, &r.at}, func() error {
		var dt receiptDetail
		if err := json.Unmarshal(r.detail, &dt); err != nil {
			return fmt.Errorf("receipt %d detail: %w", r.id, err)
		}
		e := TimelineEvent{At: r.at, Outcome: r.kind, SessionGeneration: r.sgen, ReceiptID: r.id, seq: r.id}
		if r.kind == string(mcpsync.ReceiptSessionOpened) || r.kind == string(mcpsync.ReceiptSessionEnded) {
			e.Kind, e.Reason = EventSession, dt.Reason
			if s, ok := sessions[r.sgen]; ok {
				e.ServerName, e.ServerVersion = s.name, s.version
			}
		} else {
			e.Kind, e.NotificationSeq, e.Reason = EventNotification, dt.Seq, dt.Problem
			if r.kind == string(mcpsync.ReceiptNotificationOverflow) {
				e.NotificationSeq = dt.LastSeq
				e.Reason = fmt.Sprintf("queue overflow: %d dropped, sequences %d-%d; every live subscription re-reads", dt.Dropped, dt.FirstSeq, dt.LastSeq)
			}
		}
		add(e)
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	// Outbox rows of the subscription, with the consumers whose offset passed them.
	rows, err = tx.Query(ctx, `SELECT o.id, o.kind, coalesce(o.digest, ''), coalesce(o.read_ordinal, 0), o.shadow, o.created_at,
			coalesce(array(SELECT c.name FROM outbox_consumers c WHERE (c.txid, c.last_id) >= (o.txid, o.id) ORDER BY c.name), '{}'),
			coalesce(array(SELECT c.name FROM outbox_consumers c WHERE (c.txid, c.last_id) < (o.txid, o.id) ORDER BY c.name), '{}')
		FROM invalidation_outbox o WHERE o.subscription_id = $1 ORDER BY o.id`, sub.ID)
	if err != nil {
		return Timeline{}, err
	}
	var o TimelineEvent
	if _, err := pgx.ForEachRow(rows, []any{&o.OutboxID, &o.OutboxKind, &o.Digest, &o.Ordinal, &o.Shadow, &o.At,
		&o.ConsumersPassed, &o.ConsumersPending}, func() error {
		e := o
		e.Kind, e.seq = EventOutbox, e.OutboxID
		e.sortAt = outboxSort[e.OutboxID]
		e.ConsumersPassed, e.ConsumersPending = nilIfEmpty(o.ConsumersPassed), nilIfEmpty(o.ConsumersPending)
		add(e)
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	// Guard verdicts on the accepted digests: one per (digest, policy), at the ordinal of the
	// newest version with that digest accepted by the time it was checked (else the first).
	rows, err = tx.Query(ctx, `SELECT g.digest, g.policy_id, g.outcome, g.reasons, coalesce(g.delivered_digest, ''), g.checked_at
		FROM guard_verdicts g
		WHERE g.digest IN (SELECT digest FROM resource_versions WHERE subscription_id = $1 AND digest IS NOT NULL)
		ORDER BY g.checked_at, g.digest, g.policy_id`, sub.ID)
	if err != nil {
		return Timeline{}, err
	}
	var g TimelineEvent
	if _, err := pgx.ForEachRow(rows, []any{&g.Digest, &g.Policy, &g.Outcome, &g.Reasons, &g.DeliveredDigest, &g.At}, func() error {
		e := g
		e.Kind, e.Reasons = EventGuardVerdict, nilIfEmpty(g.Reasons)
		for _, v := range versions {
			if v.Digest != e.Digest {
				continue
			}
			if e.Ordinal == 0 || !v.AcceptedAt.After(e.At) {
				e.Ordinal, e.VersionID = v.ReadOrdinal, v.ID
			}
		}
		add(e)
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	// Lineage: which derived indexes took which version, and their invalidation.
	rows, err = tx.Query(ctx, `SELECT l.id, l.index_name, l.version_id, l.read_ordinal, l.digest, l.delivered_digest,
			l.policy_id, l.first_taken_at, l.last_taken_at, l.takes, coalesce(l.revocation_id, 0), l.invalidated_at,
			coalesce(o.id, 0),
			coalesce(array(SELECT c.name FROM outbox_consumers c WHERE o.id IS NOT NULL AND (c.txid, c.last_id) >= (o.txid, o.id) ORDER BY c.name), '{}'),
			coalesce(array(SELECT c.name FROM outbox_consumers c WHERE o.id IS NOT NULL AND (c.txid, c.last_id) < (o.txid, o.id) ORDER BY c.name), '{}')
		FROM index_lineage l
		LEFT JOIN revocation_indexes ri ON ri.revocation_id = l.revocation_id AND ri.index_name = l.index_name
		LEFT JOIN invalidation_outbox o ON o.idempotency_key = ri.outbox_key
		WHERE l.subscription_id = $1 ORDER BY l.id`, sub.ID)
	if err != nil {
		return Timeline{}, err
	}
	var l TimelineEvent
	var lid, revID, obID int64
	var lastTaken time.Time
	var invalidated *time.Time
	var passed, pending []string
	if _, err := pgx.ForEachRow(rows, []any{&lid, &l.Index, &l.VersionID, &l.Ordinal, &l.Digest, &l.DeliveredDigest,
		&l.Policy, &l.At, &lastTaken, &l.Takes, &revID, &invalidated, &obID, &passed, &pending}, func() error {
		e := l
		e.Kind, e.seq = EventLineage, lid
		lt := lastTaken
		e.LastTakenAt = &lt
		add(e)
		if invalidated != nil {
			add(TimelineEvent{At: *invalidated, Kind: EventIndexInvalidate, Ordinal: l.Ordinal, Index: l.Index,
				VersionID: l.VersionID, Digest: l.Digest, RevocationID: revID, OutboxID: obID,
				OutboxKind: OutboxIndexInvalidation, ConsumersPassed: nilIfEmpty(passed), ConsumersPending: nilIfEmpty(pending), seq: lid})
		}
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	// Revocations that told the subscription to pass the close fence.
	rows, err = tx.Query(ctx, `SELECT r.id, r.revoked_at, r.reason, rs.state_at_revocation
		FROM revocation_subscriptions rs JOIN revocations r ON r.id = rs.revocation_id
		WHERE rs.subscription_id = $1 ORDER BY r.id`, sub.ID)
	if err != nil {
		return Timeline{}, err
	}
	var rv TimelineEvent
	if _, err := pgx.ForEachRow(rows, []any{&rv.RevocationID, &rv.At, &rv.Reason, &rv.State}, func() error {
		e := rv
		e.Kind, e.Outcome, e.seq = EventRevocation, string(mcpsync.OutcomeRevoked), e.RevocationID
		add(e)
		return nil
	}); err != nil {
		return Timeline{}, err
	}

	for _, e := range events {
		switch {
		case e.Kind == EventAnswer && e.WatermarkAfter == nil:
			if tl.RefusedAnswers == nil {
				tl.RefusedAnswers = map[string]int{}
			}
			tl.RefusedAnswers[e.Outcome]++
		case e.Kind == EventDispatch && e.Unanswered:
			tl.UnansweredDispatches++
		}
	}
	if req.Ordinal > 0 {
		events = narrowToOrdinal(events, req.Ordinal, byOrdinal)
	}
	for i := range events {
		if events[i].sortAt.IsZero() {
			events[i].sortAt = events[i].At
		}
	}
	slices.SortStableFunc(events, func(a, b TimelineEvent) int {
		if c := a.sortAt.Compare(b.sortAt); c != 0 {
			return c
		}
		if a.Ordinal != b.Ordinal {
			return cmpInt(a.Ordinal, b.Ordinal)
		}
		if ra, rb := eventRank[a.Kind], eventRank[b.Kind]; ra != rb {
			return ra - rb
		}
		return cmpInt(a.seq, b.seq)
	})
	if events == nil {
		events = []TimelineEvent{}
	}
	tl.Events = events
	return tl, nil
}

// narrowToOrdinal keeps the events of read ord and what followed from it: its dispatch, its
// answers, its version's outbox row, guard verdicts on its digest, lineage and invalidations
// of its version, its tombstone probes and confirmation, and the STALE refusals its watermark
// caused.
func narrowToOrdinal(events []TimelineEvent, ord int64, byOrdinal map[int64]Version) []TimelineEvent {
	v, hasVersion := byOrdinal[ord]
	var out []TimelineEvent
	for _, e := range events {
		switch {
		case e.Kind == EventGuardVerdict:
			if hasVersion && v.Digest != "" && e.Digest == v.Digest {
				e.Ordinal, e.VersionID = ord, v.ID
				out = append(out, e)
			}
		case e.Ordinal == ord, e.FencedBy == ord:
			out = append(out, e)
		}
	}
	return out
}

// receiptDetail is the part of a receipt's detail document the timeline shows.
type receiptDetail struct {
	Phase                string `json:"phase"`
	ReadReason           string `json:"reason"` // allocate receipts: the read reason; others: a state reason
	State                string `json:"state"`
	Outcome              string `json:"outcome"`
	Transition           string `json:"transition"`
	Watermark            *int64 `json:"watermark"`
	Size                 *int64 `json:"size"`
	CloseEpoch           int64  `json:"close_epoch"`
	CloseOrdinal         *int64 `json:"close_ordinal"`
	Catalog              int64  `json:"catalog"`
	Version              int64  `json:"version"`
	Refusal              string `json:"refusal"`
	NewSessionGeneration int64  `json:"new_session_generation"`
	Seq                  int64  `json:"seq"`
	Problem              string `json:"problem"`
	FirstSeq             int64  `json:"first_seq"`
	LastSeq              int64  `json:"last_seq"`
	Dropped              int64  `json:"dropped"`
	Outbox               int64  `json:"outbox"`
	Reason               string `json:"-"`
}

// UnmarshalJSON reads "reason" into both ReadReason and Reason: allocate receipts store the
// read reason under it, transitions the state reason.
func (d *receiptDetail) UnmarshalJSON(b []byte) error {
	type plain receiptDetail
	if err := json.Unmarshal(b, (*plain)(d)); err != nil {
		return err
	}
	d.Reason = d.ReadReason
	if d.Phase != "allocate" {
		d.ReadReason = ""
	}
	return nil
}

func outcomeStrings(outs ...mcpsync.Outcome) []string {
	s := make([]string, len(outs))
	for i, o := range outs {
		s[i] = string(o)
	}
	return s
}

// nilIfEmpty returns a copy of s (scans reuse their target), or nil when it is empty.
func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
