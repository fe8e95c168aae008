package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/redact"
)

func init() {
	register(command{"source check", `--url URL | --stdio "CMD ARGS" [connection flags, see --help] [--timeout 30s] [--json]: connect once as a worker would, negotiate, list resources and print the capability receipt (no ledger, no worker)`, sourceCheck})
}

// Bounds of the resource listing of `source check`: a server that pages forever, or repeats
// a cursor, does not keep it running.
const (
	checkMaxResources = 100_000
	checkMaxPages     = 1_000
)

// checkReceipt is what `source check` prints: the capability receipt of one session and what
// its listing found.
type checkReceipt struct {
	Transport       string `json:"transport"`
	Target          string `json:"target"` // the URL with its secrets masked, or the command line
	ProtocolVersion string `json:"protocolVersion"`
	ServerName      string `json:"serverName"`
	ServerVersion   string `json:"serverVersion"`
	Resources       bool   `json:"resources"`
	Subscribe       bool   `json:"subscribe"`
	ListChanged     bool   `json:"listChanged"`
	ResourceCount   int    `json:"resourceCount"`
	Pages           int    `json:"pages"`
	// Truncated says the listing stopped at a bound (checkMaxResources, checkMaxPages or a
	// repeated cursor) rather than at the last page.
	Truncated string `json:"truncated,omitempty"`
}

// sourceCheck is `mcpsync source check` (issue 14, item 9): a one-shot connection with the
// same transport, headers, secrets and TLS files a worker would use (mcphost.DefaultTransport,
// read from this process's environment), no database and no worker. Exit 0 when the server
// negotiated and listed; 1 with one line otherwise (an authentication failure as
// "authentication failed: HTTP 401: <challenge>"); 2 for bad flags.
func sourceCheck(ctx context.Context, e *runEnv, args []string) error {
	const usage = `mcpsync source check ` + sourceFlagsUsage + ` [--timeout 30s] [--json]`
	fs := flag.NewFlagSet("source check", flag.ContinueOnError)
	sf := newSourceFlags(fs, usage)
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on the whole check: connect, negotiate and list")
	if _, err := parse(fs, args, usage); err != nil {
		return err
	}
	if err := positive("timeout", *timeout); err != nil {
		return err
	}
	spec, err := sf.spec("check")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	r, err := check(ctx, ledger.Source{SourceSpec: spec})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.Stdout, r)
	}
	yes := map[bool]string{true: "yes", false: "no"}
	fmt.Fprintf(e.Stdout, "ok: %s %s\n", r.Transport, visible(r.Target))
	fmt.Fprintf(e.Stdout, "  protocol     %s\n", visible(r.ProtocolVersion))
	fmt.Fprintf(e.Stdout, "  server       %s %s\n", visible(orDash(r.ServerName)), visible(orDash(r.ServerVersion)))
	if !r.Resources {
		fmt.Fprintln(e.Stdout, "  resources    not declared (nothing to sync)")
		return nil
	}
	fmt.Fprintf(e.Stdout, "  resources    subscribe: %s, listChanged: %s\n", yes[r.Subscribe], yes[r.ListChanged])
	fmt.Fprintf(e.Stdout, "  listed       %d resources in %d %s", r.ResourceCount, r.Pages, map[bool]string{true: "page", false: "pages"}[r.Pages == 1])
	if r.Truncated != "" {
		fmt.Fprintf(e.Stdout, " (stopped: %s)", r.Truncated)
	}
	fmt.Fprintln(e.Stdout)
	return nil
}

// check connects to src, negotiates and lists its resources.
func check(ctx context.Context, src ledger.Source) (checkReceipt, error) {
	r := checkReceipt{Transport: src.Transport, Target: target(src)}
	client := mcp.NewClient(&mcp.Implementation{Name: "mcpsync", Version: "0.1.0"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	mcphost.GuardClient(client, mcphost.Guard{})
	var buildErr error
	cs, tr, err := mcphost.Connect(ctx, client, src.Connection.Protocol, func() (mcp.Transport, error) {
		tr, err := mcphost.DefaultTransport(ctx, src)
		buildErr = err
		return tr, err
	})
	if buildErr != nil {
		return r, checkErr("", nil, buildErr)
	}
	if err != nil {
		return r, checkErr("connect to "+r.Target, tr, err)
	}
	defer cs.Close()
	if ir := cs.InitializeResult(); ir != nil {
		r.ProtocolVersion = ir.ProtocolVersion
		if ir.ServerInfo != nil {
			r.ServerName, r.ServerVersion = ir.ServerInfo.Name, ir.ServerInfo.Version
		}
		if c := ir.Capabilities; c != nil && c.Resources != nil {
			r.Resources, r.Subscribe, r.ListChanged = true, c.Resources.Subscribe, c.Resources.ListChanged
		}
	}
	if !r.Resources {
		return r, nil
	}
	seen := map[string]bool{}
	cursor := ""
	for {
		res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
		if err != nil {
			return r, checkErr(fmt.Sprintf("resources/list (page %d)", r.Pages+1), tr, err)
		}
		r.Pages++
		r.ResourceCount += len(res.Resources)
		switch cursor = res.NextCursor; {
		case cursor == "":
			return r, nil
		case seen[cursor]:
			r.Truncated = "the server repeated a cursor"
			return r, nil
		case r.ResourceCount >= checkMaxResources:
			r.Truncated = fmt.Sprintf("more than %d resources", checkMaxResources)
			return r, nil
		case r.Pages >= checkMaxPages:
			r.Truncated = fmt.Sprintf("more than %d pages", checkMaxPages)
			return r, nil
		}
		seen[cursor] = true
	}
}

// checkErr is the one line of a failed check: an authentication failure as the AuthError says
// it, anything else after what was being done; URLs in it have their secrets masked.
func checkErr(doing string, tr mcp.Transport, err error) error {
	if ae := mcphost.AuthFailure(tr, err); ae != nil {
		return errors.New(redact.Text(ae.Error()))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no answer within --timeout (%w)", err)
	}
	if doing != "" {
		err = fmt.Errorf("%s: %w", doing, err)
	}
	return errors.New(redact.Text(err.Error()))
}
