package activities

import (
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// maxErrorPart bounds each message of an error an activity returns: its own and its cause's.
const maxErrorPart = ledger.MaxPayloadString / 2

// boundedError carries the bounded message of an error whose full text was too long for a
// Temporal failure. It has no Unwrap on purpose: Temporal's failure converter turns every
// level of an error's Unwrap chain into a failure of its own, with that level's whole message.
type boundedError struct{ msg string }

func (e *boundedError) Error() string { return e.msg }

// boundError keeps a server's words from blowing up a Temporal payload (issue 14 item 6): an
// activity error whose text (its whole chain, as Temporal records it in history) is longer
// than ledger.MaxPayloadString is replaced by one whose messages are cut with a digest of the
// whole (ledger.Bounded). An application error keeps its type and retryability, so the
// workflow decides exactly as before; shorter errors are returned unchanged.
func boundError(err error) error {
	if err == nil || len(err.Error()) <= ledger.MaxPayloadString {
		return err
	}
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app != err {
		return &boundedError{msg: ledger.Bounded(err.Error(), ledger.MaxPayloadString)}
	}
	var cause error
	if c := app.Unwrap(); c != nil {
		cause = &boundedError{msg: ledger.Bounded(c.Error(), maxErrorPart)}
	}
	return temporal.NewApplicationErrorWithOptions(ledger.Bounded(app.Message(), maxErrorPart), app.Type(),
		temporal.ApplicationErrorOptions{NonRetryable: app.NonRetryable(), Cause: cause})
}
