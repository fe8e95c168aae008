package ledger

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// Retention (issue 17 item 6; SPEC.md "Retention"). Prune deletes rows that no fence, no
// outbox consumer and no derived index needs any more, in bounded batches. Each batch is one
// statement over a window of at most BatchSize rows taken in key order, and its WHERE carries
// the whole keep-condition of the table (the ledger-as-fence rule applies to deletions too):
// no row is deleted on the strength of something read by an earlier statement. The conditions
// only ever lose strength towards keeping: a watermark only rises and a newer version or
// catalog only appears, so a statement that runs on a slightly old snapshot keeps more, never
// less.
//
// Never deleted, whatever their age: subscriptions (their watermarks, close ordinals and
// epochs), sources, sessions, grants, revocations, lineage, the roll-out's rows, every receipt
// that changed a subscription's state (SUBSCRIPTION_OPENED … CLOSED, CLOSE_FENCE,
// TOMBSTONE_PENDING, TOMBSTONE_CONFIRMED, SESSION_CHANGED, CLOSED_WITH_SESSION), the newest
// version of every subscription, every tombstone version, every version a lineage entry names,
// the dispatch at and above every watermark, the newest catalog of every source with its rounds,
// and the revocation outbox rows.

// DefaultPruneOlderThan is `mcpsync prune`'s default age: rows younger than 30 days are kept.
const DefaultPruneOlderThan = 720 * time.Hour

// DefaultPruneBatch is how many rows one prune statement examines by default.
const DefaultPruneBatch = 5000

// BlobGrace is the least age of a content blob Prune deletes, whatever PruneOptions.OlderThan
// says: a read stores its body (PutBlob) before its answer reaches the acceptance point (or,
// on the fast path, in the acceptance's own transaction: AcceptRequest.Body), so a young blob
// that no version names yet may be about to be named. PutBlob refreshes the age of
// a blob stored again (once it is older than blobTouchEvery), so the body of an answer on its
// way to the acceptance point is younger than BlobGrace unless the answer took most of an hour.
const BlobGrace = time.Hour

// PruneOptions configure Prune.
type PruneOptions struct {
	// OlderThan: rows younger than this are kept (0: every row the keep rules allow). Negative
	// is invalid.
	OlderThan time.Duration
	// DryRun counts what a prune would delete, deleting nothing. Rows that become prunable only
	// once others are gone (a version once its outbox row is, a blob once its versions are) are
	// counted as such, as are the rounds storing a set's entries once the later rounds naming
	// them are: a dry run counts what a prune started at the same moment deletes.
	DryRun bool
	// BatchSize is how many rows one statement examines (0: DefaultPruneBatch).
	BatchSize int
}

// PruneTable is what Prune did (or, in a dry run, would do) to one table.
type PruneTable struct {
	Table string `json:"table"`
	// RowsBefore and RowsAfter count the table's rows before and after; BytesBefore and
	// BytesAfter are pg_total_relation_size (heap, indexes and TOAST). PostgreSQL reuses the
	// space of deleted rows but returns it to the file system only on VACUUM FULL, so BytesAfter
	// seldom falls; FreedBytes says how much was freed for reuse.
	RowsBefore  int64 `json:"rowsBefore"`
	RowsAfter   int64 `json:"rowsAfter"`
	BytesBefore int64 `json:"bytesBefore"`
	BytesAfter  int64 `json:"bytesAfter"`
	// Deleted counts the rows deleted (dry run: that would be), FreedBytes their total size
	// (pg_column_size of each row, bodies included).
	Deleted    int64 `json:"deleted"`
	FreedBytes int64 `json:"freedBytes"`
	// Batches is the number of statements that ran on the table.
	Batches int `json:"batches"`
}

// PruneReport is the outcome of Prune.
type PruneReport struct {
	DryRun bool `json:"dryRun"`
	// Cutoff: rows at or after it were kept. BlobCutoff is the same for content blobs (at
	// least BlobGrace before the prune started).
	Cutoff     time.Time     `json:"cutoff"`
	BlobCutoff time.Time     `json:"blobCutoff"`
	Tables     []PruneTable  `json:"tables"`
	Elapsed    time.Duration `json:"elapsedNs"`
}

