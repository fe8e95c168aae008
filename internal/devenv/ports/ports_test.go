package ports_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/devenv/ports"
)

func TestParseLow(t *testing.T) {
	tests := []struct {
		in  string
		low int
		ok  bool
	}{
		{"32768\t60999\n", 32768, true},
		{"1024 65535", 1024, true},
		{"", 0, false},
		{"32768", 0, false},
		{"x 60999", 0, false},
		{"0 60999", 0, false},
	}
	for _, tt := range tests {
		low, ok := ports.ParseLow(tt.in)
		if diff := cmp.Diff([]any{tt.low, tt.ok}, []any{low, ok}); diff != "" {
			t.Errorf("ParseLow(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestBelow(t *testing.T) {
	tests := []struct {
		name     string
		low      int
		ok       bool
		from, to int
		fits     bool
	}{
		{name: "Linux default", low: 32768, ok: true, from: 16384, to: 32767, fits: true},
		{name: "narrow room", low: 12000, ok: true, from: 10000, to: 11999, fits: true},
		{name: "no room", low: 10000, ok: true},
		{name: "whole range ephemeral", low: 1024, ok: true},
		{name: "unknown", low: 32768, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			from, to, fits := ports.Below(tt.low, tt.ok)
			if diff := cmp.Diff([]any{tt.from, tt.to, tt.fits}, []any{from, to, fits}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// On this machine: Free's ports lie below the kernel's ephemeral range and can be bound.
func TestFree(t *testing.T) {
	low, ok := ports.EphLow()
	if !ok {
		t.Skip("no ephemeral port range to check against")
	}
	seen := map[int]bool{}
	for range 20 {
		port, err := ports.Free("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if from, to, fits := ports.Below(low, ok); fits && (port < from || port > to) {
			t.Fatalf("port %d outside [%d, %d] (ephemeral range starts at %d)", port, from, to, low)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		l.Close()
		seen[port] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 picks gave %d distinct ports: %v", len(seen), seen)
	}
}

// A taken port is skipped; when every pick is taken, the kernel picks.
func TestFreeSkipsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port
	// Every pick is the top of the range below busy+1, the busy port itself: the kernel's
	// port comes back.
	calls := 0
	port, err := ports.FreeWith("127.0.0.1", busy+1, true, func(n int) int { calls++; return n - 1 })
	if err != nil {
		t.Fatal(err)
	}
	if port == busy || port == 0 {
		t.Errorf("port %d, want one other than the taken %d", port, busy)
	}
	if calls != ports.Attempts {
		t.Errorf("%d picks before falling back, want %d", calls, ports.Attempts)
	}
}

// randomPick is the machine's ephemeral range's low end, the lowest port Free picks below it
// and a random offset from there; it skips the test when there is no room below the range.
func randomPick(t *testing.T) (low, from, offset int) {
	t.Helper()
	low, ok := ports.EphLow()
	from, to, fits := ports.Below(low, ok)
	if !fits {
		t.Skip("no room below the ephemeral port range")
	}
	return low, from, rand.IntN(to - from + 1)
}

// A port Free returned is not returned again in this process, even though nothing has bound
// it yet: its server binds it later (CI saw the embedded Temporal server's worker service fail
// with "address already in use" on a restart).
func TestFreeNeverReturnsAPortTwice(t *testing.T) {
	low, from, offset := randomPick(t)
	ok := true
	same := func(int) int { return offset }
	first, err := ports.FreeWith("127.0.0.1", low, ok, same)
	if err != nil {
		t.Fatal(err)
	}
	if first != from+offset {
		t.Skipf("port %d is taken on this machine", from+offset)
	}
	second, err := ports.FreeWith("127.0.0.1", low, ok, same)
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Errorf("Free returned port %d twice", first)
	}
}

// holderEnv, set to "low:offset", makes the test binary the holding process of
// TestFreeAcrossProcesses: it picks with the ephemeral range's low end low and every random
// pick at offset, prints the port Free returned and holds it until its standard input ends.
const holderEnv = "MCPSYNC_PORTS_TEST_HOLDER"

func TestMain(m *testing.M) {
	if v := os.Getenv(holderEnv); v != "" {
		os.Exit(hold(v))
	}
	os.Exit(m.Run())
}

func hold(v string) int {
	var low, offset int
	if _, err := fmt.Sscanf(v, "%d:%d", &low, &offset); err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	port, err := ports.FreeWith("127.0.0.1", low, true, func(int) int { return offset })
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	fmt.Println(port)
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // held until the test closes it
	return 0
}

// A port another live process got from Free, and has not bound yet, is not returned: go test
// runs packages in parallel processes, each starting servers on the ports it picked. Once that
// process has exited, the port can be returned again.
func TestFreeAcrossProcesses(t *testing.T) {
	low, from, offset := randomPick(t)
	ok := true
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", holderEnv, low, offset))
	holder.Stderr = os.Stderr
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	release := func() error {
		stdin.Close()
		return holder.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		release() //nolint:errcheck
		t.Fatalf("the holding process printed no port: %v", err)
	}
	held, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		release() //nolint:errcheck
		t.Fatal(err)
	}
	if held != from+offset {
		release() //nolint:errcheck
		t.Skipf("port %d is taken on this machine", from+offset)
	}
	same := func(int) int { return offset }
	got, err := ports.FreeWith("127.0.0.1", low, ok, same)
	if err != nil {
		release() //nolint:errcheck
		t.Fatal(err)
	}
	if got == held {
		t.Errorf("Free returned port %d, which a live process got from Free and holds", held)
	}
	if err := release(); err != nil {
		t.Fatalf("holding process: %v", err)
	}
	again, err := ports.FreeWith("127.0.0.1", low, ok, same)
	if err != nil {
		t.Fatal(err)
	}
	if again != held {
		t.Errorf("after the holding process exited, Free returned %d, want the released %d", again, held)
	}
}
