package gateway

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/readguard"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// What a principal sees (issue 15 item 3): resources/list and resources/read answered from
// the ledger, for the principal whose server it is, never from the upstream server.

// Keys of the gateway's _meta entries.
const (
	// MetaVersion (on a read result and its content) holds the ResourceVersion served.
	MetaVersion = "mcpsync/version"
	// MetaUpstream (on each listed resource) holds its Upstream.
	MetaUpstream = "mcpsync/upstream"
	// MetaCatalog (on a listed resource the source's latest catalog names) holds its CatalogMeta.
	MetaCatalog = "mcpsync/catalog"
	// MetaSubscription (on a listed resource the principal subscribes to) holds its SubscriptionMeta.
	MetaSubscription = "mcpsync/subscription"
)

// Upstream names the upstream resource behind a gateway URI: the source and the upstream
// URI in its normalized form (the identity the ledger keys subscriptions by); ServerURI is
// the server's own spelling when it differs.
type Upstream struct {
	Source    string `json:"source"`
	URI       string `json:"uri"`
	ServerURI string `json:"serverUri,omitempty"`
}

// CatalogMeta says which catalog listed a resource and how well it is proven (R5-R7): a
// catalog's set is trustworthy only at ProofLevel SNAPSHOT_PROVEN or SNAPSHOT_UNPROVEN and
// while Invalidated is false.
type CatalogMeta struct {
	ID                    int64     `json:"id"`
	ProofLevel            string    `json:"proofLevel"`
	MeasuredAt            time.Time `json:"measuredAt"`
	StalenessBoundSeconds int64     `json:"stalenessBoundSeconds"`
	Invalidated           bool      `json:"invalidated"`
}

// SubscriptionMeta is the principal's subscription to a listed resource.
type SubscriptionMeta struct {
	State          mcpsync.State `json:"state"`
	LastAcceptedAt *time.Time    `json:"lastAcceptedAt,omitempty"`
	Digest         string        `json:"digest,omitempty"` // of the latest accepted version
}

// ResourceVersion is _meta["mcpsync/version"] of a read: the resourceVersion.v1 (R15) of the
// bytes served, with the freshness the ledger vouches for and the output guard's verdict
// (R22). Digest is the SHA-256 of the accepted bytes; the bytes served are those bytes unless
// Guard.Outcome is SANITIZED (then Guard.DeliveredDigest names them).
type ResourceVersion struct {
	Schema            string    `json:"schema"` // "resourceVersion.v1"
	Source            string    `json:"source"`
	URI               string    `json:"uri"` // upstream URI, normalized
	MIMEType          string    `json:"mimeType"`
	Digest            string    `json:"digest"` // "sha256:<hex>"
	Size              int64     `json:"size"`
	VersionID         int64     `json:"versionId"`
	ReadOrdinal       int64     `json:"readOrdinal"`
	Generation        int64     `json:"generation"`        // subscription generation
	SessionGeneration int64     `json:"sessionGeneration"` // source session generation
	AuthSubject       string    `json:"authSubject"`
	ServerName        string    `json:"serverName,omitempty"`
	ServerVersion     string    `json:"serverVersion,omitempty"` // upstream implementation version
	LastModified      string    `json:"lastModified,omitempty"`  // a hint only, never compared
	AcceptedAt        time.Time `json:"acceptedAt"`
	// VerifiedAt is the last time a read confirmed this version (accepted or revalidated).
	VerifiedAt *time.Time    `json:"verifiedAt,omitempty"`
	State      mcpsync.State `json:"state"` // the subscription's state
	// Refresh is how a change reaches mcpsync while the subscription is live: "notification"
	// (resources/subscribe upstream plus a backstop re-read) or "polling" (also for a URI the
	// server left out of its 2026-07-28 subscriptions/listen acknowledgement: not watched,
	// R11); "none" when it is not live, and then StalenessBoundSeconds is 0: unbounded.
	Refresh               string    `json:"refresh"`
	StalenessBoundSeconds int       `json:"stalenessBoundSeconds"`
	GrantEpoch            int64     `json:"grantEpoch"`
	Guard                 GuardMeta `json:"guard"`
}