// Deleted is the total of rows deleted (or, in a dry run, that would be) over every table.
func (r PruneReport) Deleted() int64 {
	var n int64
	for _, t := range r.Tables {
		n += t.Deleted
	}
	return n
}

// Table returns the report of table name (zero if Prune does not touch it).
func (r PruneReport) Table(name string) PruneTable {
	for _, t := range r.Tables {
		if t.Table == name {
			return t
		}
	}
	return PruneTable{Table: name}
}

// PruneTables are the tables Prune deletes from, in the order it visits them: a row that only
// a later table's row keeps alive is visited after that row's table (outbox rows before their
// versions, versions before their blobs' verdicts, verdicts before the blobs, catalog
// consumptions before their catalogs, catalogs before their rounds, rounds and their lists of
// entry chunks before the chunks).
var PruneTables = []string{"invalidation_outbox", "resource_versions", "guard_verdicts", "content_blobs",
	"read_dispatches", "receipts", "catalog_consumptions", "catalogs", "discovery_scans", "catalog_entry_batches",
	"catalog_entry_chunks"}

// Keep conditions. Each func returns the SQL condition under which row alias t of its table
// may be deleted; $1 is the cutoff, $2 the blob cutoff. dry names the dry-run form: there a
// row that only a prunable row keeps alive counts as prunable too, while a real prune waits
// until that row is gone (so that, between two statements, nothing names a deleted row).

// outboxPrunable: an invalidation of a version or tombstone that every named consumer has
// passed (its committed offset is at or past the row in (txid, id) order; rows below an offset
// were all readable when the consumer passed them). Revocation and index invalidations are
// kept: they are the record of R29 and `mcpsync revocation` shows them.
func outboxPrunable(t string) string {
	return fmt.Sprintf(`%[1]s.kind IN ('version', 'tombstone') AND %[1]s.created_at < $1
		AND NOT EXISTS (SELECT 1 FROM outbox_consumers %[1]s_c WHERE (%[1]s_c.txid, %[1]s_c.last_id) < (%[1]s.txid, %[1]s.id))`, t)
}

// versionPrunable: a content version superseded by a newer version of its subscription that
// was itself accepted before the cutoff (so no read that found this one newest is still in
// flight), that no lineage entry names (a derived index holds it, or held it until a
// revocation: the trace of R24) and that no invalidation outbox row names (consumers may still
// need to be told of it; the R24 check pairs the two). Tombstone versions are kept.
func versionPrunable(t string, dry bool) string {
	ob := ""
	if dry {
		ob = " AND NOT (" + outboxPrunable(t+"_o") + ")"
	}
	return fmt.Sprintf(`%[1]s.kind = 'content' AND %[1]s.accepted_at < $1
		AND EXISTS (SELECT 1 FROM resource_versions %[1]s_n WHERE %[1]s_n.subscription_id = %[1]s.subscription_id
		            AND %[1]s_n.read_ordinal > %[1]s.read_ordinal AND %[1]s_n.accepted_at < $1)
		AND NOT EXISTS (SELECT 1 FROM index_lineage %[1]s_l WHERE %[1]s_l.version_id = %[1]s.id)
		AND NOT EXISTS (SELECT 1 FROM invalidation_outbox %[1]s_o WHERE %[1]s_o.subscription_id = %[1]s.subscription_id
		                AND %[1]s_o.read_ordinal = %[1]s.read_ordinal%[2]s)`, t, ob)
}

// verdictPrunable: a guard verdict on content no version names any more (a lineage entry's
// version is never deleted, so every digest an index took stays named).
func verdictPrunable(t string, dry bool) string {
	vk := ""
	if dry {
		vk = " AND NOT (" + versionPrunable(t+"_v", true) + ")"
	}
	return fmt.Sprintf(`%[1]s.checked_at < $1
		AND NOT EXISTS (SELECT 1 FROM resource_versions %[1]s_v WHERE %[1]s_v.digest = %[1]s.digest%[2]s)`, t, vk)
}

