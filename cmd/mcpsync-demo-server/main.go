// Command mcpsync-demo-server is an MCP server whose resources change every few seconds, built
// on the fault-injecting server internal/harness/chaosmcp. It serves stdio by default (stdout carries
// the protocol; logs go to stderr) or streamable HTTP with --http ADDR.
//
// Resources: demo://clock/now (the current time), demo://notes/1 and demo://notes/2 (text that
// changes every tick and every second tick), and with --resources N the numbered resources
// demo://items/0001 … of which --item-updates change per tick. Every change is announced with
// notifications/resources/updated to subscribed sessions, except that with --eras both a
// 2026-07-28 client's listen acknowledgement leaves out the --unwatched resources (by default
// the computed demo://clock/now), which that client must poll. The chaos knobs that make sense on a
// command line are flags; see -help. With --control ADDR a loopback HTTP endpoint changes any
// resource on request (POST /resources, form fields uri and text), so that a script or a
// benchmark decides what changes and when.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// config is the parsed command line.
type config struct {
	httpAddr       string
	bothEras       bool     // --eras both: 2026-07-28 next to the legacy versions
	unwatched      []string // left out of 2026-07-28 listen acknowledgements (unwatched.go)
	interval       time.Duration
	resources      int
	itemUpdates    int
	seed           uint64
	name, version  string
	logLevel       slog.Level
	pageSize       int
	pageSizes      []int
	caps           chaosmcp.Capabilities
	snapshot       chaosmcp.SnapshotMode
	circularFrom   int
	circularTo     int
	bindCursors    bool
	dropRate       float64
	updateDelay    time.Duration
	duplicates     int
	reorder        int
	rewrite        func(string) string
	suppressLC     bool
	readDelay      time.Duration
	notFound       chaosmcp.NotFoundStyle
	unsubscribe    chaosmcp.UnsubscribeMode
	transientEvery int
	controlAddr    string // --control: the loopback endpoint that changes resources (control.go)
	controlFile    string
}

