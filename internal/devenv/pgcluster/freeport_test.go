package pgcluster_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
)

// The cluster's port lies below the kernel's ephemeral range: between the pick and the
// postmaster's bind (initdb runs in between), an outgoing connection of any process could
// otherwise take it, and the cluster would fail to start.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no ephemeral port range to check against:", err)
	}
	low, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil || low <= 10001 {
		t.Skipf("ephemeral range %q leaves no room below it", b)
	}
	for range 10 {
		port, err := pgcluster.FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if port >= low {
			t.Fatalf("port %d is in the ephemeral range, which starts at %d", port, low)
		}
	}
}
