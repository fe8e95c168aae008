package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/redact"
)

func init() {
	register(command{"source add", `NAME --stdio "CMD ARGS" | --url URL [connection flags, see --help] [--subject S] [--backstop 30s] [--poll 30s]: register an MCP server`, sourceAdd})
	register(command{"source list", "[--json]: list sources with their session generation and host", sourceList})
}

type sourceJSON struct {
	Name              string     `json:"name"`
	Transport         string     `json:"transport"`
	Command           []string   `json:"command,omitempty"`
	URL               string     `json:"url,omitempty"`
	Subject           string     `json:"subject"`
	BackstopSeconds   int        `json:"backstopSeconds"`
	PollSeconds       int        `json:"pollSeconds"`
	CurrentGeneration int64      `json:"currentGeneration"`
	HostQueue         string     `json:"hostQueue,omitempty"`
	LeaseUntil        *time.Time `json:"leaseUntil,omitempty"`
	Created           bool       `json:"created,omitempty"`
	// Health is the source's session state, generation, era, reconnects and last error
	// (source list, source show; issue 14, item 2).
	Health *healthJSON `json:"health,omitempty"`
}

func toSourceJSON(s ledger.Source) sourceJSON {
	return sourceJSON{
		Name: s.Name, Transport: s.Transport, Command: redact.Args(s.Command), URL: redactURL(s.URL), Subject: s.Subject,
		BackstopSeconds: s.BackstopSeconds, PollSeconds: s.PollSeconds,
		CurrentGeneration: s.CurrentGeneration, HostQueue: s.HostQueue, LeaseUntil: s.LeaseUntil,
	}
}

func sourceAdd(ctx context.Context, e *runEnv, args []string) error {
	const usage = `mcpsync source add NAME ` + sourceFlagsUsage + ` [--json]`
	fs := flag.NewFlagSet("source add", flag.ContinueOnError)
	sf := newSourceFlags(fs, usage)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "NAME")
	if err != nil {
		return err
	}
	spec, err := sf.spec(pos[0])
	if err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	src, created, err := addSource(ctx, st, spec) // a removed source's name brings it back (source_lifecycle.go)
	if errors.Is(err, ledger.ErrSourceExists) {
		name := visible(spec.Name)
		return usageErr("source %s already exists with a different definition (mcpsync source show %s shows it; mcpsync source update %s changes it)", name, name, name)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		j := toSourceJSON(src)
		j.Created = created
		return writeJSON(e.Stdout, j)
	}
	verb := "added"
	if !created {
		verb = "already exists, unchanged"
	}
	fmt.Fprintf(e.Stdout, "source %s %s (%s %s)\n", visible(src.Name), verb, src.Transport, visible(target(src)))
	return nil
}

func target(s ledger.Source) string {
	if s.Transport == ledger.TransportHTTP {
		return redactURL(s.URL)
	}
	return JoinCommand(redact.Args(s.Command))
}

func sourceList(ctx context.Context, e *runEnv, args []string) error {
	fs := flag.NewFlagSet("source list", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, "mcpsync source list [--json]"); err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	srcs, err := st.ListSources(ctx)
	if err != nil {
		return err
	}
	health, err := st.SourcesHealth(ctx)
	if err != nil {
		return err
	}
	out := make([]sourceJSON, 0, len(srcs))
	for _, s := range srcs {
		j := toSourceJSON(s)
		if h, ok := health[s.ID]; ok {
			j.Health = toHealthJSON(h)
		} else { // added after the health query
			j.Health = &healthJSON{Generation: s.CurrentGeneration}
		}
		out = append(out, j)
	}
	if *asJSON {
		return writeJSON(e.Stdout, out)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTRANSPORT\tTARGET\tSUBJECT\tSTATE\tGEN\tERA\tRECONNECTS\tHOST\tLAST ERROR")
	for i, s := range srcs {
		host := "-"
		if s.HostQueue != "" && s.LeaseUntil != nil && s.LeaseUntil.After(now) {
			host = s.HostQueue
		}
		h := out[i].Health
		state := h.stateText()
		if s.RemovedAt != nil {
			state = "REMOVED" // what its last host saw is history
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", visible(s.Name), s.Transport, visible(target(s)),
			visible(s.Subject), state, h.Generation, visible(orDash(h.Era)), h.Reconnects, visible(host),
			h.errorText(now, listErrorWidth))
	}
	return tw.Flush()
}

// listErrorWidth is how many characters of a source's last error source list shows.
const listErrorWidth = 72

// SplitCommand splits a command line into argv like a POSIX shell would for words: blanks
// separate words, single quotes keep everything literally, double quotes keep blanks and allow
// \" and \\, a backslash outside quotes escapes the next character. No expansion is done.
func SplitCommand(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			inWord = true
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case c == '"':
			inWord = true
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated double quote in %q", s)
			}
		case c == '\\':
			if i+1 >= len(s) {
				return nil, fmt.Errorf("trailing backslash in %q", s)
			}
			inWord = true
			i++
			cur.WriteByte(s[i])
		default:
			inWord = true
			cur.WriteByte(c)
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// JoinCommand renders argv so that SplitCommand reads it back unchanged.
func JoinCommand(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"\\") {
			parts[i] = a
			continue
		}
		parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(parts, " ")
}

// redactURL masks the credentials a URL may carry (userinfo, secret-looking query parameters);
// sources stored before such URLs were refused may still hold them.
func redactURL(u string) string { return redact.URL(u) }
