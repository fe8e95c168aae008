package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/launch"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// stdin is what `--uris-file -` reads (tests replace it).
var stdin io.Reader = os.Stdin

// maxURILine bounds one line of a --uris-file: a URI longer than a search attribute value is
// refused anyway (normalizeURI), so a longer line is a bad input, not a reason to buffer more.
const maxURILine = 64 << 10

// maxBadShown is how many malformed URIs the one error line names.
const maxBadShown = 5

// bulkPollInterval is how often a bulk subscribe reads the ledger while it waits.
const bulkPollInterval = 250 * time.Millisecond

func subscribe(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync subscribe SOURCE URI [URI...] [--uris-file F] [--parallel 16] [--window 200] [--principal P] [--wait 20s] [--json]"
	fs := flag.NewFlagSet("subscribe", flag.ContinueOnError)
	principal := fs.String("principal", "default", "principal the subscription is for")
	wait := fs.Duration("wait", 20*time.Second, "how long to wait for ACTIVE (0: do not wait); with many URIs, for all of them")
	asJSON := fs.Bool("json", false, "print JSON")
	urisFile := fs.String("uris-file", "", "read more URIs from `FILE`, one per line ('-': standard input; blank lines and lines starting with # are skipped)")
	parallel := fs.Int("parallel", 16, "with many URIs: how many workflow starts are in flight at once")
	window := fs.Int("window", contract.EagerWindowMax, "with many URIs and --wait: how many subscriptions may be starting (started, not yet ACTIVE) at once; 0: no bound (up to "+strconv.Itoa(contract.EagerWindowMax)+" the worker starts them, eagerly)")
	names := []string{"[SOURCE]", "[URI]"} // what is missing is said below
	for range args {
		names = append(names, "[URI]")
	}
	pos, err := parse(fs, args, usage, names...)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("missing SOURCE URI (usage: %s)", usage)
	case len(pos) == 1 && !isSet(fs, "uris-file"):
		return usageErr("missing URI (usage: %s)", usage)
	}
	if err := notEmpty("--principal", *principal); err != nil {
		return err
	}
	if err := nonNegative("wait", *wait); err != nil {
		return err
	}
	if *parallel < 1 {
		return usageErr("--parallel must be at least 1, got %d", *parallel)
	}
	if *window < 0 {
		return usageErr("--window must not be negative, got %d", *window)
	}
	if len(pos) == 2 && !isSet(fs, "uris-file") {
		// One URI: the original command, its output unchanged.
		norm, err := normalizeURI(pos[1])
		if err != nil {
			return err
		}
		return subscribeOne(ctx, e, subTarget{source: pos[0], uri: norm, raw: pos[1]}, principal, wait, asJSON)
	}
	items, dups, err := bulkTargets(pos[1:], *urisFile, isSet(fs, "uris-file"))
	if err != nil {
		return err
	}
	return subscribeMany(ctx, e, bulkRequest{
		source: pos[0], principal: *principal, wait: *wait, parallel: *parallel, window: *window, asJSON: *asJSON,
		items: items, duplicates: dups,
	})
}

// bulkItem is one URI of a bulk subscribe.
type bulkItem struct {
	where string // "argument 3", "line 7 of urls.txt"
	raw   string // as given: what the server is asked for
	norm  string
}

