package discovery_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/discovery"
)

// pager lists fixed pages of resources (and one page of templates), the cursor being the
// next page's index.
type pager struct {
	pages     [][]*mcp.Resource
	templates []*mcp.ResourceTemplate
}

func (p *pager) ListResources(_ context.Context, params *mcp.ListResourcesParams) (*mcp.ListResourcesResult, error) {
	i := 0
	if params.Cursor != "" {
		i, _ = strconv.Atoi(params.Cursor)
	}
	res := &mcp.ListResourcesResult{Resources: p.pages[i]}
	if i+1 < len(p.pages) {
		res.NextCursor = strconv.Itoa(i + 1)
	}
	return res, nil
}

func (p *pager) ListResourceTemplates(context.Context, *mcp.ListResourceTemplatesParams) (*mcp.ListResourceTemplatesResult, error) {
	return &mcp.ListResourceTemplatesResult{ResourceTemplates: p.templates}, nil
}

// paged splits uris into pages of size n.
func paged(n int, uris ...string) *pager {
	p := &pager{templates: []*mcp.ResourceTemplate{{URITemplate: "demo://t/{x}", Name: "t"}, nil}}
	for c := range slices.Chunk(uris, n) {
		var page []*mcp.Resource
		for _, u := range c {
			page = append(page, &mcp.Resource{URI: u, Name: "n", MIMEType: "text/plain"})
		}
		p.pages = append(p.pages, page)
	}
	return p
}

// The set digest, the entries and the duplicate count describe the multiset, whatever the
// order the server lists it in: entries are digested as they arrive while they arrive in set
// order, and sorted at the end once one does not (the last page, a middle page, the first).
func TestScanDigestIsOrderFree(t *testing.T) {
	var sorted []string
	for i := range 50 {
		sorted = append(sorted, fmt.Sprintf("demo://r/%03d", i))
	}
	sorted = append(sorted, "demo://r/049") // listed twice, adjacent
	slices.Sort(sorted)
	reversed := slices.Clone(sorted)
	slices.Reverse(reversed)
	lastSwapped := slices.Clone(sorted)
	n := len(lastSwapped)
	lastSwapped[n-1], lastSwapped[n-2] = lastSwapped[n-2], lastSwapped[n-1]
	middle := slices.Clone(sorted)
	middle[20], middle[30] = middle[30], middle[20]
	want := discovery.Scan(t.Context(), paged(7, sorted...), discovery.Options{})
	if !want.Complete || want.Duplicates != 1 || want.Resources != 51 || want.Templates != 1 {
		t.Fatalf("sorted listing: complete %v, %d resources, %d templates, %d duplicates; want complete, 51, 1, 1",
			want.Complete, want.Resources, want.Templates, want.Duplicates)
	}
	for _, tc := range []struct {
		name string
		uris []string
	}{{"reversed", reversed}, {"last two swapped", lastSwapped}, {"middle swapped", middle}} {
		t.Run(tc.name, func(t *testing.T) {
			got := discovery.Scan(t.Context(), paged(7, tc.uris...), discovery.Options{})
			type view struct {
				Digest     string
				Duplicates int
				Entries    []discovery.Entry
			}
			if diff := cmp.Diff(view{want.SetDigest, want.Duplicates, want.Entries}, view{got.SetDigest, got.Duplicates, got.Entries}); diff != "" {
				t.Errorf("(-sorted listing +%s):\n%s", tc.name, diff)
			}
		})
	}
	renamed := paged(7, sorted...)
	renamed.pages[6][1].Name = "other"
	if got := discovery.Scan(t.Context(), renamed, discovery.Options{}); got.SetDigest == want.SetDigest {
		t.Errorf("a renamed resource on the last page left the digest at %s", got.SetDigest)
	}
}