// usageError is a bad command line: reported on one line, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("mcpsync-demo-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	var (
		pageSizes, snapshot, circular, rewrite, notFound, unsubscribe, logLevel, eras, unwatched string
		noSubscribe, noListChanged, advertiseSnapshot                                            bool
	)
	fs.StringVar(&c.httpAddr, "http", "", "serve streamable HTTP on `ADDR` (e.g. 127.0.0.1:8080, port 0 picks a free one) at /mcp instead of stdio")
	fs.StringVar(&eras, "eras", "legacy", "protocol eras: legacy (2025-11-25 and older) or both (also 2026-07-28: stateless over HTTP, subscriptions/listen)")
	fs.StringVar(&unwatched, "unwatched", "demo://clock/now", "comma-separated `URIS` the server does not watch: left out of 2026-07-28 subscriptions/listen acknowledgements, so clients poll them (\"\" watches all)")
	fs.DurationVar(&c.interval, "interval", 3*time.Second, "time between changes")
	fs.IntVar(&c.resources, "resources", 0, "also serve `N` numbered resources demo://items/0001 …")
	fs.IntVar(&c.itemUpdates, "item-updates", 1, "numbered resources changed per tick")
	fs.Uint64Var(&c.seed, "seed", 1, "seed for generated text, item choice and probabilistic faults")
	fs.StringVar(&c.name, "name", "mcpsync-demo-server", "serverInfo name")
	fs.StringVar(&c.version, "version", "0.1.0", "serverInfo version")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.pageSize, "page-size", 50, "items per resources/list page")
	fs.StringVar(&pageSizes, "page-sizes", "", "comma-separated page sizes per page, e.g. 1,5,2 (last one repeats)")
	fs.BoolVar(&noSubscribe, "no-subscribe", false, "do not advertise resources.subscribe (subscribe answers -32601)")
	fs.BoolVar(&noListChanged, "no-list-changed", false, "do not advertise resources.listChanged (and send none)")
	fs.BoolVar(&advertiseSnapshot, "advertise-snapshot", false, "advertise the experimental "+chaosmcp.SnapshotCapability+" capability")
	fs.StringVar(&snapshot, "snapshot", "off", "snapshot IDs in list results: off, honest, forged or per-page")
	fs.StringVar(&circular, "circular-cursor", "", "`FROM:TO`: page FROM answers with the cursor that led to page TO")
	fs.BoolVar(&c.bindCursors, "bind-cursors", false, "reject cursors from other sessions with -32602")
	fs.Float64Var(&c.dropRate, "drop-rate", 0, "probability of dropping each updated notification")
	fs.DurationVar(&c.updateDelay, "update-delay", 0, "delay every updated notification")
	fs.IntVar(&c.duplicates, "duplicates", 0, "extra copies of every updated notification")
	fs.IntVar(&c.reorder, "reorder", 0, "send updated notifications in reversed batches of `N`")
	fs.StringVar(&rewrite, "rewrite", "none", "re-encode URIs in updated notifications: none, encode-unreserved, upper-scheme-host or lower-hex")
	fs.BoolVar(&c.suppressLC, "suppress-list-changed", false, "never send list_changed (while still advertising it)")
	fs.DurationVar(&c.readDelay, "read-delay", 0, "delay every resources/read")
	fs.IntVar(&c.transientEvery, "transient-every", 0, "answer every `N`th resources/read with a transient -32603 error")
	fs.StringVar(&notFound, "not-found-style", "mcp", "unknown resources: mcp (-32002), invalid-params (-32602 + data.uri) or message (-32602)")
	fs.StringVar(&unsubscribe, "unsubscribe", "normal", "resources/unsubscribe: normal, hang or lose-response")
	fs.StringVar(&c.controlAddr, "control", "", "serve on loopback `ADDR` (e.g. 127.0.0.1:0) an HTTP endpoint that changes a resource on request: POST /resources with form fields uri and text")
	fs.StringVar(&c.controlFile, "control-file", "", "write the --control endpoint's URL to `PATH` once it listens")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if c.interval <= 0 {
		return nil, &usageError{msg: "--interval must be positive"}
	}
	if c.controlFile != "" && c.controlAddr == "" {
		return nil, &usageError{msg: "--control-file needs --control"}
	}
	if c.controlAddr != "" {
		if err := checkControlAddr(c.controlAddr); err != nil {
			return nil, &usageError{msg: err.Error()}
		}
	}
	switch eras {
	case "legacy":
	case "both":
		c.bothEras = true
	default:
		return nil, &usageError{msg: fmt.Sprintf("--eras must be legacy or both, got %q", eras)}
	}
	for _, u := range strings.Split(unwatched, ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.unwatched = append(c.unwatched, u)
		}
	}
	if c.resources < 0 || c.itemUpdates < 0 || c.pageSize < 1 || c.duplicates < 0 || c.reorder < 0 || c.transientEvery < 0 {
		return nil, &usageError{msg: "--resources, --item-updates, --duplicates, --reorder and --transient-every must be ≥ 0, --page-size ≥ 1"}
	}
	if c.dropRate < 0 || c.dropRate > 1 {
		return nil, &usageError{msg: "--drop-rate must be between 0 and 1"}
	}
	if err := c.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, &usageError{msg: fmt.Sprintf("--log-level: %v", err)}
	}
	if pageSizes != "" {
		for _, f := range strings.Split(pageSizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return nil, &usageError{msg: fmt.Sprintf("--page-sizes: %q is not a positive integer", f)}
			}
			c.pageSizes = append(c.pageSizes, n)
		}
	}
	c.caps = chaosmcp.Capabilities{Subscribe: !noSubscribe, ListChanged: !noListChanged, Snapshot: advertiseSnapshot}
	modes := map[string]chaosmcp.SnapshotMode{"off": chaosmcp.SnapshotOff, "honest": chaosmcp.SnapshotHonest, "forged": chaosmcp.SnapshotForged, "per-page": chaosmcp.SnapshotPerPage}
	var ok bool
	if c.snapshot, ok = modes[snapshot]; !ok {
		return nil, &usageError{msg: fmt.Sprintf("--snapshot: unknown mode %q", snapshot)}
	}
	if circular != "" {
		from, to, found := strings.Cut(circular, ":")
		f, err1 := strconv.Atoi(from)
		t, err2 := strconv.Atoi(to)
		if !found || err1 != nil || err2 != nil || t < 1 || t > f {
			return nil, &usageError{msg: fmt.Sprintf("--circular-cursor: want FROM:TO with 1 ≤ TO ≤ FROM, got %q", circular)}
		}
		c.circularFrom, c.circularTo = f, t
	}
	rewrites := map[string]func(string) string{"none": nil, "encode-unreserved": chaosmcp.EncodeUnreserved, "upper-scheme-host": chaosmcp.UpperSchemeHost, "lower-hex": chaosmcp.LowerHexEscapes}
	if c.rewrite, ok = rewrites[rewrite]; !ok {
		return nil, &usageError{msg: fmt.Sprintf("--rewrite: unknown rewrite %q", rewrite)}
	}
	styles := map[string]chaosmcp.NotFoundStyle{"mcp": chaosmcp.NotFoundMCP, "invalid-params": chaosmcp.NotFoundInvalidParams, "message": chaosmcp.NotFoundMessage}
	if c.notFound, ok = styles[notFound]; !ok {
		return nil, &usageError{msg: fmt.Sprintf("--not-found-style: unknown style %q", notFound)}
	}
	unsubs := map[string]chaosmcp.UnsubscribeMode{"normal": chaosmcp.UnsubscribeNormal, "hang": chaosmcp.UnsubscribeHang, "lose-response": chaosmcp.UnsubscribeLoseResponse}
	if c.unsubscribe, ok = unsubs[unsubscribe]; !ok {
		return nil, &usageError{msg: fmt.Sprintf("--unsubscribe: unknown mode %q", unsubscribe)}
	}
	return c, nil
}

