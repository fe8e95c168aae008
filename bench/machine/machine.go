// Package machine measures what the machine a benchmark runs on charges for the primitives the
// stack's costs are made of, so that runs of `make bench` on different machines can be
// compared (issue 16 item 6): one core's speed (SHA-256 over 1 MiB buffers), one entry into the
// kernel (getppid), one TCP round trip on the loopback interface between two goroutines (what
// every call between the stack's processes pays at least once: the worker, the embedded
// Temporal server, PostgreSQL, the MCP server) and one durable 8 KiB write (a write and
// fdatasync, what each PostgreSQL commit waits for). Two machines with the same core count can
// differ by several times in the last three — a virtual machine that traps every kernel entry
// charges far more for them than bare metal — and the stack's CPU per update is made largely
// of them, so a run's figures are read next to these.
//
//	go run ./bench machine [-duration 1s] [-dir $TMPDIR]
package machine

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/benchline"
)

// Figures is what Measure found. Every duration is the median of the batches a probe ran.
type Figures struct {
	// Cores is the number of CPUs the Go runtime sees.
	Cores int
	// SHA256 is one core's SHA-256 throughput in MB/s (10^6 bytes).
	SHA256 float64
	// Syscall is one getppid: an entry into the kernel and back that does no work there.
	Syscall time.Duration
	// LoopbackRTT is one 8-byte request and reply over a TCP connection on 127.0.0.1.
	LoopbackRTT time.Duration
	// Fdatasync is one 8 KiB write into a preallocated file followed by fdatasync.
	Fdatasync time.Duration
}

// Options configures Measure. The zero value measures each probe for a second in
// os.TempDir().
type Options struct {
	// Duration is how long each probe runs (default 1 s), split into batches.
	Duration time.Duration
	// Dir is where the durable-write probe writes its file (default os.TempDir()); pass the
	// file system the databases live on.
	Dir string
}

// batches is how many slices each probe's time is cut into; the median slice is reported, so
// that a stall of the machine in one slice does not move the figure.
const batches = 9

// Measure runs the probes one after another and returns their figures. It fails when a probe
// cannot run (the directory is missing or not writable, no loopback interface) or ctx ends.
func Measure(ctx context.Context, o Options) (Figures, error) {
	if o.Duration <= 0 {
		o.Duration = time.Second
	}
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	slice := o.Duration / batches
	f := Figures{Cores: runtime.NumCPU()}
	buf := make([]byte, 1<<20)
	perHash, err := median(ctx, slice, func() error { sha256.Sum256(buf); return nil })
	if err != nil {
		return f, fmt.Errorf("sha256 probe: %w", err)
	}
	f.SHA256 = float64(len(buf)) / perHash.Seconds() / 1e6
	if f.Syscall, err = median(ctx, slice, func() error { syscall.Getppid(); return nil }); err != nil {
		return f, fmt.Errorf("kernel entry probe: %w", err)
	}
	if f.LoopbackRTT, err = loopback(ctx, slice); err != nil {
		return f, fmt.Errorf("loopback probe: %w", err)
	}
	if f.Fdatasync, err = durableWrites(ctx, slice, o.Dir); err != nil {
		return f, fmt.Errorf("durable write probe in %s: %w", o.Dir, err)
	}
	return f, nil
}

// median runs op in batches batches of about slice each and returns the median time per call.
func median(ctx context.Context, slice time.Duration, op func() error) (time.Duration, error) {
	per := make([]time.Duration, 0, batches)
	for range batches {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n := 0
		start := time.Now()
		for {
			// Check the clock every few calls: time.Now costs about as much as the cheapest op.
			for range 16 {
				if err := op(); err != nil {
					return 0, err
				}
			}
			n += 16
			if time.Since(start) >= slice {
				break
			}
		}
		per = append(per, time.Since(start)/time.Duration(n))
	}
	slices.Sort(per)
	return per[len(per)/2], nil
}

// loopback measures 8-byte ping-pongs between two goroutines over a TCP connection on
// 127.0.0.1.
func loopback(ctx context.Context, slice time.Duration) (time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	echoed := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		b := make([]byte, 8)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				echoed <- nil // the client hung up
				return
			}
			if _, err := c.Write(b); err != nil {
				echoed <- err
				return
			}
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	b := make([]byte, 8)
	rtt, err := median(ctx, slice, func() error {
		if _, err := c.Write(b); err != nil {
			return err
		}
		_, err := io.ReadFull(c, b)
		return err
	})
	c.Close()
	if eerr := <-echoed; err == nil {
		err = eerr
	}
	return rtt, err
}

// walBytes is the size of the file the durable writes cycle through, as a PostgreSQL WAL
// segment, allocated before the probe so that fdatasync flushes data, not a growing file's size.
const walBytes = 16 << 20

// durableWrites measures an 8 KiB write at the next offset of a preallocated file followed by
// fdatasync, as a commit flushes the write-ahead log; the file is removed afterwards.
func durableWrites(ctx context.Context, slice time.Duration, dir string) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "mcpsync-machine-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	page := make([]byte, 8<<10)
	for off := int64(0); off < walBytes; off += int64(len(page)) {
		if _, err := f.WriteAt(page, off); err != nil {
			return 0, err
		}
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	var off int64
	return median(ctx, slice, func() error {
		if _, err := f.WriteAt(page, off); err != nil {
			return err
		}
		off = (off + int64(len(page))) % walBytes
		return fdatasync(f)
	})
}

// Report writes f as bench lines.
func Report(w io.Writer, f Figures) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, fig := range []benchline.Figure{
		{Name: "machine-cores", Value: float64(f.Cores), Unit: "cores"},
		{Name: "machine-sha256", Value: f.SHA256, Unit: "MB/s"},
		{Name: "machine-syscall", Value: float64(f.Syscall.Nanoseconds()), Unit: "ns"},
		{Name: "machine-loopback-rtt", Value: us(f.LoopbackRTT), Unit: "us"},
		{Name: "machine-fdatasync", Value: us(f.Fdatasync), Unit: "us"},
	} {
		benchline.Print(w, fig)
	}
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits 1
// with one line when a probe fails; `mcpsync-bench machine` (bench/main.go) calls it.
func Main() {
	var o Options
	flag.DurationVar(&o.Duration, "duration", time.Second, "how long each probe runs")
	flag.StringVar(&o.Dir, "dir", os.TempDir(), "directory of the durable-write probe's file (the databases' file system)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mcpsync-bench machine: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	f, err := Measure(ctx, o)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			err = errors.New("interrupted")
		}
		fmt.Fprintln(os.Stderr, "mcpsync-bench machine:", err)
		os.Exit(1)
	}
	Report(os.Stdout, f)
}
