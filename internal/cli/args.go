package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"time"

	"go.temporal.io/sdk/converter"

	"github.com/mcpsync/mcpsync/internal/uri"
)

// parse parses flags that may appear before or after positional arguments. names are the
// positional arguments in order, optional ones in brackets ("[URI]"); a missing or an extra
// argument is a usage error naming it, as is an unknown flag or a malformed flag value.
// -h/--help gives a *helpRequest.
func parse(fs *flag.FlagSet, args []string, usage string, names ...string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				var b strings.Builder
				fs.SetOutput(&b)
				fs.PrintDefaults()
				return nil, &helpRequest{usage: usage, flags: b.String()}
			}
			return nil, usageErr("%v (usage: %s)", err, usage)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	required := 0
	for _, n := range names {
		if !strings.HasPrefix(n, "[") {
			required++
		}
	}
	switch {
	case len(pos) < required:
		return nil, usageErr("missing %s (usage: %s)", strings.Join(names[len(pos):required], " "), usage)
	case len(pos) > len(names):
		return nil, usageErr("unexpected argument %q (usage: %s)", pos[len(names)], usage)
	}
	return pos, nil
}

// isSet reports whether the flag called name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// nonNegative is a usage error unless the duration flag's value d is zero or more.
func nonNegative(name string, d time.Duration) error {
	if d < 0 {
		return usageErr("--%s must not be negative, got %s", name, d)
	}
	return nil
}

// positive is a usage error unless the duration flag's value d is above zero.
func positive(name string, d time.Duration) error {
	if d <= 0 {
		return usageErr("--%s must be positive, got %s", name, d)
	}
	return nil
}

// maxSearchAttributeBytes is Temporal's default limit on one search attribute value, as
// encoded in its payload (frontend.searchAttributesSizeOfValueLimit, 2 KiB).
const maxSearchAttributeBytes = 2048

// normalizeURI normalizes a URI argument; a malformed or empty one is a usage error, and so is
// one whose normalized form does not fit a search attribute value (McpsyncURI): a subscription
// to it could not be started, so it is refused before anything is written (issue 14, item 7).
func normalizeURI(raw string) (string, error) {
	if len(raw) > maxSearchAttributeBytes {
		return "", usageErr("uri %q... of %d bytes is too long: at most %d bytes (Temporal's search-attribute limit)", raw[:32], len(raw), maxSearchAttributeBytes)
	}
	norm, err := uri.Normalize(raw)
	if err != nil {
		return "", usageErr("%v", err)
	}
	// The SDK sends the value JSON-encoded: quotes, and escapes for '"', '\\', '<', '>' and '&'.
	p, err := converter.GetDefaultDataConverter().ToPayload(norm)
	if err != nil {
		return "", usageErr("uri %q: %v", raw, err)
	}
	if n := len(p.GetData()); n > maxSearchAttributeBytes {
		return "", usageErr("uri %q... is too long: %d bytes once encoded for Temporal's search attribute, at most %d", raw[:32], n, maxSearchAttributeBytes)
	}
	return norm, nil
}

// notEmpty is a usage error if the argument or flag value v, called what, is blank.
func notEmpty(what, v string) error {
	if strings.TrimSpace(v) == "" {
		return usageErr("%s must not be empty", what)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// subTarget is the source and URI a per-subscription command names (its principal validated),
// checked before anything is contacted.
type subTarget struct {
	source string
	uri    string // normalized
	raw    string // as typed: what the server is asked for
}

// parseTarget parses fs's flags and the positional SOURCE URI, and checks that the principal is
// not empty and the URI normalizes (exit 2 otherwise).
func parseTarget(fs *flag.FlagSet, args []string, usage string, principal *string) (subTarget, error) {
	pos, err := parse(fs, args, usage, "SOURCE", "URI")
	if err != nil {
		return subTarget{}, err
	}
	if err := notEmpty("--principal", *principal); err != nil {
		return subTarget{}, err
	}
	norm, err := normalizeURI(pos[1])
	if err != nil {
		return subTarget{}, err
	}
	return subTarget{source: pos[0], uri: norm, raw: pos[1]}, nil
}
