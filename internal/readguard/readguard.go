// Package readguard joins the output guard (internal/guard) to the ledger's consumer reads, so
// that every read that leaves mcpsync — `mcpsync get` and the gateway's resources/read — passes
// the same policy and stores the same verdicts (R22).
package readguard

import (
	"context"
	"strings"

	"github.com/mcpsync/mcpsync/internal/guard"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Policy is the output guard every consumer read passes.
func Policy() guard.Policy { return guard.Default() }

// Evaluator runs pol for ledger.Store.Read: it returns the verdict on a version's accepted body
// and, for SANITIZED, the bytes that may be delivered.
func Evaluator(pol guard.Policy) ledger.Evaluator {
	return func(ctx context.Context, v ledger.Version, body []byte) (ledger.GuardVerdict, []byte, error) {
		vd, err := pol.Evaluate(ctx, guard.Content{URI: v.URI, MIMEType: v.MIMEType, Body: body})
		if err != nil {
			return ledger.GuardVerdict{}, nil, err
		}
		return ledger.GuardVerdict{Policy: pol.String(), Outcome: string(vd.Outcome), Reasons: vd.Reasons,
			Stripped: vd.Stripped}, vd.Body, nil
	}
}

// IsText reports whether b can be shown as text without changing a byte: valid UTF-8 with no
// NUL. Anything else is delivered as base64 (a blob).
func IsText(b []byte) bool {
	s := string(b)
	return strings.ToValidUTF8(s, "\uFFFD") == s && !strings.ContainsRune(s, 0)
}
