package contract

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// What the Temporal UI shows of a subscription workflow without decoding payloads (issue 17
// part 7): a static summary and static details set when the workflow is started
// (client.StartWorkflowOptions.StaticSummary/StaticDetails), and current details the
// workflow keeps up to date (workflow.SetCurrentDetails). Everything here is a pure function
// of its arguments, so the workflow may call it; no resource body ever goes into it.

// UIFieldMax bounds, in bytes, each identity field (source, URI, principal, reason) shown in
// the UI metadata; a longer one ends in "…".
const UIFieldMax = 200

// uiDigestLen is how much of a digest the UI metadata shows ("sha256:" and 12 hex digits).
const uiDigestLen = len("sha256:") + 12

// SubscriptionSummary is the one-line static summary of the workflow of in: its source, URI
// and principal, each redacted (a URI with credentials never shows them) and bounded by
// UIFieldMax, with no line breaks.
func SubscriptionSummary(in SubscriptionInput) string {
	return fmt.Sprintf("%s %s for %s", uiField(in.Source), uiField(redact.URL(in.URI)), uiField(in.Principal))
}

// SubscriptionStaticDetails is the static details (Markdown) of the workflow of in: the
// identity of the subscription and how it is refreshed, each field redacted and bounded.
func SubscriptionStaticDetails(in SubscriptionInput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "**Source** %s (id %d)  \n", uiCode(in.Source), in.SourceID)
	fmt.Fprintf(&b, "**URI** %s  \n", uiCode(redact.URL(in.URI)))
	if in.ServerURI != "" && in.ServerURI != in.URI {
		fmt.Fprintf(&b, "**Server URI** %s  \n", uiCode(redact.URL(in.ServerURI)))
	}
	fmt.Fprintf(&b, "**Principal** %s  \n", uiCode(in.Principal))
	fmt.Fprintf(&b, "**Refresh** backstop %s, poll %s", uiSeconds(in.BackstopSeconds), uiSeconds(in.PollSeconds))
	return b.String()
}

// SubscriptionProgress is what the current details of a subscription workflow show.
type SubscriptionProgress struct {
	State               mcpsync.State // the state as the ledger names it
	Reason              string        // why it is not ACTIVE, if it is not
	LastAcceptedOrdinal int64
	LastAcceptedDigest  string
	// LastReadSentAt is when the host sent the last read that answered: the accepted version
	// was the server's current one then (freshness). Zero before the first answer.
	LastReadSentAt    time.Time
	SessionGeneration int64
	ContinuedAsNew    int
}

// SubscriptionDetails is the current details (Markdown) of the workflow of in at p: state,
// last accepted ordinal and (short) digest, freshness, the reason when not ACTIVE, and the
// identity again, because a run that continued as new has no static summary of its own.
func SubscriptionDetails(in SubscriptionInput, p SubscriptionProgress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s**", p.State)
	if p.LastAcceptedOrdinal > 0 || p.LastAcceptedDigest != "" {
		fmt.Fprintf(&b, " · version #%d %s", p.LastAcceptedOrdinal, uiCode(uiDigest(p.LastAcceptedDigest)))
	} else {
		b.WriteString(" · no version accepted yet")
	}
	if !p.LastReadSentAt.IsZero() {
		fmt.Fprintf(&b, " · current as of %s", p.LastReadSentAt.UTC().Format(time.RFC3339))
	}
	b.WriteString("  \n")
	if p.State != mcpsync.StateActive && p.Reason != "" {
		fmt.Fprintf(&b, "**Reason** %s  \n", uiField(redact.Text(p.Reason)))
	}
	fmt.Fprintf(&b, "%s · session generation %d · continued as new %d times",
		SubscriptionSummary(in), p.SessionGeneration, p.ContinuedAsNew)
	return b.String()
}

// uiField makes s one bounded line: control characters (line breaks included) become
// blanks, and more than UIFieldMax bytes are cut at a rune boundary and end in "…".
func uiField(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) <= UIFieldMax {
		return s
	}
	return mcpsync.CutAtRune(s, UIFieldMax) + "…"
}

// uiCode is uiField as a Markdown code span (backquotes inside become %60, as in a URI).
func uiCode(s string) string {
	return "`" + strings.ReplaceAll(uiField(s), "`", "%60") + "`"
}

func uiDigest(d string) string {
	if len(d) > uiDigestLen {
		return d[:uiDigestLen] + "…"
	}
	return d
}

func uiSeconds(s int) string {
	if s <= 0 {
		return "default"
	}
	return (time.Duration(s) * time.Second).String()
}