func run(args []string, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "mcpsync-demo-server: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	s := newServer(c, logger)
	defer s.Close()
	d := newDemo(s, c)
	d.populate()
	go d.tick(ctx, logger)
	if c.controlAddr != "" {
		if err := serveControl(ctx, s, c.controlAddr, c.controlFile, logger); err != nil {
			fmt.Fprintf(stderr, "mcpsync-demo-server: %v\n", err)
			return 1
		}
	}

	if c.httpAddr == "" {
		logger.Info("serving stdio", "resources", len(s.URIs()), "interval", c.interval)
		if err := s.ServeStdio(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error("stdio session failed", "error", err)
			return 1
		}
		return 0
	}
	start := s.StartHTTP
	if c.bothEras {
		start = s.StartHTTPBothEras
	}
	hs, err := start(c.httpAddr)
	if err != nil {
		logger.Error("cannot serve HTTP", "error", err)
		return 1
	}
	logger.Info("listening", "url", hs.URL, "resources", len(s.URIs()), "interval", c.interval)
	<-ctx.Done()
	logger.Info("shutting down")
	if err := hs.Close(); err != nil {
		logger.Warn("closing HTTP server", "error", err)
	}
	return 0
}

// newServer builds the chaos server with the knobs from the command line.
func newServer(c *config, logger *slog.Logger) *chaosmcp.Server {
	opts := chaosmcp.Options{
		Name: c.name, Version: c.version, PageSize: c.pageSize, Capabilities: &c.caps,
		Seed: c.seed, Logger: logger,
	}
	if c.bothEras {
		opts.ProtocolVersions = chaosmcp.AllProtocolVersions
	}
	s := chaosmcp.New(opts)
	s.MCPServer().AddSendingMiddleware(unwatchedMiddleware(c.unwatched, logger))
	if len(c.pageSizes) > 0 {
		s.SetPageSizes(c.pageSizes...)
	}
	s.SetSnapshotMode(c.snapshot)
	s.SetCircularCursor(c.circularFrom, c.circularTo)
	s.BindCursorsToSession(c.bindCursors)
	s.SetUpdateDropRate(c.dropRate)
	s.SetUpdateDelay(c.updateDelay)
	s.SetUpdateDuplicates(c.duplicates)
	s.ReorderUpdates(c.reorder)
	s.SetUpdateURIRewrite(c.rewrite)
	s.SuppressListChanged(c.suppressLC)
	s.SetNotFoundStyle(c.notFound)
	s.SetUnsubscribeMode(c.unsubscribe)
	if c.readDelay > 0 {
		s.AddReadFault(chaosmcp.ReadFault{Delay: c.readDelay})
	}
	if c.transientEvery > 0 {
		s.AddReadFault(chaosmcp.ReadFault{Every: c.transientEvery, Fail: chaosmcp.ReadTransient})
	}
	return s
}