// blobPrunable: a body older than the blob cutoff that no version, guard verdict (checked or
// delivered) or lineage entry (taken or delivered) names.
func blobPrunable(t string, dry bool) string {
	vk, gk, dk := "", "", ""
	if dry {
		vk = " AND NOT (" + versionPrunable(t+"_v", true) + ")"
		gk = " AND NOT (" + verdictPrunable(t+"_g", true) + ")"
		dk = " AND NOT (" + verdictPrunable(t+"_d", true) + ")"
	}
	return fmt.Sprintf(`%[1]s.created_at < $2
		AND NOT EXISTS (SELECT 1 FROM resource_versions %[1]s_v WHERE %[1]s_v.digest = %[1]s.digest%[2]s)
		AND NOT EXISTS (SELECT 1 FROM guard_verdicts %[1]s_g WHERE %[1]s_g.digest = %[1]s.digest%[3]s)
		AND NOT EXISTS (SELECT 1 FROM guard_verdicts %[1]s_d WHERE %[1]s_d.delivered_digest = %[1]s.digest%[4]s)
		AND NOT EXISTS (SELECT 1 FROM index_lineage %[1]s_l WHERE %[1]s_l.digest = %[1]s.digest)
		AND NOT EXISTS (SELECT 1 FROM index_lineage %[1]s_m WHERE %[1]s_m.delivered_digest = %[1]s.digest)`, t, vk, gk, dk)
}

// dispatchPrunable: a read dispatch the subscription has moved past: below its watermark, or
// of an older subscription generation. The dispatch at the watermark (ConfirmTombstone's
// not-found read) and every one above it (reads in flight) are kept. An answer to a deleted
// dispatch is refused all the same (R16: its ordinal is at or below the watermark, or its
// generation is old) and labelled NOT_DISPATCHED.
func dispatchPrunable(t string) string {
	return fmt.Sprintf(`%[1]s.issued_at < $1
		AND EXISTS (SELECT 1 FROM subscriptions %[1]s_s WHERE %[1]s_s.id = %[1]s.subscription_id
		            AND (%[1]s.ordinal < %[1]s_s.last_accepted_ordinal OR %[1]s.generation < %[1]s_s.generation))`, t)
}

// pruneAuditKinds are receipts that record an event and serve no fence: notifications that
// matched nothing or overflowed. (PRUNED receipts, one per prune, stay: the record of what
// retention deleted.)
const pruneAuditKinds = `('NOTIFICATION_OLD_SESSION', 'NOTIFICATION_UNMATCHED', 'NOTIFICATION_AFTER_CLOSE',
	'NOTIFICATION_OUT_OF_ORDER', 'NOTIFICATION_MALFORMED_URI', 'NOTIFICATION_OVERFLOW')`

// receiptPrunable: audits (pruneAuditKinds), and the receipts of the read path that the
// subscription has moved past. Read-path receipts are ALLOCATED, ACCEPTED, REVALIDATED,
// TOO_LARGE and every refusal of an allocation or an answer (detail phase allocate, accept,
// not_found, too_large); moved past means of an older generation, of an ordinal below the
// watermark (the receipt at the watermark stays), or, for an allocation refusal (which has no
// ordinal), of an older session. A call replayed after its receipt is gone is decided again by
// its fence, and every fence refuses it: an answer's ordinal is at or below the watermark or its
// generation is old (R16, R12), and a repeated allocation is an allocation like any other.
// TOMBSTONE_REFUSED receipts (ConfirmTombstone re-decides a replay in its WHERE) and
// TOMBSTONE_PROBE_NOT_FOUND receipts of any but the pending not-found read (only those count,
// R21) go too. Every receipt that changed a subscription's state stays: they order its history
// for the R24 checks and answer replays of the closing transitions.
func receiptPrunable(t string) string {
	return fmt.Sprintf(`%[1]s.created_at < $1 AND (
		%[1]s.kind IN `+pruneAuditKinds+`
		OR (%[1]s.subscription_id IS NOT NULL AND EXISTS (SELECT 1 FROM subscriptions %[1]s_s WHERE %[1]s_s.id = %[1]s.subscription_id AND (
			((%[1]s.kind IN ('ALLOCATED', 'ACCEPTED', 'REVALIDATED', 'TOO_LARGE')
			  OR %[1]s.detail->>'phase' IN ('allocate', 'accept', 'not_found', 'too_large'))
			 AND (%[1]s.generation < %[1]s_s.generation OR %[1]s.read_ordinal < %[1]s_s.last_accepted_ordinal
			      OR (%[1]s.read_ordinal IS NULL AND %[1]s.session_generation < %[1]s_s.session_generation)))
			OR %[1]s.kind = 'TOMBSTONE_REFUSED'
			OR (%[1]s.kind = 'TOMBSTONE_PROBE_NOT_FOUND'
			    AND NOT (%[1]s_s.state = 'TOMBSTONE_PENDING' AND %[1]s.generation = %[1]s_s.generation
			             AND %[1]s.session_generation = %[1]s_s.session_generation
			             AND %[1]s.read_ordinal = %[1]s_s.last_accepted_ordinal))))))`, t)
}