// An entries hint (the last round's count) changes where the entries are built, never what the
// round returns: a hint below the count (the page that overflows it moves to a larger array),
// the count itself, above it, and none give the same Result, in set order and out of it, with
// duplicates, malformed URIs and templates.
func TestScanEntriesHint(t *testing.T) {
	var sorted []string
	for i := range 40 {
		sorted = append(sorted, fmt.Sprintf("demo://r/%03d", i))
	}
	sorted = append(sorted, "demo://r/017", "not a uri %zz") // a duplicate and a malformed URI
	slices.Sort(sorted)
	reversed := slices.Clone(sorted)
	slices.Reverse(reversed)
	for _, listing := range []struct {
		name string
		uris []string
	}{{"in set order", sorted}, {"reversed", reversed}} {
		want := discovery.Scan(t.Context(), paged(7, listing.uris...), discovery.Options{})
		if !want.Complete || want.Duplicates != 1 || want.Malformed != 1 || len(want.Entries) != 43 {
			t.Fatalf("%s without a hint: complete %v, %d duplicates, %d malformed, %d entries; want complete, 1, 1, 43",
				listing.name, want.Complete, want.Duplicates, want.Malformed, len(want.Entries))
		}
		// The last hint is over the round's entry cap, which bounds it.
		for _, o := range []discovery.Options{{EntriesHint: 1}, {EntriesHint: 7}, {EntriesHint: 20}, {EntriesHint: 43},
			{EntriesHint: 44}, {EntriesHint: 1000}, {EntriesHint: 1 << 20, MaxEntries: 50}} {
			got := discovery.Scan(t.Context(), paged(7, listing.uris...), o)
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
				t.Errorf("%s, hint %d (-no hint +hint):\n%s", listing.name, o.EntriesHint, diff)
			}
		}
	}
}

// A set that grew a little since its last round is built in place, as a set of the hinted
// size is: the hint (the last round's count) leaves room for growth, so the page that passes
// the old count does not move every entry before it to a larger array.
func TestScanEntriesHintLeavesRoomToGrow(t *testing.T) {
	const n, grown = 20000, 200
	var uris []string
	for i := range n + grown {
		uris = append(uris, fmt.Sprintf("demo://r/%06d", i))
	}
	p := paged(100, uris...)
	allocated := func(hint int) uint64 {
		best := uint64(math.MaxUint64)
		for range 3 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r := discovery.Scan(t.Context(), p, discovery.Options{EntriesHint: hint})
			runtime.ReadMemStats(&after)
			if !r.Complete || len(r.Entries) != n+grown+1 {
				t.Fatalf("hint %d: complete %v with %d entries, want %d", hint, r.Complete, len(r.Entries), n+grown+1)
			}
			best = min(best, after.TotalAlloc-before.TotalAlloc)
		}
		return best
	}
	exact, last := allocated(n+grown+1), allocated(n)
	array := uint64(n+grown) * uint64(unsafe.Sizeof(discovery.Entry{}))
	if last > exact+array/4 {
		t.Errorf("a set grown by %d of %d entries allocated %d bytes, the exact hint %d: the entries (%d bytes) moved to a larger array", grown, n, last, exact, array)
	}
}

// BenchmarkScanEntries measures what a round costs beside its requests: building, normalizing
// and digesting 100,000 entries listed in pages of 100 by a lister that answers at once, with
// no hint, with the hint of a set that grew by one entry since the last round, and with one
// above the count.
func BenchmarkScanEntries(b *testing.B) {
	var uris []string
	for i := range 100000 {
		uris = append(uris, fmt.Sprintf("demo://items/%06d", i))
	}
	p := paged(100, uris...)
	for _, hint := range []int{0, len(uris) - 1, len(uris) + 1} {
		b.Run(fmt.Sprintf("hint=%d", hint), func(b *testing.B) {
			for b.Loop() {
				if r := discovery.Scan(b.Context(), p, discovery.Options{CursorKey: []byte("k"), EntriesHint: hint}); r.Resources != len(uris) {
					b.Fatalf("%d resources, want %d", r.Resources, len(uris))
				}
			}
		})
	}
}