// bulkTargets collects the URIs of the arguments and of the file (if fromFile), normalizes
// them and drops repeats (counted in dups). Any malformed URI is one usage error naming the
// first few, before anything is contacted: nothing is started for a list that has a bad line.
func bulkTargets(args []string, file string, fromFile bool) (items []bulkItem, dups int, err error) {
	var raw []bulkItem
	for i, a := range args {
		raw = append(raw, bulkItem{where: fmt.Sprintf("argument %d", i+2), raw: a})
	}
	if fromFile {
		fromF, err := readURIsFile(file)
		if err != nil {
			return nil, 0, err
		}
		raw = append(raw, fromF...)
	}
	if len(raw) == 0 {
		return nil, 0, usageErr("no URIs given: %s holds none", fileName(file))
	}
	seen := make(map[string]bool, len(raw))
	var bad []string
	nBad := 0
	for _, it := range raw {
		norm, err := normalizeURI(it.raw)
		if err != nil {
			nBad++
			if len(bad) < maxBadShown {
				bad = append(bad, fmt.Sprintf("%s: %v", it.where, err))
			}
			continue
		}
		if seen[norm] {
			dups++
			continue
		}
		seen[norm] = true
		it.norm = norm
		items = append(items, it)
	}
	if nBad > 0 {
		more := ""
		if nBad > len(bad) {
			more = fmt.Sprintf("; and %d more", nBad-len(bad))
		}
		return nil, 0, usageErr("%d of %d URIs are malformed, nothing was subscribed: %s%s", nBad, len(raw), strings.Join(bad, "; "), more)
	}
	return items, dups, nil
}

func fileName(file string) string {
	if file == "-" {
		return "standard input"
	}
	return fmt.Sprintf("%q", file)
}

// readURIsFile reads one URI a line from file ('-': standard input), skipping blank lines and
// lines starting with '#'; surrounding white space is not part of a URI.
func readURIsFile(file string) ([]bulkItem, error) {
	if strings.TrimSpace(file) == "" {
		return nil, usageErr("--uris-file must not be empty")
	}
	r := stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usageErr("--uris-file: %v", err)
		}
		defer f.Close()
		r = f
	}
	var out []bulkItem
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxURILine)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		out = append(out, bulkItem{where: fmt.Sprintf("line %d of %s", line, fileName(file)), raw: t})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, usageErr("--uris-file: line %d of %s is longer than %d bytes", line+1, fileName(file), maxURILine)
		}
		return nil, usageErr("--uris-file: reading %s: %v", fileName(file), err)
	}
	return out, nil
}

// bulkRequest is a validated bulk subscribe.
type bulkRequest struct {
	source, principal string
	wait              time.Duration
	parallel          int
	window            int // 0: unbounded
	asJSON            bool
	items             []bulkItem
	duplicates        int
}

// bulkResult is the outcome of one URI of a bulk subscribe.
type bulkResult struct {
	wfID      string
	closedGen int64 // the generation a CLOSED row had before the start: the new one is above
	// isNew: no row before the start; such a subscription is done once its first read is
	// settled: a first version accepted, or closed (say, the server has no such resource).
	isNew    bool
	startErr error
	sub      *ledger.Subscription
}

// bulkJSON is one URI of a bulk subscribe as --json prints it.
type bulkJSON struct {
	URI               string        `json:"uri"`
	ServerURI         string        `json:"serverUri"`
	State             mcpsync.State `json:"state,omitempty"`
	WorkflowID        string        `json:"workflowId"`
	Generation        int64         `json:"generation,omitempty"`
	SessionGeneration int64         `json:"sessionGeneration,omitempty"`
	Error             string        `json:"error,omitempty"`
}