// GuardMeta is the output guard's verdict on the version under the gateway's policy.
type GuardMeta struct {
	PolicyID        string   `json:"policyId"`
	Outcome         string   `json:"outcome"`
	DeliveredDigest string   `json:"deliveredDigest"`
	Stripped        int      `json:"stripped,omitempty"`
	Reasons         []string `json:"reasons,omitempty"`
}

// Reasons in the data of a resources/read or resources/list error (ErrorData.Reason). Every
// one is sent with code -32602 (invalid params), except ReasonInternal (-32603).
const (
	ReasonBadURI        = "bad_uri"        // not a gateway URI, or its upstream URI is malformed
	ReasonNoGrant       = "no_grant"       // no such source, or no standing grant on it
	ReasonRevoked       = "revoked"        // the principal's grant on the source was revoked
	ReasonNotSubscribed = "not_subscribed" // the principal has no subscription to the resource
	ReasonNoVersion     = "no_version"     // no version was accepted yet
	ReasonDeleted       = "deleted"        // the newest version is a tombstone
	ReasonGuardRejected = "guard_rejected" // the output guard rejected the content
	ReasonNotPublished  = "not_published"  // held back by the roll-out (R30)
	ReasonBadCursor     = "bad_cursor"     // a resources/list cursor this gateway did not issue
	ReasonInternal      = "internal"       // the ledger failed; try again
)

// ErrorData is the data of the gateway's JSON-RPC errors: the URI (or cursor) asked for and
// why it was refused.
type ErrorData struct {
	URI    string `json:"uri,omitempty"`
	Reason string `json:"reason"`
}

// refuse returns the JSON-RPC error a client sees for reason.
func refuse(reason, what, format string, args ...any) *jsonrpc.Error {
	code := int64(jsonrpc.CodeInvalidParams)
	if reason == ReasonInternal {
		code = jsonrpc.CodeInternalError
	}
	data, _ := json.Marshal(ErrorData{URI: what, Reason: reason})
	return &jsonrpc.Error{Code: code, Message: fmt.Sprintf(format, args...), Data: data}
}

// resourceMiddleware answers resources/list and resources/read on principal's server; every
// other method goes on to the SDK. A request whose token names another principal (it cannot
// happen: sessions are bound to their principal and servers chosen by it) is refused.
func (g *Gateway) resourceMiddleware(principal string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "resources/list" && method != "resources/read" {
				return next(ctx, method, req)
			}
			if p, _, ok := principalFromExtra(req.GetExtra()); ok && p != principal {
				return nil, refuse(ReasonNoGrant, "", "this session belongs to another principal")
			}
			switch r := req.(type) {
			case *mcp.ListResourcesRequest:
				return g.listResources(ctx, principal, r.Params)
			case *mcp.ReadResourceRequest:
				return g.readResource(ctx, principal, r.Params)
			}
			return next(ctx, method, req)
		}
	}
}

// private is the cache control of every list and read answer (2026-07-28): the principal's
// own, only as fresh as the ledger, so no client cache may serve it again or share it. (The
// SDK's SetCacheable applies only to results its own handlers build.)
var private = mcp.Cacheable{TTLMs: 0, CacheScope: "private"}

// listed is one visible resource.
type listed struct {
	key string // its gateway URI; the list's order
	res *mcp.Resource
}

// listResources answers resources/list: the resources of the sources principal holds a
// standing grant on — the entries of each source's latest catalog (with its proof level) and
// every resource principal subscribes to — ordered by gateway URI, Options.PageSize per page.
// The cursor is the last gateway URI of the previous page, so a page never repeats or skips a
// resource that stays visible between the calls.
func (g *Gateway) listResources(ctx context.Context, principal string, params *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error) {
	after := ""
	if params != nil && params.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(params.Cursor)
		if err != nil || len(b) == 0 {
			return nil, refuse(ReasonBadCursor, params.Cursor, "invalid cursor %q: not one this gateway issued; list again from the start", params.Cursor)
		}
		after = string(b)
	}
	all, err := g.visible(ctx, principal)
	if err != nil {
		g.opts.Logger.Warn("gateway: list resources", zap.String("principal", principal), zap.Error(err))
		return nil, refuse(ReasonInternal, "", "the gateway could not read the ledger; try again")
	}
	i, _ := slices.BinarySearchFunc(all, after, func(l listed, k string) int {
		if l.key <= k {
			return -1
		}
		return 1
	})
	page := all[i:]
	out := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}, Cacheable: private}
	if len(page) > g.opts.PageSize {
		page = page[:g.opts.PageSize]
		out.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(page[len(page)-1].key))
	}
	for _, l := range page {
		out.Resources = append(out.Resources, l.res)
	}
	return out, nil
}

