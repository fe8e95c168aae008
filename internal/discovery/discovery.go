// Package discovery runs one discovery round: it pages resources/list and
// resources/templates/list of one MCP session in memory and returns what a
// resourceDiscoveryScan.v1 records (R4): the digest of each cursor it followed, the digest of
// the URI/descriptor set, counts, the snapshot IDs the pages carried, and the entries. The
// cursors themselves live only in Scan's stack frame: they are never returned, logged or
// stored, and they die with the call, on the session that issued them (R2).
//
// The go-sdk's own page iterator follows any cursor forever; Scan pages by hand and ends the
// round as failed on a repeated cursor, a page-count blow-up or a rejected cursor (R8), and on
// a page or a round with more entries than its cap (issue 14 item 6).
//
// MCP 2026-07-28 (issue 13 item 7) changes three things about paging, and nothing about the
// rounds: the A/B rounds, their comparison and the proof levels (R5-R7) apply unchanged.
//   - No cross-page consistency promise: the pages of one walk may come from different states
//     of the set. Nothing here ever assumed otherwise: that is what rounds A and B, the set
//     digests and the list_changed count are for.
//   - An invalid cursor means "discard the pages and start again": with
//     Options.CursorRestarts > 0, a -32602 answered to a request that carried a cursor discards
//     everything the round listed so far and pages both lists again from the first page, at
//     most CursorRestarts times; then the round fails as CURSOR_ERROR, as every rejected
//     cursor does on older sessions.
//   - The empty string is a valid cursor: see [EmptyCursor].
package discovery

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// DefaultSnapshotMetaKey is the _meta key of the snapshot ID in list results when the
// negotiated capability does not name one.
const DefaultSnapshotMetaKey = "mcpsync/snapshotId"

// SnapshotCapability is the experimental server capability that negotiates the snapshot-ID
// extension (R5).
const SnapshotCapability = "mcpsync/snapshot"

// DefaultMaxPages caps the pages of a round (both lists together) when Options.MaxPages is 0.
const DefaultMaxPages = 20000

// DefaultMaxPageEntries caps the entries of one page when Options.MaxPageEntries is 0: a page
// with more ends the round as ENTRY_CAP (issue 14 item 6).
const DefaultMaxPageEntries = 10000

// DefaultMaxEntries caps the entries of a round (both lists together) when Options.MaxEntries
// is 0: the round holds every entry in memory until it ends, so a server listing without end
// ends the round as ENTRY_CAP instead of exhausting the worker's memory (issue 14 item 6).
const DefaultMaxEntries = 1000000

// maxSnapshotIDs bounds the distinct snapshot IDs a Result reports.
const maxSnapshotIDs = 8

// Entry kinds.
const (
	KindResource = "resource"
	KindTemplate = "template"
)

// Lister is the part of an MCP client session a round uses; *mcp.ClientSession satisfies it.
type Lister interface {
	ListResources(ctx context.Context, params *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error)
	ListResourceTemplates(ctx context.Context, params *mcp.ListResourceTemplatesParams) (*mcp.ListResourceTemplatesResult, error)
}

// Options tune a round.
type Options struct {
	// MaxPages caps the pages of both lists together (R8); 0 means DefaultMaxPages.
	MaxPages int
	// MaxPageEntries caps the entries of one page; 0 means DefaultMaxPageEntries.
	MaxPageEntries int
	// MaxEntries caps the entries of both lists together; 0 means DefaultMaxEntries.
	MaxEntries int
	// SnapshotMetaKey is the _meta key of the snapshot ID; "" means DefaultSnapshotMetaKey.
	SnapshotMetaKey string
	// CursorKey keys the cursor digests (HMAC-SHA-256) so that a short cursor cannot be
	// recovered from its stored digest; nil means plain SHA-256.
	CursorKey []byte
	// Check, if set, is called before every request; an error ends the round with
	// STALE_SESSION (the session ended or was replaced: its cursors are dead).
	Check func() error
	// Progress, if set, is called after every page.
	Progress func(Progress)
	// CursorRestarts is how many times a round starts again from the first page after a
	// request with a cursor was answered -32602 (MCP 2026-07-28: a bad cursor means discard
	// the pages and start again). 0, the rule of older sessions, fails the round at once as
	// CURSOR_ERROR. The page cap (MaxPages) counts the pages of every start together.
	CursorRestarts int
	// EntriesHint is how many entries the round is expected to list (the count of the last
	// complete round of the same source); with it the entries are built in one slice of that
	// capacity and an eighth more (at most MaxEntries, see entriesCapacity) instead of
	// per-page slices joined at the round's end. A wrong hint costs memory or one copy, never
	// a different Result; 0 means no hint.
	EntriesHint int
}