// demo owns the changing content.
type demo struct {
	s       *chaosmcp.Server
	c       *config
	rng     *rand.Rand
	ticks   int
	itemRev []int
}

func newDemo(s *chaosmcp.Server, c *config) *demo {
	return &demo{s: s, c: c, rng: rand.New(rand.NewPCG(c.seed, c.seed+1)), itemRev: make([]int, c.resources)}
}

var words = strings.Fields("amber brook cedar dune ember fjord glade harbor iris juniper kelp lumen meadow nimbus orchid pebble quartz river sorrel tundra umber vale willow xenon yarrow zephyr")

func (d *demo) sentence(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = words[d.rng.IntN(len(words))]
	}
	return strings.Join(w, " ")
}

func itemURI(i int) string { return fmt.Sprintf("demo://items/%04d", i+1) }

func (d *demo) note(id, rev int) chaosmcp.Resource {
	return chaosmcp.Resource{
		URI: fmt.Sprintf("demo://notes/%d", id), Name: fmt.Sprintf("note %d", id), MIMEType: "text/plain",
		Text: fmt.Sprintf("note %d, revision %d: %s\n", id, rev, d.sentence(6)),
	}
}

func (d *demo) clock() chaosmcp.Resource {
	return chaosmcp.Resource{URI: "demo://clock/now", Name: "clock", MIMEType: "text/plain", Text: time.Now().UTC().Format(time.RFC3339Nano) + "\n"}
}

func (d *demo) item(i int) chaosmcp.Resource {
	return chaosmcp.Resource{
		URI: itemURI(i), Name: fmt.Sprintf("item %d", i+1), MIMEType: "text/plain",
		Text: fmt.Sprintf("item %d, revision %d: %s\n", i+1, d.itemRev[i], d.sentence(4)),
	}
}

// populate stores the initial content.
func (d *demo) populate() {
	rs := []chaosmcp.Resource{d.clock(), d.note(1, 0), d.note(2, 0)}
	for i := range d.c.resources {
		rs = append(rs, d.item(i))
	}
	d.s.PutMany(rs...)
	d.s.SetTemplate(chaosmcp.Template{URITemplate: "demo://notes/{id}", Name: "note", MIMEType: "text/plain"})
	d.s.SetTemplate(chaosmcp.Template{URITemplate: "demo://items/{n}", Name: "item", MIMEType: "text/plain"})
}

// tick changes the content every interval until ctx ends.
func (d *demo) tick(ctx context.Context, logger *slog.Logger) {
	t := time.NewTicker(d.c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.ticks++
		changed := []chaosmcp.Resource{d.clock(), d.note(1, d.ticks)}
		if d.ticks%2 == 0 {
			changed = append(changed, d.note(2, d.ticks/2))
		}
		for range min(d.c.itemUpdates, d.c.resources) {
			i := d.rng.IntN(d.c.resources)
			d.itemRev[i]++
			changed = append(changed, d.item(i))
		}
		d.s.PutMany(changed...)
		logger.Debug("tick", "n", d.ticks, "changed", len(changed))
	}
}