// visible computes what principal may list, ordered by gateway URI.
func (g *Gateway) visible(ctx context.Context, principal string) ([]listed, error) {
	st := g.opts.Store
	grants, err := st.Grants(ctx, principal)
	if err != nil {
		return nil, err
	}
	byKey := map[string]*mcp.Resource{}
	add := func(source, norm, serverURI, name, mime string) *mcp.Resource {
		key := URI{Source: source, Upstream: norm}.String()
		if r, ok := byKey[key]; ok {
			return r
		}
		up := Upstream{Source: source, URI: norm}
		if serverURI != norm {
			up.ServerURI = serverURI
		}
		r := &mcp.Resource{URI: key, Name: cmp.Or(name, norm), MIMEType: mime, Meta: mcp.Meta{MetaUpstream: up}}
		byKey[key] = r
		return r
	}
	standing := map[int64]bool{}
	for _, gr := range grants {
		if !gr.Standing() {
			continue
		}
		standing[gr.SourceID] = true
		c, err := st.LatestCatalog(ctx, gr.SourceID)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		entries, err := st.CatalogEntries(ctx, c.ID)
		if err != nil {
			return nil, err
		}
		cm := CatalogMeta{ID: c.ID, ProofLevel: string(c.Level), MeasuredAt: c.MeasuredAt.UTC(),
			StalenessBoundSeconds: int64(c.StalenessBound / time.Second), Invalidated: c.InvalidatedAt != nil}
		for _, e := range entries {
			if e.Kind != ledger.EntryResource {
				continue
			}
			add(gr.SourceName, e.URI, e.ServerURI, e.Name, e.MIMEType).Meta[MetaCatalog] = cm
		}
	}
	subs, err := st.ListSubscriptions(ctx, ledger.SubscriptionFilter{Principal: principal})
	if err != nil {
		return nil, err
	}
	for _, s := range subs {
		if !standing[s.SourceID] {
			continue
		}
		r := add(s.SourceName, s.URI, s.ServerURI, "", "")
		r.Meta[MetaSubscription] = SubscriptionMeta{State: s.State, LastAcceptedAt: s.LastAcceptedAt, Digest: s.LastAcceptedDigest}
	}
	out := make([]listed, 0, len(byKey))
	for k, r := range byKey {
		out = append(out, listed{key: k, res: r})
	}
	slices.SortFunc(out, func(a, b listed) int { return cmp.Compare(a.key, b.key) })
	return out, nil
}