// newestCatalog is the id of the newest catalog of source src (the one ConsumeCatalog hands out).
func newestCatalog(alias, src string) string {
	return fmt.Sprintf(`(SELECT %[1]s.id FROM catalogs %[1]s WHERE %[1]s.source_id = %[2]s ORDER BY %[1]s.measured_at DESC, %[1]s.id DESC LIMIT 1)`, alias, src)
}

// consumptionPrunable: a record of a catalog request (R25) older than the cutoff, unless it
// names its source's newest catalog.
func consumptionPrunable(t string) string {
	return fmt.Sprintf(`%[1]s.created_at < $1
		AND (%[1]s.catalog_id IS NULL OR %[1]s.catalog_id IS DISTINCT FROM `+newestCatalog(t+"_n", t+".source_id")+`)`, t)
}

// catalogPrunable: a catalog superseded by a newer catalog of its source that was itself
// published before the cutoff, that no kept consumption names.
func catalogPrunable(t string, dry bool) string {
	ck := ""
	if dry {
		ck = " AND NOT (" + consumptionPrunable(t+"_k") + ")"
	}
	return fmt.Sprintf(`%[1]s.published_at < $1
		AND EXISTS (SELECT 1 FROM catalogs %[1]s_n WHERE %[1]s_n.source_id = %[1]s.source_id AND %[1]s_n.published_at < $1
		            AND (%[1]s_n.measured_at, %[1]s_n.id) > (%[1]s.measured_at, %[1]s.id))
		AND NOT EXISTS (SELECT 1 FROM catalog_consumptions %[1]s_k WHERE %[1]s_k.catalog_id = %[1]s.id%[2]s)`, t, ck)
}

// scanPrunable: a discovery round that ended before the cutoff, that no kept catalog names
// (its entries or its rounds A and B), whose stored entries no other round names, whose scan
// run has no round still running, and that is not a complete round with a snapshot ID on its
// source's current session: PublishCatalog refuses SNAPSHOT_PROVEN when a round of the same
// session listed another set under the same snapshot ID (R5), so those rounds stay while their
// session is the current one. Its entry batches go with it (ON DELETE CASCADE).
//
// A round that stores a set's entries is named by the later rounds that listed the same set
// (entries_scan_id always names an earlier round or the round itself), so rounds are visited
// newest first: the rounds naming a holder are gone before the holder is examined. A round
// ending just then may pick a holder this statement deletes (EndScan reuses the newest stored
// set with its digest): one of the two statements then fails on the foreign key; a prune batch
// runs again, and EndScan's activity is retried and stores the entries itself.
func scanPrunable(t string, dry bool) string { return scanPrunableAt(t, dry, true) }

