package cli

import (
	"context"
	"flag"
	"fmt"
	neturl "net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"source add", `NAME --stdio "CMD ARGS" | --url URL [--subject S] [--backstop 30s] [--poll 30s]: register an MCP server`, sourceAdd})
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
}

func toSourceJSON(s ledger.Source) sourceJSON {
	return sourceJSON{
		Name: s.Name, Transport: s.Transport, Command: s.Command, URL: s.URL, Subject: s.Subject,
		BackstopSeconds: s.BackstopSeconds, PollSeconds: s.PollSeconds,
		CurrentGeneration: s.CurrentGeneration, HostQueue: s.HostQueue, LeaseUntil: s.LeaseUntil,
	}
}

func sourceAdd(ctx context.Context, e *runEnv, args []string) error {
	const usage = `mcpsync source add NAME --stdio "CMD ARGS" | --url URL [--subject S] [--backstop 30s] [--poll 30s] [--json]`
	fs := flag.NewFlagSet("source add", flag.ContinueOnError)
	stdio := fs.String("stdio", "", "command line of a stdio MCP server")
	url := fs.String("url", "", "streamable HTTP endpoint of an MCP server")
	subject := fs.String("subject", "default", "authorization subject the session connects as")
	backstop := fs.Duration("backstop", 30*time.Second, "backstop re-read period of subscribed resources")
	poll := fs.Duration("poll", 30*time.Second, "poll period when the server lacks resources.subscribe")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "NAME")
	if err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"backstop", *backstop}, {"poll", *poll}} {
		if d.v < time.Second || d.v%time.Second != 0 {
			return usageErr("--%s must be a whole number of seconds, at least 1s, got %s", d.name, d.v)
		}
	}
	spec := ledger.SourceSpec{Name: pos[0], Subject: *subject,
		BackstopSeconds: int(backstop.Seconds()), PollSeconds: int(poll.Seconds())}
	switch {
	case isSet(fs, "stdio") && *stdio == "":
		return usageErr("--stdio must not be empty")
	case isSet(fs, "url") && *url == "":
		return usageErr("--url must not be empty")
	case *stdio != "" && *url != "":
		return usageErr("give either --stdio or --url, not both")
	case *stdio != "":
		argv, err := SplitCommand(*stdio)
		if err != nil {
			return usageErr("--stdio: %v", err)
		}
		if len(argv) == 0 {
			return usageErr("--stdio: empty command")
		}
		spec.Transport, spec.Command = ledger.TransportStdio, argv
	case *url != "":
		if u, err := neturl.Parse(*url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageErr("--url %q is not an http:// or https:// URL with a host", *url)
		}
		spec.Transport, spec.URL = ledger.TransportHTTP, *url
	default:
		return usageErr("give --stdio \"CMD ARGS\" or --url URL (usage: %s)", usage)
	}
	if err := spec.Validate(); err != nil {
		return usageErr("%v", strings.TrimSuffix(err.Error(), ": "+ledger.ErrInvalid.Error()))
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	src, created, err := st.AddSource(ctx, spec)
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
		return s.URL
	}
	return JoinCommand(s.Command)
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
	if *asJSON {
		out := make([]sourceJSON, 0, len(srcs))
		for _, s := range srcs {
			out = append(out, toSourceJSON(s))
		}
		return writeJSON(e.Stdout, out)
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTRANSPORT\tTARGET\tSUBJECT\tGENERATION\tHOST")
	for _, s := range srcs {
		host := "-"
		if s.HostQueue != "" && s.LeaseUntil != nil && s.LeaseUntil.After(time.Now()) {
			host = s.HostQueue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", visible(s.Name), s.Transport, visible(target(s)), visible(s.Subject), s.CurrentGeneration, visible(host))
	}
	return tw.Flush()
}

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