// readResource answers resources/read for principal: the latest accepted version's bytes
// through the output guard (ledger.Store.Read, which holds the grant row while it reads, so
// nothing is served once a revocation committed; R22-R24), with its ResourceVersion in
// _meta. Anything else — a malformed or unknown URI, no standing grant, no subscription, no
// accepted version, a tombstone, a guard rejection — is a JSON-RPC error saying which (the
// ErrorData reason), never stale or unguarded content.
func (g *Gateway) readResource(ctx context.Context, principal string, params *mcp.ReadResourceParams) (*mcp.ReadResourceResult, error) {
	if params == nil || params.URI == "" {
		return nil, refuse(ReasonBadURI, "", "resources/read needs a uri (mcpsync://SOURCE/ENCODED-UPSTREAM-URI)")
	}
	raw := params.URI
	u, err := ParseURI(raw)
	if err != nil {
		return nil, refuse(ReasonBadURI, raw, "bad gateway URI: %v", err)
	}
	norm, err := uri.Normalize(u.Upstream)
	if err != nil {
		return nil, refuse(ReasonBadURI, raw, "bad gateway URI %q: its upstream URI is malformed: %v", raw, err)
	}
	st := g.opts.Store
	noGrant := refuse(ReasonNoGrant, raw, "%s: principal %q holds no standing grant on a source named %q", raw, principal, u.Source)
	src, err := st.SourceByName(ctx, u.Source)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return nil, noGrant // an unknown source reads as an ungranted one: names are not disclosed
	case err != nil:
		return nil, g.internal(raw, principal, err)
	}
	pol := readguard.Policy()
	res, err := st.Read(ctx, ledger.ReadRequest{Principal: principal, SourceID: src.ID, URI: norm, PolicyID: pol.ID()},
		readguard.Evaluator(pol))
	var ge *ledger.GrantError
	var refusal *ledger.GuardRefusal
	switch {
	case errors.As(err, &ge) && ge.RevocationID != 0:
		return nil, refuse(ReasonRevoked, raw, "%s: the grant of principal %q on source %q was revoked (revocation %d)", raw, principal, u.Source, ge.RevocationID)
	case errors.Is(err, ledger.ErrNoGrant):
		return nil, noGrant
	case errors.Is(err, ledger.ErrNotPublished):
		return nil, refuse(ReasonNotPublished, raw, "%s is not published under the current roll-out", raw)
	case errors.As(err, &refusal):
		return nil, refuse(ReasonGuardRejected, raw, "%s: the output guard rejected the accepted content: %s", raw, refusal.Error())
	case errors.Is(err, ledger.ErrNotFound) && res.SourceName != "":
		switch {
		case res.SubscriptionID == 0:
			return nil, refuse(ReasonNotSubscribed, raw, "%s: principal %q has no subscription to it; resources/subscribe first", raw, principal)
		case res.Version.ID == 0:
			return nil, refuse(ReasonNoVersion, raw, "%s: no accepted version yet (subscription %s)", raw, res.State)
		default:
			return nil, refuse(ReasonDeleted, raw, "%s was deleted upstream (tombstone at read ordinal %d)", raw, res.Version.ReadOrdinal)
		}
	case errors.Is(err, ledger.ErrNotFound):
		return nil, noGrant // the source vanished between the two statements
	case err != nil:
		return nil, g.internal(raw, principal, err)
	}
	rv := toResourceVersion(u.Source, res, pol.ID())
	c := &mcp.ResourceContents{URI: raw, MIMEType: res.Version.MIMEType, Meta: mcp.Meta{MetaVersion: rv}}
	if readguard.IsText(res.Body) {
		c.Text = string(res.Body)
	} else {
		c.Blob = res.Body
	}
	return &mcp.ReadResourceResult{Meta: mcp.Meta{MetaVersion: rv}, Contents: []*mcp.ResourceContents{c}, Cacheable: private}, nil
}

// internal logs a ledger failure and returns the error the client sees, which says nothing
// of the ledger.
func (g *Gateway) internal(raw, principal string, err error) *jsonrpc.Error {
	g.opts.Logger.Warn("gateway: read failed", zap.String("principal", principal), zap.String("uri", raw), zap.Error(err))
	return refuse(ReasonInternal, raw, "%s: the gateway could not read the ledger; try again", raw)
}

// refreshNames maps the ledger's refresh modes to the ones ResourceVersion reports. The
// ledger already reports a not-acknowledged URI as "poll", so it is "polling" here.
var refreshNames = map[string]string{"notify": "notification", "poll": "polling", "": "none"}

func toResourceVersion(source string, res ledger.ReadResult, policyID string) ResourceVersion {
	v := res.Version
	rv := ResourceVersion{
		Schema: "resourceVersion.v1", Source: source, URI: v.URI, MIMEType: v.MIMEType, Digest: v.Digest,
		Size: v.Size, VersionID: v.ID, ReadOrdinal: v.ReadOrdinal, Generation: v.Generation,
		SessionGeneration: v.SessionGeneration, AuthSubject: v.AuthSubject, ServerName: v.ServerName,
		ServerVersion: v.ServerVersion, LastModified: v.LastModified, AcceptedAt: v.AcceptedAt.UTC(),
		VerifiedAt: res.LastVerifiedAt, State: res.State, Refresh: cmp.Or(refreshNames[res.Refresh], res.Refresh),
		StalenessBoundSeconds: res.StalenessBoundSeconds, GrantEpoch: res.GrantEpoch,
		Guard: GuardMeta{PolicyID: policyID},
	}
	if res.Verdict != nil {
		rv.Guard.Outcome, rv.Guard.DeliveredDigest = res.Verdict.Outcome, res.Verdict.DeliveredDigest
		rv.Guard.Stripped, rv.Guard.Reasons = res.Verdict.Stripped, res.Verdict.Reasons
	}
	return rv
}