// scanPrunableAt is scanPrunable; in a dry run a round naming t's entries keeps t only if it
// is kept itself, judged without its own namers (withNamers false): entries are only ever named
// by later rounds of the same set, directly, so one level is the whole chain.
func scanPrunableAt(t string, dry, withNamers bool) string {
	ck, bk, xk := "", "", ""
	if dry {
		ck = " AND NOT (" + catalogPrunable(t+"_c", true) + ")"
		bk = " AND NOT (" + catalogPrunable(t+"_b", true) + ")"
	}
	if withNamers {
		// A namer deleted by the same statement (in its window, and prunable) keeps nothing:
		// the foreign key is checked when the statement ends. A dry run counts every prunable
		// namer as gone.
		inWindow := ""
		if !dry {
			inWindow = fmt.Sprintf("%s_x.id IN (SELECT w.id FROM w) AND ", t)
		}
		xk = " AND NOT (" + inWindow + scanPrunableAt(t+"_x", dry, false) + ")"
	}
	namers := ""
	if withNamers {
		namers = fmt.Sprintf(`
		AND NOT EXISTS (SELECT 1 FROM discovery_scans %[1]s_x WHERE %[1]s_x.entries_scan_id = %[1]s.id AND %[1]s_x.id <> %[1]s.id%[2]s)`, t, xk)
	}
	return fmt.Sprintf(`%[1]s.outcome <> 'RUNNING' AND coalesce(%[1]s.ended_at, %[1]s.started_at) < $1
		AND NOT EXISTS (SELECT 1 FROM catalogs %[1]s_c WHERE %[1]s_c.entries_scan_id = %[1]s.id%[2]s)
		AND NOT EXISTS (SELECT 1 FROM catalogs %[1]s_b WHERE %[1]s_b.basis_scan_ids @> ARRAY[%[1]s.id]%[3]s)%[4]s
		AND NOT EXISTS (SELECT 1 FROM discovery_scans %[1]s_r WHERE %[1]s_r.scan_run = %[1]s.scan_run AND %[1]s_r.outcome = 'RUNNING')
		AND NOT (%[1]s.outcome = 'COMPLETE' AND %[1]s.snapshot_id IS NOT NULL
		         AND %[1]s.session_generation = (SELECT %[1]s_so.current_generation FROM sources %[1]s_so WHERE %[1]s_so.id = %[1]s.source_id))`, t, ck, bk, namers)
}

// chunkPrunable: a chunk of catalog entries (migration 0018) stored before the cutoff that no
// round's list names. A round that is about to name a stored chunk locks it first
// (storeEntries), so the delete waits for it and then fails on the foreign key, and runs again.
func chunkPrunable(t string, dry bool) string {
	sk := ""
	if dry {
		sk = fmt.Sprintf(" AND NOT EXISTS (SELECT 1 FROM discovery_scans %[1]s_s WHERE %[1]s_s.id = %[1]s_b.scan_id AND %[2]s)",
			t, scanPrunable(t+"_s", true))
	}
	return fmt.Sprintf(`%[1]s.created_at < $1
		AND NOT EXISTS (SELECT 1 FROM catalog_entry_batches %[1]s_b WHERE %[1]s_b.chunk = %[1]s.digest%[2]s)`, t, sk)
}

// pruneStep is one table's pass: its key columns (all bigint, or all text), the direction it
// visits them in, and its keep condition.
type pruneStep struct {
	table string
	keys  []string
	text  bool // the key columns are text
	desc  bool // visit the rows in descending key order
	cond  func(t string, dry bool) string
	// extra, if set, is a RETURNING/SELECT expression pair adding the rows and bytes of a
	// dependent table deleted with each row (discovery_scans: its entry batches).
	extraTable string
	extraRows  string
	extraBytes string
}

func pruneSteps() []pruneStep {
	plain := func(f func(string) string) func(string, bool) string {
		return func(t string, _ bool) string { return f(t) }
	}
	return []pruneStep{
		{table: "invalidation_outbox", keys: []string{"id"}, cond: plain(outboxPrunable)},
		{table: "resource_versions", keys: []string{"id"}, cond: versionPrunable},
		{table: "guard_verdicts", keys: []string{"digest", "policy_id"}, text: true, cond: verdictPrunable},
		{table: "content_blobs", keys: []string{"digest"}, text: true, cond: blobPrunable},
		{table: "read_dispatches", keys: []string{"subscription_id", "ordinal"}, cond: plain(dispatchPrunable)},
		{table: "receipts", keys: []string{"id"}, cond: plain(receiptPrunable)},
		{table: "catalog_consumptions", keys: []string{"id"}, cond: plain(consumptionPrunable)},
		{table: "catalogs", keys: []string{"id"}, cond: catalogPrunable},
		{table: "discovery_scans", keys: []string{"id"}, desc: true, cond: scanPrunable, extraTable: "catalog_entry_batches",
			extraRows:  `(SELECT count(*) FROM catalog_entry_batches e WHERE e.scan_id = t.id)`,
			extraBytes: `(SELECT coalesce(sum(pg_column_size(e.*)), 0) FROM catalog_entry_batches e WHERE e.scan_id = t.id)`},
		{table: "catalog_entry_chunks", keys: []string{"digest"}, text: true, cond: chunkPrunable},
	}
}