// DefaultCursorRestarts is the CursorRestarts a 2026-07-28 session's rounds get.
const DefaultCursorRestarts = 3

// CursorRestartsFor returns the Options.CursorRestarts of a round on a session that
// negotiated protocolVersion: DefaultCursorRestarts from 2026-07-28 on, where a bad cursor
// means discard the pages and start again; 0 before, where a rejected cursor fails the round.
func CursorRestartsFor(protocolVersion string) int {
	if protocolVersion >= mcpsync.ProtocolVersion20260728 {
		return DefaultCursorRestarts
	}
	return 0
}

// EmptyCursor stands for a nextCursor that is present and empty.
//
// Decision (issue 13 item 7). MCP 2026-07-28, server/utilities/pagination, "Implementation
// Guidelines": clients "Don't make any determination based on cursor value other than whether
// a non-null value was provided (e.g. an empty string is a valid cursor and thus MUST NOT be
// treated as the end of results)" (docs/specification/2026-07-28/server/utilities/
// pagination.mdx of the specification). Older revisions only say "Treat a missing nextCursor
// as the end of results". So on a 2026-07-28 session a page with nextCursor "" is not the
// last page.
//
// The go-sdk v1.8.0 cannot carry the difference in either direction: ListResourcesResult and
// ListResourceTemplatesResult declare NextCursor as a string tagged "nextCursor,omitempty"
// (mcp/protocol.go:1236 and 1267), so an empty and an absent nextCursor both decode to "";
// ListResourcesParams.Cursor is omitempty too, so a request with cursor "" goes out without
// one and asks for the first page again; and its own iterator (mcp/client.go:1618) ends on
// "". Through a plain *mcp.ClientSession a nextCursor that reads "" is therefore taken as the
// end, since following it would restart the walk. A session whose transport is wrapped with
// [TranslateEmptyCursors] reports a present empty nextCursor as EmptyCursor and sends
// EmptyCursor back as cursor "": Scan follows it like any other cursor (digested, and caught
// by the cycle check if it repeats).
const EmptyCursor = "\x00mcpsync/empty-cursor\x00"

// MaxCursorRestarts bounds Options.CursorRestarts.
const MaxCursorRestarts = 10

// Progress counts what a round has listed so far.
type Progress struct {
	ResourcePages int
	TemplatePages int
	Resources     int
	Templates     int
}

// Pages is the number of pages requested, both lists together.
func (p Progress) Pages() int { return p.ResourcePages + p.TemplatePages }

// Entry is one listed resource or template: Kind is KindResource or KindTemplate, URI the
// normalized URI (the server's string if it cannot be normalized) or the template, ServerURI
// as listed.
type Entry = mcpsync.CatalogEntry

