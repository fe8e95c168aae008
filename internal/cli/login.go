package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

func init() {
	register(command{"source login", `NAME | --url URL --oauth authorization_code --oauth-token-file PATH [connection flags] [--timeout 5m]: run the OAuth authorization-code flow (PKCE, loopback redirect) and store the tokens (mode 0600)`, sourceLogin})
}

// maxLoginTimeout bounds --timeout of `source login`.
const maxLoginTimeout = 24 * time.Hour

// sourceLogin is `mcpsync source login` (issue 14 item 1): the authorization-code flow with
// PKCE for a source configured with --oauth authorization_code (mcphost.Login): it prints the
// URL to open, waits for the browser's redirect to a loopback listener on 127.0.0.1, and
// stores the tokens in the source's token file (mode 0600), which the worker then uses and
// refreshes. NAME reads the source from the ledger (unknown: exit 3); --url with the
// connection flags logs in without the ledger (before `source add`, or for `source check`).
// A source that does not use the authorization-code flow is bad input (exit 2).
func sourceLogin(ctx context.Context, e *runEnv, args []string) error {
	const usage = `mcpsync source login NAME [--timeout 5m] | mcpsync source login --url URL --oauth authorization_code --oauth-token-file PATH [connection flags] [--timeout 5m]`
	fs := flag.NewFlagSet("source login", flag.ContinueOnError)
	sf := newSourceFlags(fs, usage)
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the browser's redirect")
	pos, err := parse(fs, args, usage, "[NAME]")
	if err != nil {
		return err
	}
	if err := positive("timeout", *timeout); err != nil {
		return err
	}
	if *timeout > maxLoginTimeout {
		return usageErr("--timeout must be at most %s, got %s", maxLoginTimeout, *timeout)
	}
	var flagsSet []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "timeout" {
			flagsSet = append(flagsSet, "--"+f.Name)
		}
	})
	var src ledger.Source
	switch {
	case len(pos) == 1 && len(flagsSet) > 0:
		return usageErr("give NAME or the source's flags (%s), not both (usage: %s)", strings.Join(flagsSet, " "), usage)
	case len(pos) == 0 && len(flagsSet) == 0:
		return usageErr("missing NAME (usage: %s)", usage)
	case len(pos) == 0:
		spec, err := sf.spec("login")
		if err != nil {
			return err
		}
		if err := loginable(spec); err != nil {
			return err
		}
		src = ledger.Source{SourceSpec: spec}
	default:
		_, s, err := e.storeLiveSource(ctx, pos[0])
		if err != nil {
			return err
		}
		if err := loginable(s.SourceSpec); err != nil {
			return err
		}
		src = s
	}
	res, err := mcphost.Login(ctx, src, mcphost.LoginOptions{Out: e.Stdout, Timeout: *timeout})
	if errors.Is(err, mcphost.ErrNoAuthorization) {
		return fmt.Errorf("source %s: %w", visible(src.Name), err)
	}
	if err != nil {
		return err
	}
	expiry := "no expiry given"
	if !res.Expiry.IsZero() {
		expiry = "access token valid until " + res.Expiry.UTC().Format(time.RFC3339)
	}
	refresh := "no refresh token (log in again when it expires)"
	if res.Refresh {
		refresh = "refresh token stored (the worker refreshes it)"
	}
	fmt.Fprintf(e.Stdout, "logged in: source %s, tokens stored in %s (mode 0600); %s; %s\n",
		visible(src.Name), visible(res.TokenFile), expiry, refresh)
	return nil
}

// loginable is a usage error unless spec is an HTTP source with OAuth authorization code.
func loginable(spec ledger.SourceSpec) error {
	o := spec.Connection.OAuth
	if spec.Transport != ledger.TransportHTTP || o == nil || o.Flow != ledger.OAuthAuthorizationCode {
		return usageErr("source %s does not use --oauth %s: there is nothing to log in to", visible(spec.Name), ledger.OAuthAuthorizationCode)
	}
	return nil
}