// statement builds the step's batch statement: a window of at most $3 rows after the cursor
// ($4…) in key order, and of those the rows its condition lets go, deleted (or, dry, counted).
// It returns the window's size and last key, the rows and bytes, and the extra table's.
func (p pruneStep) statement(dry bool) string {
	keys := strings.Join(p.keys, ", ")
	var cur []string
	for i := range p.keys {
		typ := "bigint"
		if p.text {
			typ = "text"
		}
		cur = append(cur, fmt.Sprintf("$%d::%s", i+4, typ))
	}
	var join []string
	for _, k := range p.keys {
		join = append(join, "t."+k+" = w."+k)
	}
	extraRows, extraBytes := "0::bigint", "0::bigint"
	if p.extraTable != "" {
		extraRows, extraBytes = p.extraRows, p.extraBytes
	}
	cond := p.cond("t", dry)
	var body string
	if dry {
		body = fmt.Sprintf(`SELECT pg_column_size(t.*)::bigint AS size, %s AS xrows, %s AS xbytes
			FROM %s t JOIN w ON %s WHERE %s`, extraRows, extraBytes, p.table, strings.Join(join, " AND "), cond)
	} else {
		body = fmt.Sprintf(`DELETE FROM %s t USING w WHERE %s AND %s
			RETURNING pg_column_size(t.*)::bigint AS size, %s AS xrows, %s AS xbytes`,
			p.table, strings.Join(join, " AND "), cond, extraRows, extraBytes)
	}
	cmp, order, back := ">", "", " DESC"
	if p.desc {
		cmp, order, back = "<", " DESC", ""
	}
	var last []string
	for _, k := range p.keys {
		last = append(last, fmt.Sprintf("(SELECT w.%s FROM w ORDER BY %s LIMIT 1)", k, orderKeys("w", p.keys, back)))
	}
	// typed names the parameter types, which not every condition uses.
	return fmt.Sprintf(`WITH typed AS (SELECT $1::timestamptz, $2::timestamptz, $3::int),
		w AS MATERIALIZED (
			SELECT %[1]s FROM %[2]s WHERE (%[1]s) %[6]s (%[3]s) ORDER BY %[7]s LIMIT $3),
		d AS (%[4]s)
		SELECT (SELECT count(*) FROM w), %[5]s,
		       count(*), coalesce(sum(d.size), 0)::bigint, coalesce(sum(d.xrows), 0)::bigint, coalesce(sum(d.xbytes), 0)::bigint
		FROM d`, keys, p.table, strings.Join(cur, ", "), body, strings.Join(last, ", "), cmp, orderKeys(p.table, p.keys, order))
}

// orderKeys is an ORDER BY list of keys qualified by alias, each with direction dir.
func orderKeys(alias string, keys []string, dir string) string {
	var out []string
	for _, k := range keys {
		out = append(out, alias+"."+k+dir)
	}
	return strings.Join(out, ", ")
}