// subscribeMany starts the subscription workflows of many URIs with at most r.parallel
// starts in flight — with a wait and a window of at most contract.EagerWindowMax, through the
// worker in batches (startBatches), whose starts are eager — then (r.wait > 0) waits until
// each is ACTIVE or failed, reading the ledger once per poll for all of them. It prints one line per URI that failed (stderr), a
// summary (stdout), and returns an error (exit 1) if any failed. Every start is idempotent
// (launch.Subscription), so running it again after a partial failure is safe.
func subscribeMany(ctx context.Context, e *runEnv, r bulkRequest) error {
	began := time.Now()
	st, src, err := e.storeLiveSource(ctx, r.source)
	if err != nil {
		return err
	}
	if err := st.CheckGrant(ctx, r.principal, src.ID); err != nil {
		return deniedErr(err, src.Name)
	}
	tc, err := e.temporal(ctx)
	if err != nil {
		return err
	}
	if r.wait > 0 {
		if err := awaitWorker(ctx, tc); err != nil {
			return err
		}
	}
	// One read of the ledger for the CLOSED rows (see subscribeOne: their next generation is
	// the one to wait for, and their closing run must end before a new one can start).
	existing, err := subscriptionsByURI(ctx, st, r.source, r.principal, nil)
	if err != nil {
		return err
	}
	results := make([]bulkResult, len(r.items))
	next := make(chan int)
	var wg sync.WaitGroup
	if r.wait > 0 && r.window > 0 && r.window <= contract.EagerWindowMax {
		// A worker answered (awaitWorker): it starts the URIs, eagerly, in batches; the window
		// bounds how many eager first workflow tasks it holds at once.
		b := &startBatches{e: e, tc: tc, src: src, r: r, existing: existing, results: results}
		wg.Go(func() { b.run(ctx, next) })
	} else {
		for range min(r.parallel, len(r.items)) {
			wg.Go(func() {
				for i := range next {
					results[i] = startOne(ctx, e, tc, src, r, r.items[i], existing)
				}
			})
		}
	}
	win := newStartWindow(st, r, src.Name, existing)
feed:
	for i := range r.items {
		if err := win.admit(ctx, i); err != nil {
			break feed
		}
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.wait > 0 {
		if err := awaitBulk(ctx, st, r, results); err != nil {
			return err
		}
	}
	if err := reportBulk(e, r, results, time.Since(began)); err != nil {
		return fmt.Errorf("%w%s", err, sourceNotLive(ctx, st, src))
	}
	return nil
}

// subscriptionsByURI returns principal's subscriptions on source keyed by normalized URI; with
// uris not nil, only those to one of uris (the waits below read only what they still wait
// for: reading every subscription of a 10,000-URI bulk four times a second was a third of the
// ledger's time during the bulk subscribe, issue 16 item 4).
func subscriptionsByURI(ctx context.Context, st *ledger.Store, source, principal string, uris []string) (map[string]ledger.Subscription, error) {
	subs, err := st.ListSubscriptions(ctx, ledger.SubscriptionFilter{Source: source, Principal: principal, URIs: uris})
	if err != nil {
		return nil, err
	}
	m := make(map[string]ledger.Subscription, len(subs))
	for _, s := range subs {
		m[s.URI] = s
	}
	return m, nil
}

// pendingResult is item it's result before its start: its workflow ID, whether it had no
// subscription row, and the generation of a CLOSED row (0 for any other).
func pendingResult(r bulkRequest, source string, it bulkItem, existing map[string]ledger.Subscription) bulkResult {
	res := bulkResult{wfID: contract.SubscriptionWorkflowID(r.principal, source, it.norm)}
	prev, ok := existing[it.norm]
	res.isNew = !ok
	if ok && prev.State == mcpsync.StateClosed {
		res.closedGen = prev.Generation
	}
	return res
}

func startOne(ctx context.Context, e *runEnv, tc client.Client, src ledger.Source, r bulkRequest, it bulkItem, existing map[string]ledger.Subscription) bulkResult {
	res := pendingResult(r, src.Name, it, existing)
	if prev, ok := existing[it.norm]; ok && prev.State == mcpsync.StateClosed {
		if err := awaitEndedRun(ctx, tc, res.wfID, r.wait); err != nil {
			res.startErr = err
			return res
		}
	}
	_, err := launch.Subscription(ctx, tc, e.Config.Namespace, res.wfID, contract.SubscriptionInput{
		Principal: r.principal, Source: src.Name, SourceID: src.ID, URI: it.norm, ServerURI: it.raw,
		BackstopSeconds: src.BackstopSeconds, PollSeconds: src.PollSeconds,
	})
	if err != nil {
		res.startErr = fmt.Errorf("starting subscription workflow %s: %w", res.wfID, err)
	}
	return res
}

// bulkDone reports whether a started URI has reached an answer: ACTIVE or closing, in a
// generation after the one closed before the start (the condition subscribeOne waits for);
// a new subscription is ACTIVE for the answer only once its first version is accepted, since
// its first read may still close it.
func bulkDone(res bulkResult) bool {
	s := res.sub
	return s != nil && s.WorkflowID == res.wfID && s.Generation > res.closedGen &&
		((s.State == mcpsync.StateActive && (!res.isNew || s.LastAcceptedOrdinal > 0)) || s.State.Closing())
}

// awaitBulk reads the ledger every bulkPollInterval until every started URI has an answer or
// r.wait has passed, leaving the last view of each in results.
func awaitBulk(ctx context.Context, st *ledger.Store, r bulkRequest, results []bulkResult) error {
	deadline := time.Now().Add(r.wait)
	var uris []string // nil: every subscription, the first time
	for {
		subs, err := subscriptionsByURI(ctx, st, r.source, r.principal, uris)
		if err != nil {
			return err
		}
		pending := []string{}
		for i, it := range r.items {
			if results[i].startErr != nil || (uris != nil && bulkDone(results[i])) {
				continue
			}
			if s, ok := subs[it.norm]; ok {
				results[i].sub = &s
			}
			if !bulkDone(results[i]) {
				pending = append(pending, it.norm)
			}
		}
		if len(pending) == 0 || !time.Now().Before(deadline) {
			return nil
		}
		uris = pending
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(bulkPollInterval):
		}
	}
}

