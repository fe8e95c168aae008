// Package ports picks TCP ports for servers that bind them later, in another process or
// another library: the embedded Temporal server's services, the private PostgreSQL cluster.
//
// A port the kernel picks (listening on port 0) lies in its ephemeral range, the range it also
// hands out as the local port of every outgoing connection. Between closing such a port and
// the server binding it, which for a PostgreSQL cluster or the Temporal server can take
// seconds, any process's next connection may take it, and the server then fails to start
// ("address already in use"). Free picks below the ephemeral range instead, where the kernel
// never assigns a port on its own: only another server that asks for that very port can take
// it in between. Free itself never hands one port to two callers that have yet to bind it:
// not within a process (handed), nor across the processes of a machine that pick with this
// package (claim: go test runs packages in parallel processes, each starting servers).
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// rangeFile holds the kernel's ephemeral port range ("low high").
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// span is how many ports below the ephemeral range Free picks from; lowest is the lowest port
// it picks (above the well-known and most registered service ports).
const (
	span   = 16384
	lowest = 10000
)

// attempts bounds the random picks that Free tries before it lets the kernel pick.
const attempts = 64

// Free returns a TCP port on host that could be bound a moment ago, that Free has not
// returned before in this process and that no other live process of this machine got from
// Free, outside the kernel's ephemeral range when that range is known and leaves room below
// it; otherwise one the kernel picks.
func Free(host string) (int, error) {
	low, ok := ephemeralLow()
	return free(host, low, ok, rand.IntN)
}

// handed holds the ports Free has returned in this process. Their servers bind them later,
// and until then a bind check finds them free: without it a later pick could return one of
// them again (the embedded Temporal server alone takes four at one start, and a restart asks
// again for the ports it had).
var handed struct {
	sync.Mutex
	ports map[int]bool
}

// hand records port as returned and reports whether it had not been returned before in this
// process and this process could claim it from the others (claim).
func hand(port int) bool {
	handed.Lock()
	defer handed.Unlock()
	if handed.ports[port] || !claim(port) {
		return false
	}
	if handed.ports == nil {
		handed.ports = map[int]bool{}
	}
	handed.ports[port] = true
	return true
}

// free is Free with the ephemeral range's low end (ok: known) and the random source given.
func free(host string, low int, ok bool, intN func(int) int) (int, error) {
	if from, to, fits := below(low, ok); fits {
		for range attempts {
			port := from + intN(to-from+1)
			l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				continue
			}
			l.Close()
			if hand(port) {
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// below is the range [from, to] Free picks from for an ephemeral range starting at low;
// fits is false when low is unknown or leaves no room above lowest.
func below(low int, ok bool) (from, to int, fits bool) {
	if !ok || low-1 < lowest {
		return 0, 0, false
	}
	to = low - 1
	from = max(lowest, to-span+1)
	return from, to, true
}

// ephemeralLow reads the low end of the kernel's ephemeral port range.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, false
	}
	return parseLow(string(b))
}

// parseLow reads "low high" as the content of rangeFile.
func parseLow(s string) (int, bool) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, false
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= 0 {
		return 0, false
	}
	return low, true
}
