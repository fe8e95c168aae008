package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/redact"
)

func init() {
	register(command{"source show", "NAME [--json]: a source's definition (secrets only as references), health, session capabilities and lease holder", sourceShow})
}

// healthJSON is a source's health as source list, source show and status report it (issue 14,
// item 2). State is empty when no host has reported on the source; Current says whether the
// host that reported still holds the source's lease (if not, the state is the last thing that
// host saw, not the present).
type healthJSON struct {
	State         string     `json:"state,omitempty"`
	Current       bool       `json:"current"`
	StateSince    *time.Time `json:"stateSince,omitempty"`
	ReportedBy    string     `json:"reportedBy,omitempty"`
	Generation    int64      `json:"generation"`
	Era           string     `json:"era,omitempty"`
	Reconnects    int64      `json:"reconnects"`
	LastError     string     `json:"lastError,omitempty"`
	LastErrorAt   *time.Time `json:"lastErrorAt,omitempty"`
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
}

func toHealthJSON(h ledger.SourceHealth) *healthJSON {
	j := &healthJSON{Generation: h.Generation, Reconnects: h.Reconnects, LastErrorAt: h.LastErrorAt,
		NextAttemptAt: h.NextAttemptAt, LastError: h.LastError}
	if h.Reported {
		since := h.StateSince
		j.State, j.Current, j.StateSince, j.ReportedBy = string(h.State), h.Held, &since, h.HostQueue
	}
	if h.Session != nil {
		j.Era = h.Session.Caps.ProtocolVersion
	}
	return j
}

// stateText is a health state for a table: "-" before any report, "(stale)" appended when
// the reporting host no longer holds the lease.
func (j *healthJSON) stateText() string {
	switch {
	case j == nil || j.State == "":
		return "-"
	case !j.Current:
		return j.State + " (stale)"
	}
	return j.State
}

// errorText is the last error with its age, the error cut to at most width characters
// (0: whole), escaped for the terminal.
func (j *healthJSON) errorText(now time.Time, width int) string {
	if j == nil || j.LastError == "" {
		return "-"
	}
	msg := j.LastError
	if width > 0 && utf8.RuneCountInString(msg) > width {
		msg = string([]rune(msg)[:width-1]) + "…"
	}
	if j.LastErrorAt != nil {
		msg = ago(now, *j.LastErrorAt) + ": " + msg
	}
	return visible(msg)
}

// line is the one-line health summary of status.
func (j *healthJSON) line(now time.Time) string {
	if j.State == "" {
		return fmt.Sprintf("no host has reported on it, generation %d", j.Generation)
	}
	var b strings.Builder
	b.WriteString(j.stateText())
	if j.StateSince != nil {
		fmt.Fprintf(&b, " for %s", age(now, *j.StateSince))
	}
	if j.ReportedBy != "" {
		fmt.Fprintf(&b, " on %s", visible(j.ReportedBy))
	}
	fmt.Fprintf(&b, ", generation %d, era %s, %d reconnects", j.Generation, orDash(j.Era), j.Reconnects)
	if j.NextAttemptAt != nil && j.State != string(ledger.HealthLive) && j.State != string(ledger.HealthConnecting) {
		fmt.Fprintf(&b, ", next attempt %s", until(now, *j.NextAttemptAt))
	}
	if j.LastError != "" {
		fmt.Fprintf(&b, ", last error %s", j.errorText(now, 0))
	}
	return b.String()
}

// age is how long ago t was, rounded for reading ("12s", "5m", "3h", "2d").
func age(now, t time.Time) string { return roughly(now.Sub(t)) }

func ago(now, t time.Time) string { return age(now, t) + " ago" }

// until is when t is, relative to now ("in 25s", or "due" once it has passed).
func until(now, t time.Time) string {
	if !t.After(now) {
		return "due"
	}
	return "in " + roughly(t.Sub(now))
}