// bulkFailure says why one URI did not succeed, or "" if it did: ACTIVE after a wait, or
// started without one.
func bulkFailure(res bulkResult, r bulkRequest) string {
	s := res.sub
	switch {
	case res.startErr != nil:
		return res.startErr.Error()
	case r.wait == 0:
		return ""
	case s == nil:
		return fmt.Sprintf("workflow %s has not written its subscription to the ledger after %s; is mcpsync-worker healthy?", res.wfID, r.wait)
	case bulkDone(res) && s.State == mcpsync.StateActive:
		return ""
	case s.Generation <= res.closedGen:
		return fmt.Sprintf("not reopened after %s: workflow %s has not opened the generation after %d (%s) yet", r.wait, res.wfID, s.Generation, s.State)
	case s.State == mcpsync.StateClosed:
		return fmt.Sprintf("subscription closed again in generation %d (%s)", s.Generation, s.StateReason)
	case s.State.Closing():
		return fmt.Sprintf("subscription is closing (%s: %s); subscribe again once it is CLOSED", s.State, s.StateReason)
	case s.State == mcpsync.StateActive:
		return fmt.Sprintf("ACTIVE but no first version accepted after %s", r.wait)
	default:
		return fmt.Sprintf("not ACTIVE after %s: %s %s", r.wait, s.State, orDash(s.StateReason))
	}
}

