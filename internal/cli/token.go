package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"token create", "PRINCIPAL [--ttl 720h] [--json]: make a gateway bearer token for PRINCIPAL and print it " +
		"(the only time it is shown; the ledger keeps its hash); --ttl 0: never expires", tokenCreate})
	register(command{"token list", "[--json]: gateway tokens with their principal and state (never the tokens)", tokenList})
	register(command{"token revoke", "ID [--json]: revoke a gateway token; the gateway refuses it from now on and ends its streams", tokenRevoke})
}

// defaultTokenTTL is how long a token lives unless --ttl says otherwise.
const defaultTokenTTL = 720 * time.Hour

// tokenJSON is a token's record as token list and token revoke print it; Token is set only by
// token create.
type tokenJSON struct {
	ID        string     `json:"id"`
	Principal string     `json:"principal"`
	Token     string     `json:"token,omitempty"`
	Status    string     `json:"status"`
	CreatedAt time.Time  `json:"createdAt"`
	ExpiresAt *time.Time `json:"expiresAt"` // null: never
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
}

func toTokenJSON(t ledger.Token, now time.Time) tokenJSON {
	return tokenJSON{ID: t.ID, Principal: t.Principal, Status: t.Status(now), CreatedAt: t.CreatedAt.UTC(),
		ExpiresAt: utcPtr(t.ExpiresAt), RevokedAt: utcPtr(t.RevokedAt)}
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// tokenCreate prints a new token: plain output is the token alone on one line (so that
// `TOKEN=$(mcpsync token create alice)` works); a note naming its ID and expiry goes to
// stderr. The token is never logged.
func tokenCreate(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync token create PRINCIPAL [--ttl 720h] [--json]"
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	ttl := fs.Duration("ttl", defaultTokenTTL, "how long the token authenticates; 0: never expires")
	asJSON := fs.Bool("json", false, "print JSON (id, principal, token, expiresAt)")
	pos, err := parse(fs, args, usage, "PRINCIPAL")
	if err != nil {
		return err
	}
	if err := notEmpty("PRINCIPAL", pos[0]); err != nil {
		return err
	}
	if err := ledger.CheckPrincipal(pos[0]); err != nil {
		return usageErr("%v", err)
	}
	if err := nonNegative("ttl", *ttl); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	t, plaintext, err := st.CreateToken(ctx, pos[0], *ttl)
	if err != nil {
		return err
	}
	if *asJSON {
		j := toTokenJSON(t, t.CreatedAt)
		j.Token = plaintext
		return writeJSON(e.Stdout, j)
	}
	fmt.Fprintln(e.Stdout, plaintext)
	fmt.Fprintf(e.Stderr, "token %s for %s, expires %s; it is shown only this once\n", t.ID, visible(t.Principal), expiry(t.ExpiresAt))
	return nil
}

func expiry(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return fmtTime(t)
}

func tokenList(ctx context.Context, e *runEnv, args []string) error {
	fs := flag.NewFlagSet("token list", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, "mcpsync token list [--json]"); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	ts, err := st.Tokens(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	if *asJSON {
		out := make([]tokenJSON, 0, len(ts))
		for _, t := range ts {
			out = append(out, toTokenJSON(t, now))
		}
		return writeJSON(e.Stdout, out)
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPRINCIPAL\tSTATE\tCREATED\tEXPIRES\tREVOKED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, visible(t.Principal), t.Status(now), fmtTime(&t.CreatedAt),
			expiry(t.ExpiresAt), fmtTime(t.RevokedAt))
	}
	return tw.Flush()
}

func tokenRevoke(ctx context.Context, e *runEnv, args []string) error {
	fs := flag.NewFlagSet("token revoke", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, "mcpsync token revoke ID [--json]", "ID")
	if err != nil {
		return err
	}
	if !ledger.ValidTokenID(pos[0]) {
		return usageErr("%q is not a token ID (tok_ and 12 hex digits; see mcpsync token list)", pos[0])
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	t, err := st.RevokeToken(ctx, pos[0])
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundErr("no token %s (see mcpsync token list)", pos[0])
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.Stdout, toTokenJSON(t, time.Now()))
	}
	fmt.Fprintf(e.Stdout, "token %s of %s revoked at %s\n", t.ID, visible(t.Principal), fmtTime(t.RevokedAt))
	return nil
}