// tableStats returns the rows and total relation size of table.
func (s *Store) tableStats(ctx context.Context, table string) (rows, bytes int64, err error) {
	err = s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), pg_total_relation_size('%s') FROM %s`, table, table)).Scan(&rows, &bytes)
	if err != nil {
		return 0, 0, fmt.Errorf("ledger: prune: size of %s: %w", table, err)
	}
	return rows, bytes, nil
}

// Prune deletes what the retention rules let go (SPEC.md "Retention"; see PruneOptions and the
// keep conditions above), table by table in PruneTables order, in batches of one statement
// each, and reports rows and bytes per table before and after. With DryRun it deletes nothing
// and counts what it would delete. A real prune leaves one PRUNED receipt with its counts. It
// may run while workers run: every statement's WHERE re-checks the whole keep-condition, and
// the conditions keep the rows calls in flight can still name. The error is ErrInvalid for a
// negative age or batch, or the database's.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (PruneReport, error) {
	if opts.OlderThan < 0 || opts.BatchSize < 0 {
		return PruneReport{}, fmt.Errorf("ledger: prune: older than %s, batch %d: %w", opts.OlderThan, opts.BatchSize, ErrInvalid)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultPruneBatch
	}
	start := time.Now()
	rep := PruneReport{DryRun: opts.DryRun}
	if err := s.pool.QueryRow(ctx, `SELECT now() - make_interval(secs => $1), now() - make_interval(secs => $2)`,
		opts.OlderThan.Seconds(), max(opts.OlderThan, BlobGrace).Seconds()).Scan(&rep.Cutoff, &rep.BlobCutoff); err != nil {
		return PruneReport{}, fmt.Errorf("ledger: prune: cutoff: %w", err)
	}
	tables := map[string]*PruneTable{}
	for _, name := range PruneTables {
		t := &PruneTable{Table: name}
		var err error
		if t.RowsBefore, t.BytesBefore, err = s.tableStats(ctx, name); err != nil {
			return PruneReport{}, err
		}
		tables[name] = t
	}
	for _, step := range pruneSteps() {
		if err := s.pruneTable(ctx, step, opts, rep.Cutoff, rep.BlobCutoff, tables); err != nil {
			return PruneReport{}, err
		}
	}
	for _, name := range PruneTables {
		t := tables[name]
		var err error
		if t.RowsAfter, t.BytesAfter, err = s.tableStats(ctx, name); err != nil {
			return PruneReport{}, err
		}
		rep.Tables = append(rep.Tables, *t)
	}
	rep.Elapsed = time.Since(start)
	if !opts.DryRun && rep.Deleted() > 0 {
		detail := map[string]any{"cutoff": rep.Cutoff, "blobCutoff": rep.BlobCutoff}
		for _, t := range rep.Tables {
			if t.Deleted > 0 {
				detail[t.Table] = map[string]int64{"rows": t.Deleted, "bytes": t.FreedBytes}
			}
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO receipts (kind, detail) VALUES ('PRUNED', $1)`, detail); err != nil {
			return rep, fmt.Errorf("ledger: prune: receipt: %w", err)
		}
	}
	return rep, nil
}

// pruneTable runs step's batches from the start of its key order to its end.
func (s *Store) pruneTable(ctx context.Context, step pruneStep, opts PruneOptions, cutoff, blobCutoff time.Time, tables map[string]*PruneTable) error {
	q := step.statement(opts.DryRun)
	t := tables[step.table]
	var cursor []any
	for range step.keys {
		switch {
		case step.text:
			cursor = append(cursor, "") // no text key is below the empty string (desc is never text)
		case step.desc:
			cursor = append(cursor, int64(math.MaxInt64))
		default:
			cursor = append(cursor, int64(math.MinInt64))
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("ledger: prune %s: %w", step.table, err)
		}
		var window, rows, bytes, xrows, xbytes int64
		last := make([]any, len(step.keys))
		dest := []any{&window}
		for i := range last {
			if step.text {
				last[i] = new(*string)
			} else {
				last[i] = new(*int64)
			}
			dest = append(dest, last[i])
		}
		dest = append(dest, &rows, &bytes, &xrows, &xbytes)
		args := append([]any{cutoff, blobCutoff, opts.BatchSize}, cursor...)
		var err error
		for attempt := 0; attempt < 4; attempt++ {
			// A deadlock, a serialization failure, or a row named between the snapshot and the
			// delete (a foreign key violation rolls the whole statement back): run it again.
			if err = s.pool.QueryRow(ctx, q, args...).Scan(dest...); err == nil || !(isRetryable(err) || isForeignKeyViolation(err)) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("ledger: prune %s: %w", step.table, err)
		}
		t.Batches++
		t.Deleted += rows
		t.FreedBytes += bytes
		if step.extraTable != "" {
			x := tables[step.extraTable]
			x.Deleted += xrows
			x.FreedBytes += xbytes
		}
		if window < int64(opts.BatchSize) {
			return nil
		}
		for i := range last {
			if step.text {
				cursor[i] = **(last[i].(**string))
			} else {
				cursor[i] = **(last[i].(**int64))
			}
		}
	}
}

// blobTouchEvery bounds how often PutBlob refreshes the age of a blob stored again; it is well
// below BlobGrace, so a blob a read stores is younger than BlobGrace until its answer is
// decided.
const blobTouchEvery = 10 * time.Minute
