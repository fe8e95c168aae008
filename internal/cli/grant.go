package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"grant", "PRINCIPAL SOURCE [--json]: let PRINCIPAL subscribe to and read SOURCE", grantCmd})
	register(command{"grants", "[PRINCIPAL] [--json]: grants, standing and revoked", grantsCmd})
}

type grantJSON struct {
	Principal    string     `json:"principal"`
	Source       string     `json:"source"`
	Epoch        int64      `json:"epoch"`
	Standing     bool       `json:"standing"`
	GrantedAt    time.Time  `json:"grantedAt"`
	GrantedBy    string     `json:"grantedBy,omitempty"`
	RevokedAt    *time.Time `json:"revokedAt,omitempty"`
	RevocationID *int64     `json:"revocationId,omitempty"`
	Created      bool       `json:"created,omitempty"`
}

func toGrantJSON(g ledger.Grant) grantJSON {
	return grantJSON{Principal: g.Principal, Source: g.SourceName, Epoch: g.Epoch, Standing: g.Standing(),
		GrantedAt: g.GrantedAt.UTC(), GrantedBy: g.GrantedBy, RevokedAt: g.RevokedAt, RevocationID: g.RevocationID}
}

func grantCmd(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync grant PRINCIPAL SOURCE [--json]"
	fs := flag.NewFlagSet("grant", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "PRINCIPAL", "SOURCE")
	if err != nil {
		return err
	}
	if err := notEmpty("PRINCIPAL", pos[0]); err != nil {
		return err
	}
	// A removed source serves nothing to grant; its standing grants count again once it is
	// added back.
	st, src, err := e.storeLiveSource(ctx, pos[1])
	if err != nil {
		return err
	}
	g, created, err := st.GrantAccess(ctx, pos[0], src.ID, "mcpsync grant")
	if err != nil {
		return err
	}
	if *asJSON {
		j := toGrantJSON(g)
		j.Created = created
		return writeJSON(e.Stdout, j)
	}
	verb := "granted"
	if !created {
		verb = "already stands"
	}
	fmt.Fprintf(e.Stdout, "grant of %s on %s %s (epoch %d)\n", g.Principal, g.SourceName, verb, g.Epoch)
	return nil
}

func grantsCmd(ctx context.Context, e *runEnv, args []string) error {
	fs := flag.NewFlagSet("grants", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, "mcpsync grants [PRINCIPAL] [--json]", "[PRINCIPAL]")
	if err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	principal := ""
	if len(pos) == 1 {
		principal = pos[0]
	}
	gs, err := st.Grants(ctx, principal)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]grantJSON, 0, len(gs))
		for _, g := range gs {
			out = append(out, toGrantJSON(g))
		}
		return writeJSON(e.Stdout, out)
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tSOURCE\tSTANDING\tEPOCH\tGRANTED AT\tREVOKED AT\tREVOCATION")
	for _, g := range gs {
		rev := "-"
		if g.RevocationID != nil {
			rev = strconv.FormatInt(*g.RevocationID, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s\t%s\t%s\n", g.Principal, g.SourceName, g.Standing(), g.Epoch,
			fmtTime(&g.GrantedAt), fmtTime(g.RevokedAt), rev)
	}
	return tw.Flush()
}