// roughly is d rounded down to its largest unit ("12s", "5m", "3h", "2d").
func roughly(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// sourceShowJSON is `source show --json`: the source's definition as source list gives it,
// its connection with secrets only as references, its health, the current (or last) session
// with its capabilities, and the lease.
type sourceShowJSON struct {
	sourceJSON
	DefinitionVersion int64          `json:"definitionVersion"`
	RemovedAt         *time.Time     `json:"removedAt,omitempty"`
	Connection        connectionJSON `json:"connection"`
	Session           *sessionJSON   `json:"session,omitempty"`
	Lease             leaseJSON      `json:"lease"`
}

// connectionJSON is a source's connection definition as it may be shown: the names of the
// environment variables and the paths of the files that hold secrets, never a secret; the
// values of literal headers and environment variables only where their names do not look
// secret (redact.IsSecretName; otherwise redact.Mask).
type connectionJSON struct {
	Headers    []ledger.Header     `json:"headers,omitempty"`
	HeaderEnv  []ledger.HeaderRef  `json:"headerEnv,omitempty"`
	BearerEnv  string              `json:"bearerEnv,omitempty"`
	BearerFile string              `json:"bearerFile,omitempty"`
	OAuth      *ledger.OAuthConfig `json:"oauth,omitempty"`
	CAFile     string              `json:"caFile,omitempty"`
	CertFile   string              `json:"certFile,omitempty"`
	KeyFile    string              `json:"keyFile,omitempty"`
	Env        []ledger.EnvVar     `json:"env,omitempty"`
	Cwd        string              `json:"cwd,omitempty"`
	MaxBytes   int64               `json:"maxBytes"`
	// Protocol is the source's --protocol choice (auto, 2025-11-25, 2026-07-28); the era
	// the session negotiated is in the health and the session.
	Protocol string `json:"protocol"`
}

func toConnectionJSON(c ledger.Connection) connectionJSON {
	j := connectionJSON{HeaderEnv: c.HeaderEnv, BearerEnv: c.BearerEnv, BearerFile: c.BearerFile,
		OAuth: c.OAuth, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, Cwd: c.Cwd,
		MaxBytes: c.EffectiveMaxBytes(), Protocol: c.EffectiveProtocol()}
	for _, h := range c.Headers {
		j.Headers = append(j.Headers, ledger.Header{Name: h.Name, Value: shownValue(h.Name, h.Value)})
	}
	for _, v := range c.Env {
		j.Env = append(j.Env, ledger.EnvVar{Name: v.Name, Value: shownValue(v.Name, v.Value), FromEnv: v.FromEnv})
	}
	return j
}

// shownValue is a literal configured value as it may be shown: masked when its name looks
// secret.
func shownValue(name, value string) string {
	if value != "" && redact.IsSecretName(name) {
		return redact.Mask
	}
	return value
}

// sessionJSON is a source's newest session: its generation, era and capability receipt.
type sessionJSON struct {
	Generation    int64           `json:"generation"`
	HostQueue     string          `json:"hostQueue"`
	Era           string          `json:"era"`
	Live          bool            `json:"live"`
	StartedAt     time.Time       `json:"startedAt"`
	EndedAt       *time.Time      `json:"endedAt,omitempty"`
	EndReason     string          `json:"endReason,omitempty"`
	ServerName    string          `json:"serverName,omitempty"`
	ServerVersion string          `json:"serverVersion,omitempty"`
	Capabilities  capsJSON        `json:"capabilities"`
	Raw           json.RawMessage `json:"rawCapabilities,omitempty"`
}

type capsJSON struct {
	Resources   bool `json:"resources"`
	Subscribe   bool `json:"subscribe"`
	ListChanged bool `json:"listChanged"`
	SnapshotIDs bool `json:"snapshotIds"`
}

func (c capsJSON) String() string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{{c.Resources, "resources"}, {c.Subscribe, "subscribe"}, {c.ListChanged, "listChanged"}, {c.SnapshotIDs, "snapshotIds"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// leaseJSON is who holds a source's lease: Holder is empty when no host holds a live one.
type leaseJSON struct {
	Holder string     `json:"holder,omitempty"`
	Until  *time.Time `json:"until,omitempty"`
}

func sourceShow(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync source show NAME [--json]"
	fs := flag.NewFlagSet("source show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, usage, "NAME")
	if err != nil {
		return err
	}
	if pos[0] == "" {
		return usageErr("NAME must not be empty (usage: %s)", usage)
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	src, err := sourceNamed(ctx, st, pos[0])
	if err != nil {
		return err
	}
	h, err := st.SourceHealth(ctx, src.ID)
	if err != nil {
		return err
	}
	j := sourceShowJSON{sourceJSON: toSourceJSON(src), DefinitionVersion: src.DefinitionVersion,
		RemovedAt: src.RemovedAt, Connection: toConnectionJSON(src.Connection)}
	j.Health = toHealthJSON(h)
	if h.LeaseHolder != "" {
		j.Lease = leaseJSON{Holder: h.LeaseHolder, Until: h.LeaseUntil}
	}
	if s := h.Session; s != nil {
		j.Session = &sessionJSON{Generation: s.Generation, HostQueue: s.HostQueue, Era: s.Caps.ProtocolVersion,
			Live: s.EndedAt == nil, StartedAt: s.StartedAt, EndedAt: s.EndedAt, EndReason: s.EndReason,
			ServerName: s.Caps.ServerName, ServerVersion: s.Caps.ServerVersion, Raw: s.Caps.Raw,
			Capabilities: capsJSON{s.Caps.Resources, s.Caps.Subscribe, s.Caps.ListChanged, s.Caps.SnapshotIDs}}
	}
	if *asJSON {
		return writeJSON(e.Stdout, j)
	}
	return writeSourceShow(e.Stdout, j, time.Now())
}

// writeSourceShow prints source show's text form: one "key: value" line per item, every
// server-supplied or operator-typed string escaped (visible).
func writeSourceShow(w io.Writer, j sourceShowJSON, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(key, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{key}, args...)...)
	}
	row("name", "%s", visible(j.Name))
	row("transport", "%s", j.Transport)
	if j.URL != "" {
		row("url", "%s", visible(j.URL))
	} else {
		row("command", "%s", visible(JoinCommand(redact.Args(j.Command))))
	}
	row("subject", "%s", visible(j.Subject))
	row("backstop / poll", "%ds / %ds", j.BackstopSeconds, j.PollSeconds)
	row("definition version", "%d", j.DefinitionVersion)
	if j.RemovedAt != nil {
		row("removed", "%s", fmtTime(j.RemovedAt))
	}
	c := j.Connection
	row("protocol", "%s", visible(c.Protocol))
	for _, h := range c.Headers {
		row("header", "%s: %s", visible(h.Name), visible(h.Value))
	}
	for _, h := range c.HeaderEnv {
		row("header", "%s: from environment variable %s", visible(h.Name), visible(h.Env))
	}
	if c.BearerEnv != "" {
		row("bearer token", "from environment variable %s", visible(c.BearerEnv))
	}
	if c.BearerFile != "" {
		row("bearer token", "from file %s", visible(c.BearerFile))
	}
	if o := c.OAuth; o != nil {
		desc := o.Flow
		if o.ClientID != "" {
			desc += ", client " + o.ClientID
		}
		if o.ClientSecretEnv != "" {
			desc += ", secret from environment variable " + o.ClientSecretEnv
		}
		if o.ClientSecretFile != "" {
			desc += ", secret from file " + o.ClientSecretFile
		}
		if len(o.Scopes) > 0 {
			desc += ", scopes " + strings.Join(o.Scopes, " ")
		}
		if o.TokenFile != "" {
			desc += ", tokens in " + o.TokenFile
		}
		row("oauth", "%s", visible(desc))
	}
	if c.CAFile != "" {
		row("ca file", "%s", visible(c.CAFile))
	}
	if c.CertFile != "" {
		row("client certificate", "%s (key %s)", visible(c.CertFile), visible(c.KeyFile))
	}
	for _, v := range c.Env {
		if v.FromEnv != "" {
			row("env", "%s from environment variable %s", visible(v.Name), visible(v.FromEnv))
		} else {
			row("env", "%s=%s", visible(v.Name), visible(v.Value))
		}
	}
	if c.Cwd != "" {
		row("cwd", "%s", visible(c.Cwd))
	}
	row("max bytes", "%d", c.MaxBytes)

	h := j.Health
	switch {
	case h.State == "":
		row("state", "- (no host has reported on this source)")
	case h.StateSince != nil:
		row("state", "%s since %s (%s), reported by %s", h.stateText(), fmtTime(h.StateSince), ago(now, *h.StateSince), visible(h.ReportedBy))
	}
	if h.NextAttemptAt != nil {
		row("next attempt", "%s (%s)", fmtTime(h.NextAttemptAt), until(now, *h.NextAttemptAt))
	}
	row("reconnects", "%d", h.Reconnects)
	if h.LastError != "" && h.LastErrorAt != nil {
		row("last error", "%s (%s): %s", fmtTime(h.LastErrorAt), ago(now, *h.LastErrorAt), visible(h.LastError))
	} else {
		row("last error", "-")
	}
	row("generation", "%d", h.Generation)
	if s := j.Session; s != nil {
		row("era", "%s", visible(s.Era))
		if s.Live {
			row("session", "live since %s on %s", fmtTime(&s.StartedAt), visible(s.HostQueue))
		} else {
			row("session", "ended %s: %s", fmtTime(s.EndedAt), visible(s.EndReason))
		}
		row("server", "%s %s", visible(orDash(s.ServerName)), visible(s.ServerVersion))
		row("capabilities", "%s", s.Capabilities)
	} else {
		row("era", "-")
		row("session", "- (never connected)")
	}
	if j.Lease.Holder != "" {
		row("lease", "%s until %s", visible(j.Lease.Holder), fmtTime(j.Lease.Until))
	} else {
		row("lease", "- (no host holds this source)")
	}
	return tw.Flush()
}
