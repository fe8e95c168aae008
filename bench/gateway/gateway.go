// Package gateway measures the MCP gateway (issue 15 item 7) against its baselines, all
// in the same run on the same stack:
//
//   - reads: N concurrent agent sessions (go-sdk clients, each its own principal and bearer
//     token) reading accepted versions through the gateway, in the 2025-11-25 era (stateful
//     sessions) and the 2026-07-28 era (stateless); next to the same N readers doing what
//     `mcpsync get` does (the CLI's get command run in this process against the ledger: grant
//     check, read, output guard; no process start) and N raw go-sdk sessions reading the
//     upstream server directly; and the ledger's token check alone (AuthenticateToken, which
//     the gateway runs for every HTTP request). Each phase runs for -duration; figures are per-read latency
//     p50/p99 and reads per second.
//   - notifications: the agents subscribe (resources/subscribe, 2025-11-25) to every
//     resource; the upstream changes one resource at a time, -updates times; for each agent
//     the latency from the version's acceptance (acceptedAt in its _meta, the accepting
//     transaction's time) to its notifications/resources/updated, and from the upstream
//     change to it. Baseline: a raw go-sdk session subscribed to the upstream server itself,
//     from the same change to its resources/updated.
//
// Output: lines "bench: <name> <value> <unit> (baseline <name> <value> <unit>, ratio <r>)"
// (internal/harness/benchline). The stack is in-process: the Temporal test server, a fresh
// ledger database (on -database-url, or a private cluster), one worker with its session host,
// a chaosmcp upstream over streamable HTTP and the gateway on a loopback port.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/harness/benchline"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

const (
	era2025 = "2025-11-25"
	era2026 = "2026-07-28"
	source  = "bench"
)