// Result is the outcome of a round. Complete rounds have SetDigest and Entries; failed ones
// have FailureKind (a contract.Round* kind) and Err, and what they saw until then.
type Result struct {
	Progress
	Complete    bool
	FailureKind string
	Err         error
	// Duplicates counts entries listed more than once (a moving keyset); Malformed counts
	// resource URIs that could not be normalized.
	Duplicates int
	Malformed  int
	// ResourceCursorDigests and TemplateCursorDigests are the digests of the cursors that
	// requested each page after the first; CursorChainDigest digests both sequences.
	ResourceCursorDigests []string
	TemplateCursorDigests []string
	CursorChainDigest     string
	// SetDigest is "sha256:<hex>" of the sorted (kind, server URI, name, MIME type) multiset.
	SetDigest string
	// SnapshotIDs are the distinct snapshot IDs seen, in first-seen order (at most 8);
	// SnapshotPages counts pages that carried one; SnapshotID is set when every page carried
	// one and the same ID.
	SnapshotIDs   []string
	SnapshotPages int
	SnapshotID    string
	// Entries are sorted by kind, server URI, name, MIME type.
	Entries []Entry
	// CursorRestarts counts the starts discarded after a rejected cursor
	// (Options.CursorRestarts); DiscardedPages counts their pages. Everything else in the
	// Result describes the last start only.
	CursorRestarts int
	DiscardedPages int
}

// SnapshotMetaKeyOf returns the _meta key a negotiated snapshot capability names in the
// server's capabilities object (JSON, as in the capability receipt), or
// DefaultSnapshotMetaKey.
func SnapshotMetaKeyOf(capabilities []byte) string {
	var caps struct {
		Experimental map[string]struct {
			MetaKey string `json:"metaKey"`
		} `json:"experimental"`
	}
	if len(capabilities) > 0 && json.Unmarshal(capabilities, &caps) == nil {
		if c, ok := caps.Experimental[SnapshotCapability]; ok && c.MetaKey != "" {
			return c.MetaKey
		}
	}
	return DefaultSnapshotMetaKey
}

