package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/api/serviceerror"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Source lifecycle (issue 14, item 5): `source update` and `source remove`, and `source add`
// of a removed source's name, which brings that source back.

func init() {
	register(command{"source update", `NAME [the flags of source add]: change a source's definition (flags not given keep their ` +
		`values; switching transport needs --url or --stdio and drops the other transport's settings); the session reconnects with it as a new generation`, sourceUpdate})
	register(command{"source remove", "NAME [--purge] [--wait 20s] [--json]: remove a source: its subscriptions pass the close fence, " +
		"receipts and versions stay; --purge also deletes its stored content once every subscription is CLOSED; the name may be added again", sourceRemove})
}

// Flags of sourceFlags by what they configure: a transport's own settings, and the ones every
// source has. A flag not listed here would be lost by `source update`; a test keeps these
// lists equal to newSourceFlags.
var (
	httpFlags = []string{"url", "header", "header-env", "bearer-env", "bearer-file", "ca-file", "cert-file", "key-file",
		"oauth", "oauth-client-id", "oauth-client-secret-env", "oauth-client-secret-file", "oauth-scopes", "oauth-token-file",
		"oauth-client-metadata-url", "oauth-client-key-file"}
	stdioFlags   = []string{"stdio", "env", "cwd"}
	neutralFlags = []string{"subject", "backstop", "poll", "max-bytes", "protocol"}
)

// storedFlagValues returns the flag values that reproduce src's definition, by flag name;
// repeatable flags have one value per occurrence.
func storedFlagValues(src ledger.Source) map[string][]string {
	c := src.Connection
	v := map[string][]string{
		"subject":  {src.Subject},
		"backstop": {strconv.Itoa(src.BackstopSeconds) + "s"},
		"poll":     {strconv.Itoa(src.PollSeconds) + "s"},
	}
	one := func(name, val string) {
		if val != "" {
			v[name] = []string{val}
		}
	}
	if c.MaxBytes != 0 {
		one("max-bytes", strconv.FormatInt(c.MaxBytes, 10))
	}
	one("protocol", c.Protocol)
	switch src.Transport {
	case ledger.TransportHTTP:
		one("url", src.URL)
	case ledger.TransportStdio:
		one("stdio", JoinCommand(src.Command))
	}
	for _, h := range c.Headers {
		v["header"] = append(v["header"], h.Name+": "+h.Value)
	}
	for _, h := range c.HeaderEnv {
		v["header-env"] = append(v["header-env"], h.Name+"="+h.Env)
	}
	one("bearer-env", c.BearerEnv)
	one("bearer-file", c.BearerFile)
	one("ca-file", c.CAFile)
	one("cert-file", c.CertFile)
	one("key-file", c.KeyFile)
	if o := c.OAuth; o != nil {
		one("oauth", o.Flow)
		one("oauth-client-id", o.ClientID)
		one("oauth-client-secret-env", o.ClientSecretEnv)
		one("oauth-client-secret-file", o.ClientSecretFile)
		one("oauth-scopes", strings.Join(o.Scopes, " "))
		one("oauth-token-file", o.TokenFile)
		one("oauth-client-metadata-url", o.ClientMetadataURL)
		one("oauth-client-key-file", o.ClientKeyFile)
	}
	for _, e := range c.Env {
		if e.FromEnv != "" {
			v["env"] = append(v["env"], e.Name+"=env:"+e.FromEnv)
		} else {
			v["env"] = append(v["env"], e.Name+"="+e.Value)
		}
	}
	one("cwd", c.Cwd)
	return v
}

// givenFlags returns the names of the flags given on fs's command line.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given
}

// onlyFlagOf returns the first given flag among names, or "".
func onlyFlagOf(given map[string]bool, names []string) string {
	for _, n := range names {
		if given[n] {
			return n
		}
	}
	return ""
}

