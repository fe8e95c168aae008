package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

// readErr asserts that err is the gateway's JSON-RPC error with code and reason and returns
// its message.
func readErr(t *testing.T, err error, code int64, reason string) string {
	t.Helper()
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		t.Fatalf("error %v (%T) is not a JSON-RPC error", err, err)
	}
	var data gateway.ErrorData
	if len(je.Data) > 0 {
		if err := json.Unmarshal(je.Data, &data); err != nil {
			t.Fatalf("error data %s: %v", je.Data, err)
		}
	}
	if je.Code != code || data.Reason != reason {
		t.Errorf("error %d %q (reason %q), want code %d reason %q", je.Code, je.Message, data.Reason, code, reason)
	}
	return je.Message
}

// listAll lists every resource the session sees, page by page, failing on a repeated cursor.
func listAll(t *testing.T, c *Client) (map[string]*mcp.Resource, int) {
	t.Helper()
	out := map[string]*mcp.Resource{}
	cursor, pages := "", 0
	for {
		res, err := c.ListResources(t.Context(), &mcp.ListResourcesParams{Cursor: cursor})
		if err != nil {
			t.Fatalf("resources/list (cursor %q): %v", cursor, err)
		}
		pages++
		for _, r := range res.Resources {
			if _, dup := out[r.URI]; dup {
				t.Errorf("resource %s listed twice", r.URI)
			}
			out[r.URI] = r
		}
		if res.NextCursor == "" {
			return out, pages
		}
		if res.NextCursor == cursor || pages > 100 {
			t.Fatalf("cursor %q repeats", cursor)
		}
		cursor = res.NextCursor
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// The gateway's list and read through real go-sdk clients of both eras: alice sees the
// resources of the sources she holds a grant on (the catalog's entries, with its proof level,
// and her subscriptions), reads the accepted bytes with their resourceVersion.v1 (digest =
// SHA-256 of the bytes), never sees bob's source, is refused bad URIs with the reason, and
// once her grant is revoked, her reads fail at once and the source leaves her list.
func TestListAndRead(t *testing.T) {
	s := newGWStack(t, func(o *gateway.Options) { o.PageSize = 2 })
	for i := range 4 {
		s.Put(fmt.Sprintf("demo://notes/%d", i), fmt.Sprintf("body %d\n", i))
	}
	s.Upstream.Set("demo://odd%20path/%C3%BC?x=1&y=a%2Fb", "odd body\n", "text/markdown")
	s.MustCLI("source", "add", "private", "--url", s.UpstreamURL)
	s.Grant("alice", testSource)
	s.Grant("bob", "private")
	aliceTok, bobTok := s.Token("alice"), s.Token("bob")
	s.Subscribe("alice", testSource, "demo://notes/1", "body 1\n")
	s.Subscribe("alice", testSource, "demo://odd%20path/%C3%BC?x=1&y=a%2Fb", "odd body\n")
	s.Subscribe("bob", "private", "demo://notes/2", "body 2\n")
	s.MustCLI("scan", testSource, "--wait")
	// Bob's source too: the scan its source workflow starts at its first session may still be
	// running when bob lists.
	s.MustCLI("scan", "private", "--wait")

	notes1 := GatewayURI(testSource, "demo://notes/1")
	odd := GatewayURI(testSource, "demo://odd%20path/%C3%BC?x=1&y=a%2Fb")
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			alice := s.MustConnect(aliceTok, era, nil)
			listed, pages := listAll(t, alice)
			var got []string
			for u := range listed {
				got = append(got, u)
			}
			slices.Sort(got)
			want := []string{GatewayURI(testSource, "demo://notes/0"), notes1, GatewayURI(testSource, "demo://notes/2"),
				GatewayURI(testSource, "demo://notes/3"), odd}
			slices.Sort(want)
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("alice's list (-want +got):\n%s", d)
			}
			if pages != 3 {
				t.Errorf("5 resources in pages of 2 came in %d pages", pages)
			}
			r := listed[notes1]
			if r == nil {
				t.Fatal("notes/1 not listed")
			}
			var up gateway.Upstream
			remarshal(t, r.Meta[gateway.MetaUpstream], &up)
			if d := cmp.Diff(gateway.Upstream{Source: testSource, URI: "demo://notes/1"}, up); d != "" {
				t.Errorf("upstream meta (-want +got):\n%s", d)
			}
			var cat gateway.CatalogMeta
			remarshal(t, r.Meta[gateway.MetaCatalog], &cat)
			if cat.ID == 0 || cat.ProofLevel == "" {
				t.Errorf("catalog meta %+v: no catalog or proof level", cat)
			}
			var sub gateway.SubscriptionMeta
			remarshal(t, r.Meta[gateway.MetaSubscription], &sub)
			if sub.State != "ACTIVE" || sub.Digest != sha("body 1\n") {
				t.Errorf("subscription meta %+v", sub)
			}
			if _, ok := listed[GatewayURI(testSource, "demo://notes/0")].Meta[gateway.MetaSubscription]; ok {
				t.Error("notes/0 (not subscribed) carries subscription meta")
			}

			for _, tc := range []struct{ uri, body, mime string }{
				{notes1, "body 1\n", "text/plain"}, {odd, "odd body\n", "text/markdown"},
			} {
				res, err := alice.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: tc.uri})
				if err != nil {
					t.Fatalf("read %s: %v", tc.uri, err)
				}
				if len(res.Contents) != 1 || res.Contents[0].Text != tc.body || res.Contents[0].URI != tc.uri || res.Contents[0].MIMEType != tc.mime {
					t.Fatalf("read %s: contents %+v", tc.uri, res.Contents)
				}
				if era == era2026 && (res.CacheScope != "private" || res.TTLMs != 0) {
					t.Errorf("read %s: cache control ttlMs %d scope %q, want 0 and private", tc.uri, res.TTLMs, res.CacheScope)
				}
				rv := VersionMeta(t, res.Meta)
				if rv.Digest != sha(res.Contents[0].Text) {
					t.Errorf("version digest %s, SHA-256 of the bytes %s", rv.Digest, sha(res.Contents[0].Text))
				}
				if rv.Schema != "resourceVersion.v1" || rv.ReadOrdinal < 1 || rv.Generation < 1 || rv.SessionGeneration < 1 ||
					rv.ServerName != "chaos" || rv.ServerVersion != "1.2.3" || rv.MIMEType != tc.mime || rv.AcceptedAt.IsZero() ||
					rv.Refresh != "notification" || rv.StalenessBoundSeconds <= 0 || rv.Guard.Outcome != "PASS" ||
					rv.Guard.DeliveredDigest != rv.Digest || rv.Source != testSource {
					t.Errorf("resourceVersion.v1 of %s: %+v", tc.uri, rv)
				}
				if d := cmp.Diff(rv, VersionMeta(t, res.Contents[0].Meta)); d != "" {
					t.Errorf("content meta differs from result meta (-result +content):\n%s", d)
				}
			}

			// Bad input: one clear error each, with its reason.
			for _, tc := range []struct {
				uri, reason, msg string
			}{
				{"demo://notes/1", gateway.ReasonBadURI, "does not start with mcpsync://"},
				{"mcpsync://docs", gateway.ReasonBadURI, "no source name"},
				{"mcpsync://docs/a/b", gateway.ReasonBadURI, "one percent-encoded path segment"},
				{"mcpsync://docs/" + "%zz", gateway.ReasonBadURI, "bad gateway URI"},
				{GatewayURI(testSource, "not a uri"), gateway.ReasonBadURI, "upstream URI is malformed"},
				{GatewayURI("nosuch", "demo://notes/1"), gateway.ReasonNoGrant, "no standing grant"},
				{GatewayURI("private", "demo://notes/2"), gateway.ReasonNoGrant, "no standing grant"},
				{GatewayURI(testSource, "demo://notes/3"), gateway.ReasonNotSubscribed, "no subscription"},
			} {
				_, err := alice.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: tc.uri})
				if msg := readErr(t, err, jsonrpc.CodeInvalidParams, tc.reason); !strings.Contains(msg, tc.msg) {
					t.Errorf("read %q: message %q does not say %q", tc.uri, msg, tc.msg)
				}
			}
			_, err := alice.ListResources(t.Context(), &mcp.ListResourcesParams{Cursor: "!!"})
			readErr(t, err, jsonrpc.CodeInvalidParams, gateway.ReasonBadCursor)

			// Bob sees his own source only (its catalog and his subscription), and cannot read alice's resources.
			bob := s.MustConnect(bobTok, era, nil)
			bobs, _ := listAll(t, bob)
			var bobWant []string
			for _, u := range want {
				bobWant = append(bobWant, strings.Replace(u, "mcpsync://"+testSource+"/", "mcpsync://private/", 1))
			}
			if d := cmp.Diff(bobWant, keys(bobs)); d != "" {
				t.Errorf("bob's list (-want +got):\n%s", d)
			}
			if _, ok := bobs[GatewayURI("private", "demo://notes/2")].Meta[gateway.MetaSubscription]; !ok {
				t.Error("bob's subscription is not in his list's meta")
			}
			_, err = bob.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: notes1})
			readErr(t, err, jsonrpc.CodeInvalidParams, gateway.ReasonNoGrant)
			res, err := bob.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: GatewayURI("private", "demo://notes/2")})
			if err != nil || res.Contents[0].Text != "body 2\n" {
				t.Errorf("bob's read: %v %+v", err, res)
			}
		})
	}

	// Through the output guard: a binary body is rejected (not a textual type), a body with
	// control characters is delivered sanitized, its meta naming both digests.
	bin := string([]byte{0, 1, 2, 0xff})
	s.Upstream.SetBlob("demo://bin/1", []byte(bin), "application/octet-stream")
	s.Put("demo://ctl", "a\x1b[31mb\n")
	s.Subscribe("alice", testSource, "demo://bin/1", bin)
	s.Subscribe("alice", testSource, "demo://ctl", "a\x1b[31mb\n")
	for _, era := range eras {
		alice := s.MustConnect(aliceTok, era, nil)
		_, err := alice.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: GatewayURI(testSource, "demo://bin/1")})
		if msg := readErr(t, err, jsonrpc.CodeInvalidParams, gateway.ReasonGuardRejected); !strings.Contains(msg, "not allowed") {
			t.Errorf("%s: guard rejection message %q does not give the reason", era, msg)
		}
		res, err := alice.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: GatewayURI(testSource, "demo://ctl")})
		if err != nil {
			t.Fatalf("%s: read sanitized: %v", era, err)
		}
		rv := VersionMeta(t, res.Meta)
		if got := res.Contents[0].Text; got != "a[31mb\n" || rv.Guard.Outcome != "SANITIZED" || rv.Guard.Stripped != 1 ||
			rv.Digest != sha("a\x1b[31mb\n") || rv.Guard.DeliveredDigest != sha(got) {
			t.Errorf("%s: sanitized read %q with %+v", era, got, rv)
		}
	}

	// Revocation: the read fails at once, the source leaves the list (both eras).
	s.MustCLI("revoke", "alice", testSource)
	for _, era := range eras {
		alice := s.MustConnect(aliceTok, era, nil)
		_, err := alice.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: notes1})
		if msg := readErr(t, err, jsonrpc.CodeInvalidParams, gateway.ReasonRevoked); !strings.Contains(msg, "revoked") {
			t.Errorf("%s: read after revoke: %q", era, msg)
		}
		if listed, _ := listAll(t, alice); len(listed) != 0 {
			t.Errorf("%s: alice still lists %v after the revocation", era, keys(listed))
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