// Scan runs one round on l: resources/list, then resources/templates/list, each from the
// first page until a page without nextCursor. A rejected cursor starts the round again
// (both lists from the first page, nothing kept) up to o.CursorRestarts times. It never
// returns an error: a failed round is a Result with FailureKind set.
func Scan(ctx context.Context, l Lister, o Options) Result {
	if o.MaxPages <= 0 {
		o.MaxPages = DefaultMaxPages
	}
	if o.MaxPageEntries <= 0 {
		o.MaxPageEntries = DefaultMaxPageEntries
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.SnapshotMetaKey == "" {
		o.SnapshotMetaKey = DefaultSnapshotMetaKey
	}
	o.CursorRestarts = min(max(o.CursorRestarts, 0), MaxCursorRestarts)
	spent := 0 // pages requested by discarded starts of this round
	for restarts := 0; ; restarts++ {
		r := &round{opts: o, chain: sha256.New(), spent: spent}
		res := r.scan(ctx, l)
		res.CursorRestarts, res.DiscardedPages = restarts, spent
		if res.FailureKind != contract.RoundCursorError || restarts >= o.CursorRestarts || ctx.Err() != nil {
			return res
		}
		// MCP 2026-07-28: a bad cursor means discard the pages and start again.
		spent += res.Pages()
	}
}

// entriesCapacity is the capacity of a round's entries slice for an entries hint: the hint
// and an eighth more, at most maxEntries (0 for no hint). The headroom keeps a set that grew
// since its last round in place: with the hint one short of 100,000 entries the last page
// moved every entry to a larger array, 18.6 MB allocated per round against 8.6 MB and ≈ 20 %
// more CPU (BenchmarkScanEntries); in the scan bench that round took ≈ 90 ms longer.
func entriesCapacity(hint, maxEntries int) int {
	if hint <= 0 {
		return 0
	}
	return min(hint+hint/8, maxEntries)
}

// scan is one start of a round: both lists from their first page.
func (r *round) scan(ctx context.Context, l Lister) Result {
	o := r.opts
	if o.CursorKey != nil {
		r.mac = hmac.New(sha256.New, o.CursorKey)
	}
	r.sink = newSink(entriesCapacity(o.EntriesHint, o.MaxEntries))
	ok := r.list(ctx, KindResource, func(ctx context.Context, cursor string) (mcp.Meta, string, error) {
		res, err := l.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
		if err != nil {
			return nil, "", err
		}
		if err := r.admit(KindResource, len(res.Resources)); err != nil {
			return nil, "", err
		}
		r.res.Resources += len(res.Resources) - countNil(res.Resources)
		r.sink.add(sinkPage{resources: res.Resources})
		return res.Meta, res.NextCursor, nil
	}) && r.list(ctx, KindTemplate, func(ctx context.Context, cursor string) (mcp.Meta, string, error) {
		res, err := l.ListResourceTemplates(ctx, &mcp.ListResourceTemplatesParams{Cursor: cursor})
		if err != nil {
			return nil, "", err
		}
		if err := r.admit(KindTemplate, len(res.ResourceTemplates)); err != nil {
			return nil, "", err
		}
		r.res.Templates += len(res.ResourceTemplates) - countNil(res.ResourceTemplates)
		r.sink.add(sinkPage{templates: res.ResourceTemplates})
		return res.Meta, res.NextCursor, nil
	})
	r.res.CursorChainDigest = "sha256:" + hex.EncodeToString(r.chain.Sum(nil))
	if r.res.SnapshotPages == r.res.Pages() && len(r.res.SnapshotIDs) == 1 && !r.idsOverflow {
		r.res.SnapshotID = r.res.SnapshotIDs[0]
	}
	entries, digest, dups, malformed := r.sink.finish(ok)
	r.res.Malformed = malformed
	if !ok {
		return r.res
	}
	r.res.Entries, r.res.SetDigest, r.res.Duplicates = entries, digest, dups
	r.res.Complete = true
	return r.res
}

// countNil counts the nil elements of a decoded page (a JSON null in the list).
func countNil[T any](xs []*T) int {
	n := 0
	for _, x := range xs {
		if x == nil {
			n++
		}
	}
	return n
}

type round struct {
	opts        Options
	spent       int // pages requested by earlier, discarded starts (they count against MaxPages)
	res         Result
	sink        *sink // builds the entries beside the paging
	chain       hash.Hash
	mac         hash.Hash
	idsOverflow bool
}

// list pages one list method; fetch appends the page's entries and returns its _meta and
// nextCursor. It reports whether the list ended normally.
func (r *round) list(ctx context.Context, kind string, fetch func(context.Context, string) (mcp.Meta, string, error)) bool {
	seen := map[string]bool{}
	cursor := ""
	for {
		if r.spent+r.res.Pages() >= r.opts.MaxPages {
			return r.fail(contract.RoundPageCap, fmt.Errorf("%s: page cap of %d pages reached", method(kind), r.opts.MaxPages))
		}
		if r.opts.Check != nil {
			if err := r.opts.Check(); err != nil {
				return r.fail(contract.RoundStaleSession, err)
			}
		}
		meta, next, err := fetch(ctx, cursor)
		var capErr *entryCapError
		if errors.As(err, &capErr) {
			return r.fail(contract.RoundEntryCap, err)
		}
		if err != nil {
			failure := classify(err, cursor != "")
			if failure == contract.RoundListError && r.opts.Check != nil && r.opts.Check() != nil {
				failure = contract.RoundStaleSession // the request failed because the session ended
			}
			return r.fail(failure, redact(fmt.Errorf("%s page %d: %w", method(kind), r.kindPages(kind)+1, err), cursor))
		}
		if kind == KindResource {
			r.res.ResourcePages++
		} else {
			r.res.TemplatePages++
		}
		r.snapshot(meta)
		if r.opts.Progress != nil {
			r.opts.Progress(r.res.Progress)
		}
		if next == "" {
			return true
		}
		d := r.cursorDigest(kind, next)
		if kind == KindResource {
			r.res.ResourceCursorDigests = append(r.res.ResourceCursorDigests, d)
		} else {
			r.res.TemplateCursorDigests = append(r.res.TemplateCursorDigests, d)
		}
		if seen[d] {
			return r.fail(contract.RoundCursorCycle, fmt.Errorf("%s: page %d returned a cursor already followed (digest %s)", method(kind), r.kindPages(kind), d[:12]))
		}
		seen[d] = true
		cursor = next
	}
}

// entryCapError is a page over the per-page entry cap, or one that takes the round over its
// per-round cap.
type entryCapError struct{ msg string }

func (e *entryCapError) Error() string { return e.msg }

// admit checks a page of n entries against the caps before any of them is kept.
func (r *round) admit(kind string, n int) error {
	page := r.kindPages(kind) + 1
	if n > r.opts.MaxPageEntries {
		return &entryCapError{fmt.Sprintf("%s page %d listed %d entries, over the cap of %d per page", method(kind), page, n, r.opts.MaxPageEntries)}
	}
	if total := r.res.Resources + r.res.Templates + n; total > r.opts.MaxEntries {
		return &entryCapError{fmt.Sprintf("%s page %d takes the round to %d entries, over the cap of %d per round", method(kind), page, total, r.opts.MaxEntries)}
	}
	return nil
}

func (r *round) kindPages(kind string) int {
	if kind == KindResource {
		return r.res.ResourcePages
	}
	return r.res.TemplatePages
}

func (r *round) fail(kind string, err error) bool {
	r.res.FailureKind, r.res.Err = kind, err
	return false
}

func (r *round) cursorDigest(kind, cursor string) string {
	var sum []byte
	if r.mac != nil {
		r.mac.Reset()
		r.mac.Write([]byte(kind))
		r.mac.Write([]byte{0})
		r.mac.Write([]byte(cursor))
		sum = r.mac.Sum(nil)
	} else {
		s := sha256.Sum256([]byte(cursor))
		sum = s[:]
	}
	d := hex.EncodeToString(sum)
	r.chain.Write([]byte(kind[:1] + d + "\n"))
	return d
}

func (r *round) snapshot(meta mcp.Meta) {
	id, ok := meta[r.opts.SnapshotMetaKey].(string)
	if !ok || id == "" {
		return
	}
	r.res.SnapshotPages++
	if slices.Contains(r.res.SnapshotIDs, id) {
		return
	}
	if len(r.res.SnapshotIDs) >= maxSnapshotIDs {
		r.idsOverflow = true
		return
	}
	r.res.SnapshotIDs = append(r.res.SnapshotIDs, id)
}

func method(kind string) string {
	if kind == KindTemplate {
		return "resources/templates/list"
	}
	return "resources/list"
}

// redactedError hides a cursor that a server echoed in its error message: a cursor never
// leaves the round, not even in a failure text (R2).
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

func redact(err error, cursor string) error {
	if cursor == "" || !strings.Contains(err.Error(), cursor) {
		return err
	}
	return &redactedError{msg: strings.ReplaceAll(err.Error(), cursor, "<cursor>"), err: err}
}

// classify maps a list request's error to a round failure kind.
func classify(err error, withCursor bool) string {
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
		return contract.RoundStaleSession
	}
	var werr *jsonrpc.Error
	if withCursor && errors.As(err, &werr) && werr.Code == jsonrpc.CodeInvalidParams {
		return contract.RoundCursorError
	}
	return contract.RoundListError
}

// setDigest sorts entries and digests the multiset; it also counts entries listed twice.
func setDigest(entries []Entry) (string, int) {
	slices.SortFunc(entries, compareEntries)
	h := sha256.New()
	var buf bytes.Buffer
	dups := 0
	for i := range entries {
		e := &entries[i]
		if i > 0 && entries[i-1].Kind == e.Kind && entries[i-1].ServerURI == e.ServerURI {
			dups++
		}
		writeEntry(h, &buf, e)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), dups
}

// writeEntry adds one entry to a set digest: kind, server URI, name and MIME type, each
// ended by a NUL, the last by a newline.
func writeEntry(h hash.Hash, buf *bytes.Buffer, e *Entry) {
	buf.Reset()
	buf.WriteString(e.Kind)
	buf.WriteByte(0)
	buf.WriteString(e.ServerURI)
	buf.WriteByte(0)
	buf.WriteString(e.Name)
	buf.WriteByte(0)
	buf.WriteString(e.MIMEType)
	buf.WriteByte('\n')
	h.Write(buf.Bytes())
}

func compareEntries(a, b Entry) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ServerURI, b.ServerURI),
		cmp.Compare(a.Name, b.Name), cmp.Compare(a.MIMEType, b.MIMEType))
}