// updateArgs parses `source update`'s arguments and checks, before anything is contacted,
// that the given flags make sense on their own (exit 2 otherwise): they are checked as a
// definition whose missing transport target is a placeholder.
func updateArgs(args []string, usage string) (name string, fs *flag.FlagSet, sf *sourceFlags, asJSON bool, err error) {
	fs = flag.NewFlagSet("source update", flag.ContinueOnError)
	sf = newSourceFlags(fs, usage)
	j := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "NAME")
	if err != nil {
		return "", nil, nil, false, err
	}
	given := givenFlags(fs)
	delete(given, "json")
	if len(given) == 0 {
		return "", nil, nil, false, usageErr("nothing to update: give at least one flag of source add (usage: %s)", usage)
	}
	// The same flags again, on a trial set, with a placeholder target if none was given.
	tfs := flag.NewFlagSet("source update", flag.ContinueOnError)
	tsf := newSourceFlags(tfs, usage)
	tfs.Bool("json", false, "")
	if _, err := parse(tfs, args, usage, "NAME"); err != nil {
		return "", nil, nil, false, err
	}
	if !given["stdio"] && !given["url"] {
		placeholder := []string{"stdio", "placeholder"}
		if onlyFlagOf(given, httpFlags) != "" {
			placeholder = []string{"url", "http://placeholder.invalid/"}
		}
		if err := tfs.Set(placeholder[0], placeholder[1]); err != nil {
			return "", nil, nil, false, err
		}
	}
	if _, err := tsf.spec(pos[0]); err != nil {
		return "", nil, nil, false, err
	}
	return pos[0], fs, sf, *j, nil
}

func sourceUpdate(ctx context.Context, e *runEnv, args []string) error {
	const usage = `mcpsync source update NAME ` + sourceFlagsUsage + ` [--json]`
	name, fs, sf, asJSON, err := updateArgs(args, usage)
	if err != nil {
		return err
	}
	st, src, err := e.storeLiveSource(ctx, name)
	if err != nil {
		return err
	}
	given := givenFlags(fs)
	own, other := httpFlags, stdioFlags
	if src.Transport == ledger.TransportStdio {
		own, other = stdioFlags, httpFlags
	}
	switching := given[other[0]] // --url on a stdio source, --stdio on an http one
	if f := onlyFlagOf(given, other); f != "" && !switching {
		return usageErr("--%s applies to %s source and %s is %s: give --%s too to switch its transport", f, article(otherTransport(src.Transport)), visible(src.Name), src.Transport, other[0])
	}
	// Flags not given keep their stored values; switching transport keeps only the settings
	// every source has (the old transport's target and settings no longer apply).
	carry := slices.Clone(neutralFlags)
	if !switching {
		carry = append(carry, own...)
	}
	stored := storedFlagValues(src)
	for _, f := range carry {
		if given[f] {
			continue
		}
		for _, v := range stored[f] {
			if err := fs.Set(f, v); err != nil {
				return fmt.Errorf("source %s: stored --%s %q does not parse: %w", visible(src.Name), f, v, err)
			}
		}
	}
	spec, err := sf.spec(name)
	if err != nil {
		return err
	}
	upd, changed, err := st.UpdateSource(ctx, spec, src.DefinitionVersion)
	if errors.Is(err, ledger.ErrSourceChanged) {
		return fmt.Errorf("source %s changed while this update was prepared (%v); run it again", visible(src.Name), err)
	}
	if errors.Is(err, ledger.ErrSourceRemoved) {
		return removedErr(src)
	}
	if err != nil {
		return err
	}
	if asJSON {
		j := toSourceJSON(upd)
		return writeJSON(e.Stdout, struct {
			sourceJSON
			DefinitionVersion int64 `json:"definitionVersion"`
			Changed           bool  `json:"changed"`
		}{j, upd.DefinitionVersion, changed})
	}
	if !changed {
		fmt.Fprintf(e.Stdout, "source %s unchanged (definition version %d)\n", visible(upd.Name), upd.DefinitionVersion)
		return nil
	}
	fmt.Fprintf(e.Stdout, "source %s updated to definition version %d (%s %s); its session reconnects with it as a new generation\n",
		visible(upd.Name), upd.DefinitionVersion, upd.Transport, visible(target(upd)))
	return nil
}

