package gateway_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

const (
	updated     = "notifications/resources/updated"
	listChanged = "notifications/resources/list_changed"
)

// TestNotifyQueue: a session's notification queue delivers in order, does not queue a
// pending duplicate twice, and when more distinct notifications wait than it holds, it
// replaces them all by one list_changed (the agent re-reads) instead of dropping any
// silently (issue 15 item 6). The first delivery blocks until the pushes are done, as a
// slow agent would.
func TestNotifyQueue(t *testing.T) {
	type push struct{ method, uri string }
	u := func(uri string) push { return push{updated, uri} }
	for _, tc := range []struct {
		name     string
		capacity int
		pushes   []push // after the first, which is being delivered (blocked) meanwhile
		want     []string
	}{
		{"in order", 4, []push{u("b"), u("c")}, []string{"updated a", "updated b", "updated c"}},
		{"duplicate pending once", 4, []push{u("b"), u("b"), u("a")}, []string{"updated a", "updated b", "updated a"}},
		{"full but no overflow", 2, []push{u("b"), u("c"), u("b")}, []string{"updated a", "updated b", "updated c"}},
		{"overflow becomes one list_changed", 2, []push{u("b"), u("c"), u("d"), u("e"), {listChanged, ""}},
			[]string{"updated a", "list_changed"}},
		{"list_changed pending once", 4, []push{{listChanged, ""}, {listChanged, ""}}, []string{"updated a", "list_changed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			release := make(chan struct{})
			first := make(chan struct{})
			var once sync.Once
			done := make(chan struct{}, 16)
			push, stop := gateway.NewTestNotifyQueue(tc.capacity, func(method, uri string) {
				once.Do(func() { close(first); <-release })
				mu.Lock()
				if method == updated {
					got = append(got, "updated "+uri)
				} else {
					got = append(got, "list_changed")
				}
				mu.Unlock()
				done <- struct{}{}
			})
			defer stop()
			push(updated, "a")
			<-first // "a" is being delivered to a slow agent
			for _, p := range tc.pushes {
				push(p.method, p.uri)
			}
			close(release)
			for range tc.want {
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					mu.Lock()
					t.Fatalf("deliveries stopped at %v, want %v", got, tc.want)
				}
			}
			// Nothing more comes: a marker pushed now is the next delivery.
			push(updated, "marker")
			<-done
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(append(tc.want, "updated marker"), got); diff != "" {
				t.Errorf("deliveries (-want +got):\n%s", diff)
			}
		})
	}
}