// reportBulk prints the failures (one line each, stderr) and the summary (stdout), or with
// --json one object per URI; it returns an error when any URI failed.
func reportBulk(e *runEnv, r bulkRequest, results []bulkResult, took time.Duration) error {
	failed := 0
	var js []bulkJSON
	for i, it := range r.items {
		why := bulkFailure(results[i], r)
		if why != "" {
			failed++
			if !r.asJSON {
				fmt.Fprintf(e.Stderr, "mcpsync subscribe: %s (%s): %s\n", it.norm, it.where, visible(oneLine(why)))
			}
		}
		if r.asJSON {
			j := bulkJSON{URI: it.norm, ServerURI: it.raw, WorkflowID: results[i].wfID, Error: why}
			if s := results[i].sub; s != nil {
				j.State, j.Generation, j.SessionGeneration = s.State, s.Generation, s.SessionGeneration
			} else if results[i].startErr == nil {
				j.State = mcpsync.StateDiscovered
			}
			js = append(js, j)
		}
	}
	if r.asJSON {
		if err := writeJSON(e.Stdout, js); err != nil {
			return err
		}
	} else {
		outcome := "ACTIVE"
		if r.wait == 0 {
			outcome = "started"
		}
		dups := ""
		if r.duplicates > 0 {
			dups = fmt.Sprintf(", %d repeated URIs skipped", r.duplicates)
		}
		fmt.Fprintf(e.Stdout, "%s %s: %d URIs, %d %s, %d failed%s (%.1fs)\n", visible(r.source), visible(r.principal),
			len(r.items), len(r.items)-failed, outcome, failed, dups, took.Seconds())
	}
	if failed > 0 {
		where := "listed above"
		if r.asJSON {
			where = "see their error fields"
		}
		return fmt.Errorf("%d of %d URIs failed (%s)", failed, len(r.items), where)
	}
	return nil
}

// startWindow keeps at most r.window subscriptions of a bulk subscribe starting at once (fed
// to a start, not yet ACTIVE, closing or failed in the ledger): every start puts workflow and
// activity tasks in the one task queue the worker serves, and thousands at once would wait
// there behind each other (their session-bound activities timing out and backing off) and in
// front of the live updates of the subscriptions already established (issue 16 item 4).
type startWindow struct {
	st       *ledger.Store
	r        bulkRequest
	closed   map[string]int64 // URI → generation of its CLOSED row before the start
	wfIDs    []string
	settled  []bool
	fedAt    []time.Time
	isNew    []bool
	fed      int
	nSettled int
}

func newStartWindow(st *ledger.Store, r bulkRequest, source string, existing map[string]ledger.Subscription) *startWindow {
	w := &startWindow{st: st, r: r, closed: map[string]int64{}, wfIDs: make([]string, len(r.items)),
		settled: make([]bool, len(r.items)), fedAt: make([]time.Time, len(r.items)), isNew: make([]bool, len(r.items))}
	for i, it := range r.items {
		w.wfIDs[i] = contract.SubscriptionWorkflowID(r.principal, source, it.norm)
		prev, ok := existing[it.norm]
		w.isNew[i] = !ok
		if ok && prev.State == mcpsync.StateClosed {
			w.closed[it.norm] = prev.Generation
		}
	}
	return w
}

// admit returns once item i may be started: at once without a window or a wait, else when
// fewer than r.window of the items fed so far are unsettled, reading the ledger every
// bulkPollInterval meanwhile. A start that failed settles when its subscription never shows
// up: after r.wait it no longer holds a place.
func (w *startWindow) admit(ctx context.Context, i int) error {
	if w.r.window == 0 || w.r.wait == 0 {
		return nil
	}
	for w.fed-w.nSettled >= w.r.window {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(bulkPollInterval):
		}
		uris := []string{}
		for j := range w.fed {
			if !w.settled[j] {
				uris = append(uris, w.r.items[j].norm)
			}
		}
		subs, err := subscriptionsByURI(ctx, w.st, w.r.source, w.r.principal, uris)
		if err != nil {
			return err
		}
		for j := range w.fed {
			if w.settled[j] {
				continue
			}
			it := w.r.items[j]
			s, ok := subs[it.norm]
			done := ok && bulkDone(bulkResult{wfID: w.wfIDs[j], closedGen: w.closed[it.norm], isNew: w.isNew[j], sub: &s})
			if !done && s.State == mcpsync.StateReconciliationRequired {
				done = true // its workflow backs off and retries; the wait below reports it
			}
			if !done {
				done = time.Since(w.fedAt[j]) > w.r.wait
			}
			if done {
				w.settled[j] = true
				w.nSettled++
			}
		}
	}
	w.fedAt[i] = time.Now()
	w.fed = i + 1
	return nil
}