// article is "an http" or "a stdio".
func article(transport string) string {
	if transport == ledger.TransportHTTP {
		return "an http"
	}
	return "a " + transport
}

func otherTransport(t string) string {
	if t == ledger.TransportHTTP {
		return ledger.TransportStdio
	}
	return ledger.TransportHTTP
}

// removedErr says that src was removed (exit 3: nothing may be started on it).
func removedErr(src ledger.Source) error {
	return notFoundErr("source %s was removed %s", visible(src.Name), removedWhen(src))
}

// removedWhen is when the removed source src was removed and how to bring it back.
func removedWhen(src ledger.Source) string {
	return fmt.Sprintf("at %s (mcpsync source add %s ... adds it again)", src.RemovedAt.UTC().Format(time.RFC3339), visible(src.Name))
}

// addSource is `source add`'s ledger call: a new source, or, for the name of a removed
// source, that source back with the new definition as its next definition version (its
// history stays its own; subscribing again opens the next generation of a subscription).
func addSource(ctx context.Context, st *ledger.Store, spec ledger.SourceSpec) (ledger.Source, bool, error) {
	src, created, err := st.AddSource(ctx, spec)
	if (err == nil && !created || errors.Is(err, ledger.ErrSourceExists)) && src.RemovedAt != nil {
		src, err = st.ReaddSource(ctx, spec)
		return src, err == nil, err
	}
	return src, created, err
}

// removedSubJSON is one subscription `source remove` closes.
type removedSubJSON struct {
	SubscriptionID int64         `json:"subscriptionId"`
	WorkflowID     string        `json:"workflowId"`
	Principal      string        `json:"principal"`
	URI            string        `json:"uri"`
	StateAtRemoval mcpsync.State `json:"stateAtRemoval"`
	State          mcpsync.State `json:"state,omitempty"`
	SignalError    string        `json:"signalError,omitempty"`
}

// removeJSON is what `source remove --json` prints.
type removeJSON struct {
	Name          string              `json:"name"`
	RemovedAt     time.Time           `json:"removedAt"`
	Subscriptions []removedSubJSON    `json:"subscriptions"`
	Purged        *ledger.PurgeResult `json:"purged,omitempty"`
}