type options struct {
	dbURL     string
	agents    int
	resources int
	duration  time.Duration
	updates   int
	parallel  int
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench gateway` (bench/main.go) calls it.
func Main() {
	var o options
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("MCPSYNC_BENCH_DATABASE_URL"),
		"admin URL of a PostgreSQL server to create the bench database on (default: start a private cluster)")
	flag.IntVar(&o.agents, "agents", 16, "concurrent agent sessions (each its own principal and token)")
	flag.IntVar(&o.resources, "resources", 4, "resources every agent is subscribed to and reads in turn")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long each read phase runs")
	flag.IntVar(&o.updates, "updates", 40, "upstream changes in the notification phase (one at a time)")
	flag.IntVar(&o.parallel, "parallel", 8, "concurrent CLI subscribes while seeding")
	flag.Parse()
	if o.agents <= 0 || o.resources <= 0 || o.duration <= 0 || o.updates <= 0 || o.parallel <= 0 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "gatewaybench: -agents, -resources, -duration, -updates and -parallel must be positive; no arguments")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "gatewaybench:", err)
		os.Exit(1)
	}
}

// bench is the running stack.
type bench struct {
	o      options
	stack  *localstack.Stack
	st     *ledger.Store
	up     *chaosmcp.Server
	upURL  string
	gwURL  string
	tokens []string // agent i's bearer token
	bodies sync.Map // upstream URI -> current body
}

func uriOf(r int) string       { return fmt.Sprintf("demo://bench/r%02d", r) }
func principalOf(a int) string { return fmt.Sprintf("agent-%02d", a) }
func gwURIOf(r int) string {
	return gateway.URI{Source: source, Upstream: uriOf(r)}.String()
}

func run(ctx context.Context, o options) error {
	if o.dbURL == "" {
		fmt.Fprintln(os.Stderr, "gatewaybench: private PostgreSQL (fsync off)")
	}
	stack, err := localstack.Start(ctx, localstack.Options{AdminURL: o.dbURL,
		Host: mcphost.Options{ClaimInterval: 200 * time.Millisecond, Lease: 30 * time.Second,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, KeepAlive: 10 * time.Second}})
	if err != nil {
		return err
	}
	defer stack.Stop()
	up := chaosmcp.New(chaosmcp.Options{Name: "bench", Version: "1.0.0"})
	defer up.Close()
	b := &bench{o: o, stack: stack, st: stack.Store, up: up}
	for r := range o.resources {
		b.put(r, fmt.Sprintf("body of resource %d, version 0\n", r))
	}
	hs, err := up.StartHTTP("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer hs.Close()
	b.upURL = hs.URL
	gw, err := gateway.New(gateway.Options{Addr: "127.0.0.1:0", Store: stack.Store, Temporal: stack.Client,
		Namespace: stack.Namespace, MaxStreamsPerToken: 64})
	if err != nil {
		return err
	}
	if err := gw.Start(ctx); err != nil {
		return err
	}
	defer gw.Close()
	b.gwURL = gw.URL()

	start := time.Now()
	if err := b.seed(ctx); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gatewaybench: %d agents x %d resources subscribed and accepted in %s\n",
		o.agents, o.resources, time.Since(start).Round(time.Millisecond))

	phases := []struct {
		name string
		open func(ctx context.Context, a int) (reader, error)
	}{
		{"upstream-read", b.upstreamReader},
		{"token-check", b.tokenChecker},
		{"get-inproc-read", b.getReader},
		{"gateway-read-" + era2025, func(ctx context.Context, a int) (reader, error) { return b.gatewayReader(ctx, a, era2025) }},
		{"gateway-read-" + era2026, func(ctx context.Context, a int) (reader, error) { return b.gatewayReader(ctx, a, era2026) }},
	}
	results := map[string]readResult{}
	for _, p := range phases {
		res, err := b.readPhase(ctx, p.open)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		fmt.Fprintf(os.Stderr, "gatewaybench: %s: %d reads in %s\n", p.name, res.reads, res.span.Round(time.Millisecond))
		results[p.name] = res
	}
	up1, get1 := results["upstream-read"], results["get-inproc-read"]
	for _, era := range []string{era2025, era2026} {
		g := results["gateway-read-"+era]
		for _, base := range []struct {
			name string
			r    readResult
		}{{"upstream-read", up1}, {"get-inproc-read", get1}} {
			benchline.PrintVs(os.Stdout, ms("gateway-read-"+era+"-p50", g.p50), ms(base.name+"-p50", base.r.p50))
			benchline.PrintVs(os.Stdout, ms("gateway-read-"+era+"-p99", g.p99), ms(base.name+"-p99", base.r.p99))
			benchline.PrintVs(os.Stdout, benchline.Figure{Name: "gateway-read-" + era + "-throughput", Value: g.perSec(), Unit: "/s"},
				benchline.Figure{Name: base.name + "-throughput", Value: base.r.perSec(), Unit: "/s"})
		}
	}

	// The ledger check every gateway HTTP request makes (the token's hash, expiry and
	// revocation in one statement), next to the whole in-process get.
	tc := results["token-check"]
	benchline.PrintVs(os.Stdout, ms("gateway-token-check-p50", tc.p50), ms("get-inproc-read-p50", get1.p50))
	benchline.PrintVs(os.Stdout, ms("gateway-token-check-p99", tc.p99), ms("get-inproc-read-p99", get1.p99))

	n, err := b.notifyPhase(ctx)
	if err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	fmt.Fprintf(os.Stderr, "gatewaybench: %d updates, %d agent notifications, %d upstream notifications\n",
		o.updates, len(n.fromAccept), len(n.upstream))
	upP50, upP99 := percentile(n.upstream, 50), percentile(n.upstream, 99)
	benchline.PrintVs(os.Stdout, ms("gateway-updated-after-accept-p50", percentile(n.fromAccept, 50)), ms("upstream-updated-p50", upP50))
	benchline.PrintVs(os.Stdout, ms("gateway-updated-after-accept-p99", percentile(n.fromAccept, 99)), ms("upstream-updated-p99", upP99))
	benchline.PrintVs(os.Stdout, ms("gateway-updated-after-change-p50", percentile(n.fromChange, 50)), ms("upstream-updated-p50", upP50))
	benchline.PrintVs(os.Stdout, ms("gateway-updated-after-change-p99", percentile(n.fromChange, 99)), ms("upstream-updated-p99", upP99))
	return nil
}

func ms(name string, d time.Duration) benchline.Figure {
	return benchline.Figure{Name: name, Value: float64(d) / float64(time.Millisecond), Unit: "ms"}
}

// put sets resource r's upstream body (the upstream notifies its subscribers).
func (b *bench) put(r int, body string) {
	b.bodies.Store(uriOf(r), body)
	b.up.Set(uriOf(r), body, "text/plain")
}

func (b *bench) body(r int) string {
	v, _ := b.bodies.Load(uriOf(r))
	return v.(string)
}

// seed adds the source, and for every agent a grant, a token and a subscription to every
// resource, waiting until each has the current body accepted.
func (b *bench) seed(ctx context.Context) error {
	if _, err := b.stack.MustCLI(ctx, "source", "add", source, "--url", b.upURL); err != nil {
		return err
	}
	b.tokens = make([]string, b.o.agents)
	for a := range b.o.agents {
		if _, err := b.stack.MustCLI(ctx, "grant", principalOf(a), source); err != nil {
			return err
		}
		_, tok, err := b.st.CreateToken(ctx, principalOf(a), 0)
		if err != nil {
			return err
		}
		b.tokens[a] = tok
	}
	return b.parallel(b.o.agents*b.o.resources, func(i int) error {
		a, r := i/b.o.resources, i%b.o.resources
		if _, err := b.stack.MustCLI(ctx, "subscribe", source, uriOf(r), "--principal", principalOf(a), "--wait", "2m"); err != nil {
			return err
		}
		want := ledger.Digest([]byte(b.body(r)))
		deadline := time.Now().Add(2 * time.Minute)
		for {
			sub, err := b.st.SubscriptionByKey(ctx, principalOf(a), source, uriOf(r))
			if err == nil && sub.LastAcceptedDigest == want {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s %s: no accepted version within 2m (%v)", principalOf(a), uriOf(r), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// parallel runs f(0..n-1) on o.parallel goroutines and returns the errors joined.
func (b *bench) parallel(n int, f func(i int) error) error {
	next := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range b.o.parallel {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// reader reads resource r and returns its text.
type reader struct {
	read  func(ctx context.Context, r int) (string, error)
	close func()
}

type readResult struct {
	reads    int
	span     time.Duration
	p50, p99 time.Duration
}

func (r readResult) perSec() float64 { return float64(r.reads) / r.span.Seconds() }

// readPhase opens one reader per agent and has all of them read, resource after resource,
// for o.duration; every read must return the resource's current body.
func (b *bench) readPhase(ctx context.Context, open func(ctx context.Context, a int) (reader, error)) (readResult, error) {
	readers := make([]reader, b.o.agents)
	for a := range readers {
		r, err := open(ctx, a)
		if err != nil {
			return readResult{}, fmt.Errorf("agent %d: %w", a, err)
		}
		defer r.close()
		readers[a] = r
	}
	lat := make([][]time.Duration, b.o.agents)
	errs := make([]error, b.o.agents)
	start := time.Now()
	deadline := start.Add(b.o.duration)
	var wg sync.WaitGroup
	for a := range readers {
		wg.Go(func() {
			for i := a; time.Now().Before(deadline); i++ {
				r := i % b.o.resources
				t0 := time.Now()
				text, err := readers[a].read(ctx, r)
				d := time.Since(t0)
				if err == nil && text != b.body(r) {
					err = fmt.Errorf("read %s: %q, want %q", uriOf(r), text, b.body(r))
				}
				if err != nil {
					errs[a] = err
					return
				}
				lat[a] = append(lat[a], d)
			}
		})
	}
	wg.Wait()
	span := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return readResult{}, err
	}
	all := slices.Concat(lat...)
	return readResult{reads: len(all), span: span, p50: percentile(all, 50), p99: percentile(all, 99)}, nil
}

// percentile returns the p-th percentile of ds (nearest rank); 0 for none.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (t bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}

// connect opens a go-sdk client session to url in era with token (none if empty).
func connect(ctx context.Context, url, token, era string, copts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	hc := &http.Client{}
	if token != "" {
		hc.Transport = bearer{token: token, base: http.DefaultTransport}
	}
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: 1}
	var so *mcp.ClientSessionOptions
	if era == era2025 {
		so = &mcp.ClientSessionOptions{ProtocolVersion: era2025}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return mcp.NewClient(&mcp.Implementation{Name: "gatewaybench", Version: "1"}, copts).Connect(cctx, tr, so)
}

func textOf(res *mcp.ReadResourceResult) (string, error) {
	if len(res.Contents) != 1 {
		return "", fmt.Errorf("%d contents, want 1", len(res.Contents))
	}
	return res.Contents[0].Text, nil
}

// upstreamReader is a raw go-sdk session to the upstream server (2025-11-25).
func (b *bench) upstreamReader(ctx context.Context, _ int) (reader, error) {
	cs, err := connect(ctx, b.upURL, "", era2025, nil)
	if err != nil {
		return reader{}, err
	}
	return reader{close: func() { cs.Close() }, read: func(ctx context.Context, r int) (string, error) {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uriOf(r)})
		if err != nil {
			return "", err
		}
		return textOf(res)
	}}, nil
}

// gatewayReader is agent a's session to the gateway in era.
func (b *bench) gatewayReader(ctx context.Context, a int, era string) (reader, error) {
	cs, err := connect(ctx, b.gwURL, b.tokens[a], era, nil)
	if err != nil {
		return reader{}, err
	}
	return reader{close: func() { cs.Close() }, read: func(ctx context.Context, r int) (string, error) {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: gwURIOf(r)})
		if err != nil {
			return "", err
		}
		return textOf(res)
	}}, nil
}

// tokenChecker authenticates agent a's token against the ledger, as the gateway does for
// every HTTP request; a "read" returns the resource's body once the token named agent a.
func (b *bench) tokenChecker(_ context.Context, a int) (reader, error) {
	return reader{close: func() {}, read: func(ctx context.Context, r int) (string, error) {
		t, err := b.st.AuthenticateToken(ctx, b.tokens[a])
		if err != nil {
			return "", err
		}
		if t.Principal != principalOf(a) {
			return "", fmt.Errorf("token of %s authenticated as %s", principalOf(a), t.Principal)
		}
		return b.body(r), nil
	}}, nil
}

// getReader runs `mcpsync get SOURCE URI --principal AGENT` in this process (the CLI's whole
// get path against the ledger, without starting a process).
func (b *bench) getReader(_ context.Context, a int) (reader, error) {
	return reader{close: func() {}, read: func(ctx context.Context, r int) (string, error) {
		out, errOut, code := b.stack.CLI(ctx, "get", source, uriOf(r), "--principal", principalOf(a))
		if code != 0 {
			return "", fmt.Errorf("mcpsync get: exit %d: %s", code, errOut)
		}
		return out, nil
	}}, nil
}

// notifyResult holds the notification latencies: per agent and update, from the version's
// acceptance and from the upstream change; per update, the raw upstream session's.
type notifyResult struct {
	fromAccept, fromChange, upstream []time.Duration
}

// arrival is one resources/updated a session received.
type arrival struct {
	uri string
	at  time.Time
}

// inbox collects a session's resources/updated notifications.
type inbox struct {
	mu   sync.Mutex
	got  []arrival
	wake chan struct{}
}

func newInbox() *inbox { return &inbox{wake: make(chan struct{}, 1)} }

func (in *inbox) handler(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	at := time.Now()
	in.mu.Lock()
	in.got = append(in.got, arrival{uri: req.Params.URI, at: at})
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// await returns the time of the first arrival for uri after index from, waiting up to 60 s.
func (in *inbox) await(ctx context.Context, uri string, from int) (time.Time, int, error) {
	deadline := time.After(time.Minute)
	for {
		in.mu.Lock()
		for i := from; i < len(in.got); i++ {
			if in.got[i].uri == uri {
				at := in.got[i].at
				in.mu.Unlock()
				return at, i + 1, nil
			}
		}
		in.mu.Unlock()
		select {
		case <-in.wake:
		case <-deadline:
			return time.Time{}, 0, fmt.Errorf("no resources/updated for %s within 1m", uri)
		case <-ctx.Done():
			return time.Time{}, 0, ctx.Err()
		}
	}
}

func (in *inbox) len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.got)
}

// notifyPhase subscribes every agent (2025-11-25, through the gateway) and a raw upstream
// session to every resource, then changes the resources one at a time and measures.
func (b *bench) notifyPhase(ctx context.Context) (notifyResult, error) {
	var res notifyResult
	upIn := newInbox()
	upCS, err := connect(ctx, b.upURL, "", era2025, &mcp.ClientOptions{ResourceUpdatedHandler: upIn.handler})
	if err != nil {
		return res, err
	}
	defer upCS.Close()
	agents := make([]*mcp.ClientSession, b.o.agents)
	inboxes := make([]*inbox, b.o.agents)
	for a := range agents {
		inboxes[a] = newInbox()
		cs, err := connect(ctx, b.gwURL, b.tokens[a], era2025, &mcp.ClientOptions{ResourceUpdatedHandler: inboxes[a].handler})
		if err != nil {
			return res, fmt.Errorf("agent %d: %w", a, err)
		}
		defer cs.Close()
		agents[a] = cs
	}
	for r := range b.o.resources {
		if err := upCS.Subscribe(ctx, &mcp.SubscribeParams{URI: uriOf(r)}); err != nil {
			return res, fmt.Errorf("upstream subscribe: %w", err)
		}
		for a, cs := range agents {
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: gwURIOf(r)}); err != nil {
				return res, fmt.Errorf("agent %d subscribe %s: %w", a, gwURIOf(r), err)
			}
		}
	}
	// Let any announcement of the versions accepted before the subscriptions pass.
	time.Sleep(2 * time.Second)

	for u := range b.o.updates {
		r := u % b.o.resources
		upFrom := upIn.len()
		from := make([]int, len(agents))
		for a := range agents {
			from[a] = inboxes[a].len()
		}
		body := fmt.Sprintf("body of resource %d, update %d\n", r, u+1)
		changed := time.Now()
		b.put(r, body)
		at, _, err := upIn.await(ctx, uriOf(r), upFrom)
		if err != nil {
			return res, fmt.Errorf("upstream: %w", err)
		}
		res.upstream = append(res.upstream, at.Sub(changed))
		want := ledger.Digest([]byte(body))
		for a, cs := range agents {
			at, _, err := inboxes[a].await(ctx, gwURIOf(r), from[a])
			if err != nil {
				return res, fmt.Errorf("agent %d: %w", a, err)
			}
			rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: gwURIOf(r)})
			if err != nil {
				return res, fmt.Errorf("agent %d read after update: %w", a, err)
			}
			var meta struct {
				Digest     string    `json:"digest"`
				AcceptedAt time.Time `json:"acceptedAt"`
			}
			if err := remarshal(rr.Meta[gateway.MetaVersion], &meta); err != nil {
				return res, err
			}
			if meta.Digest != want {
				return res, fmt.Errorf("agent %d was notified while the gateway served %s, want the new %s", a, meta.Digest, want)
			}
			res.fromAccept = append(res.fromAccept, at.Sub(meta.AcceptedAt))
			res.fromChange = append(res.fromChange, at.Sub(changed))
		}
	}
	return res, nil
}

// remarshal decodes a _meta value (a map after JSON) into out.
func remarshal(v any, out any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode %s: %w", b, err)
	}
	return nil
}