func sourceRemove(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync source remove NAME [--purge] [--wait 20s] [--json]"
	fs := flag.NewFlagSet("source remove", flag.ContinueOnError)
	purge := fs.Bool("purge", false, "also delete the source's stored content (resource bodies) once every subscription is CLOSED")
	wait := fs.Duration("wait", 20*time.Second, "how long to wait for the subscriptions to be CLOSED (0: do not wait)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "NAME")
	if err != nil {
		return err
	}
	if err := notEmpty("NAME", pos[0]); err != nil {
		return err
	}
	if err := nonNegative("wait", *wait); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	src, open, err := st.RemoveSource(ctx, pos[0])
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundErr("unknown source %q (see mcpsync source list)", pos[0])
	}
	if err != nil {
		return err
	}
	j := removeJSON{Name: src.Name, RemovedAt: src.RemovedAt.UTC(), Subscriptions: []removedSubJSON{}}
	ids := make([]int64, 0, len(open))
	failed := 0
	if len(open) > 0 {
		tc, err := e.temporal(ctx)
		if err != nil {
			return fmt.Errorf("source %s is removed, but its %d open subscription(s) were not told to close: %w; run mcpsync source remove %s again",
				visible(src.Name), len(open), err, visible(src.Name))
		}
		errs := signalClose(ctx, tc, open, fmt.Sprintf("source-remove/%d", src.ID), "source "+src.Name+" removed")
		if *wait > 0 {
			// The signals wait in Temporal for a worker; without one, say so now.
			if err := awaitWorker(ctx, tc); err != nil {
				return fmt.Errorf("source %s is removed and its %d open subscription(s) told to close, but %w", visible(src.Name), len(open), err)
			}
		}
		for i, o := range open {
			r := removedSubJSON{SubscriptionID: o.SubscriptionID, WorkflowID: o.WorkflowID, Principal: o.Principal, URI: o.URI, StateAtRemoval: o.State}
			if errs[i] != nil {
				r.SignalError = errs[i].Error()
				failed++
			} else {
				ids = append(ids, o.SubscriptionID)
			}
			j.Subscriptions = append(j.Subscriptions, r)
		}
	}
	states, err := waitClosed(ctx, st, ids, *wait)
	if err != nil {
		return err
	}
	notClosed := 0
	for i := range j.Subscriptions {
		if s, ok := states[j.Subscriptions[i].SubscriptionID]; ok {
			j.Subscriptions[i].State = s
		}
		if j.Subscriptions[i].State != mcpsync.StateClosed {
			notClosed++
		}
	}
	var purgeErr error
	if *purge {
		res, err := st.PurgeSourceContent(ctx, src.ID)
		var refusal *ledger.PurgeRefusal
		switch {
		case errors.As(err, &refusal):
			purgeErr = fmt.Errorf("content of source %s not purged: %d subscription(s) not CLOSED yet; run mcpsync source remove %s --purge again once they are",
				visible(src.Name), refusal.NotClosed, visible(src.Name))
		case err != nil:
			return err
		default:
			j.Purged = &res
		}
	}
	if *asJSON {
		if err := writeJSON(e.Stdout, j); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.Stdout, "source %s removed at %s; %d subscription(s) told to close, %d CLOSED; receipts and versions kept",
			visible(src.Name), j.RemovedAt.Format(time.RFC3339), len(open), len(j.Subscriptions)-notClosed)
		if j.Purged != nil {
			fmt.Fprintf(e.Stdout, "; content purged: %d body(ies), %d bytes", j.Purged.Blobs, j.Purged.Bytes)
		}
		fmt.Fprintln(e.Stdout)
	}
	switch {
	case failed > 0:
		return fmt.Errorf("source %s is removed, but %d subscription workflow(s) could not be told to close (see --json); run mcpsync reconcile %s, then mcpsync source remove %s again",
			visible(src.Name), failed, visible(src.Name), visible(src.Name))
	case purgeErr != nil:
		return purgeErr
	case *wait > 0 && notClosed > 0:
		return fmt.Errorf("source %s is removed, but %d subscription(s) were not CLOSED after %s", visible(src.Name), notClosed, *wait)
	}
	return nil
}

// signalClose tells each subscription's workflow to pass the close fence, as `mcpsync
// unsubscribe` does; errs[i] is the outcome for subs[i]. The signal ID makes a repeated
// removal a no-op in a workflow that already had it.
func signalClose(ctx context.Context, tc signaler, subs []ledger.OpenSubscription, id, reason string) []error {
	errs := make([]error, len(subs))
	for i, s := range subs {
		err := tc.SignalWorkflow(ctx, s.WorkflowID, "", contract.SignalUnsubscribe, contract.Unsubscribe{ID: id, Reason: reason})
		var nf *serviceerror.NotFound
		if errors.As(err, &nf) {
			err = fmt.Errorf("workflow %s is not running", s.WorkflowID)
		}
		errs[i] = err
	}
	return errs
}

// waitClosed polls the ledger until every subscription in ids is CLOSED or the timeout
// passes, and returns their last states.
func waitClosed(ctx context.Context, st *ledger.Store, ids []int64, timeout time.Duration) (map[int64]mcpsync.State, error) {
	deadline := time.Now().Add(timeout)
	for {
		states, err := st.SubscriptionStates(ctx, ids)
		if err != nil {
			return nil, err
		}
		done := true
		for _, s := range states {
			done = done && s == mcpsync.StateClosed
		}
		if done || !time.Now().Before(deadline) {
			return states, nil
		}
		select {
		case <-ctx.Done():
			return states, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
