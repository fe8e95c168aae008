package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/guard"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/readguard"
)

func init() {
	register(command{"get", "SOURCE URI [--principal P] [--for-index NAME] [--json]: the newest accepted version through the grant " +
		"and the output guard (exit 5: no standing grant, 6: guard rejected)", get})
}

// guardJSON is the output guard's verdict as get --json prints it.
type guardJSON struct {
	Policy          string   `json:"policy"`
	Description     string   `json:"description"`
	Outcome         string   `json:"outcome"`
	Reasons         []string `json:"reasons,omitempty"`
	Stripped        int      `json:"stripped,omitempty"`
	DeliveredDigest string   `json:"deliveredDigest,omitempty"`
}

// getJSON is what get --json prints.
type getJSON struct {
	Source                string        `json:"source"`
	URI                   string        `json:"uri"`
	Principal             string        `json:"principal"`
	State                 mcpsync.State `json:"state"`
	Reason                string        `json:"reason,omitempty"`
	AcceptedAt            time.Time     `json:"acceptedAt"`
	VerifiedAt            *time.Time    `json:"verifiedAt,omitempty"`
	Refresh               string        `json:"refresh,omitempty"`
	StalenessBoundSeconds int           `json:"stalenessBoundSeconds"` // 0: unbounded (not live)
	VersionID             int64         `json:"versionId"`
	ReadOrdinal           int64         `json:"readOrdinal"`
	Generation            int64         `json:"generation"`
	SessionGeneration     int64         `json:"sessionGeneration"`
	Digest                string        `json:"digest"`
	MIMEType              string        `json:"mimeType"`
	Size                  int64         `json:"size"`
	AuthSubject           string        `json:"authSubject"`
	ServerName            string        `json:"serverName,omitempty"`
	ServerVersion         string        `json:"serverVersion,omitempty"`
	GrantEpoch            int64         `json:"grantEpoch"`
	Guard                 guardJSON     `json:"guard"`
	Index                 string        `json:"index,omitempty"`
	LineageID             int64         `json:"lineageId,omitempty"`
	Body                  string        `json:"body,omitempty"`
	Encoding              string        `json:"encoding,omitempty"`
}

// guardPolicy is the output guard every consumer read passes (shared with the gateway).
func guardPolicy() guard.Policy { return readguard.Policy() }

func get(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync get SOURCE URI [--principal P] [--for-index NAME] [--json]"
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	principal := fs.String("principal", "default", "principal reading")
	forIndex := fs.String("for-index", "", "name of the derived index taking the content (records lineage)")
	asJSON := fs.Bool("json", false, "print JSON (metadata, guard verdict and body)")
	t, err := parseTarget(fs, args, usage, principal)
	if err != nil {
		return err
	}
	norm := t.uri
	st, src, err := e.storeSource(ctx, t.source)
	if err != nil {
		return err
	}
	pol := guardPolicy()
	res, err := st.Read(ctx, ledger.ReadRequest{Principal: *principal, SourceID: src.ID, URI: norm,
		PolicyID: pol.ID(), ForIndex: *forIndex}, readguard.Evaluator(pol))
	var refusal *ledger.GuardRefusal
	switch {
	case errors.Is(err, ledger.ErrNoGrant):
		return deniedErr(err, src.Name)
	case errors.Is(err, ledger.ErrNotPublished):
		return &exitError{ExitDenied, fmt.Errorf("%s is not published under the current roll-out (shadow mode or outside the refresh percentage; see mcpsync rollout status)", norm)}
	case errors.As(err, &refusal):
		if *asJSON {
			if err := writeJSON(e.Stdout, toGetJSON(res, *principal, norm, pol, *forIndex)); err != nil {
				return err
			}
		}
		return &exitError{ExitGuardRejected, refusal}
	case errors.Is(err, ledger.ErrNotFound) && res.SourceName != "":
		switch {
		case res.SubscriptionID == 0:
			return notFoundErr("no subscription of %s to %s on %s", *principal, norm, src.Name)
		case res.Version.ID == 0:
			return notFoundErr("no accepted version of %s yet (state %s)", norm, res.State)
		default:
			return notFoundErr("%s was deleted (tombstone at ordinal %d)", norm, res.Version.ReadOrdinal)
		}
	case err != nil:
		return err
	}
	if *asJSON {
		return writeJSON(e.Stdout, toGetJSON(res, *principal, norm, pol, *forIndex))
	}
	_, err = e.Stdout.Write(res.Body)
	return err
}

func toGetJSON(res ledger.ReadResult, principal, norm string, pol guard.Policy, index string) getJSON {
	v := res.Version
	j := getJSON{
		Source: res.SourceName, URI: norm, Principal: principal, State: res.State, Reason: res.StateReason,
		AcceptedAt: v.AcceptedAt.UTC(), VerifiedAt: res.LastVerifiedAt, Refresh: res.Refresh,
		StalenessBoundSeconds: res.StalenessBoundSeconds, VersionID: v.ID, ReadOrdinal: v.ReadOrdinal,
		Generation: v.Generation, SessionGeneration: v.SessionGeneration, Digest: v.Digest, MIMEType: v.MIMEType,
		Size: v.Size, AuthSubject: v.AuthSubject, ServerName: v.ServerName, ServerVersion: v.ServerVersion,
		GrantEpoch: res.GrantEpoch, Guard: guardJSON{Policy: pol.ID(), Description: pol.String()},
	}
	if res.Verdict != nil {
		j.Guard.Outcome, j.Guard.Reasons, j.Guard.Stripped = res.Verdict.Outcome, res.Verdict.Reasons, res.Verdict.Stripped
		j.Guard.DeliveredDigest = res.Verdict.DeliveredDigest
	}
	if res.LineageID != 0 {
		j.Index, j.LineageID = index, res.LineageID
	}
	if res.Body != nil {
		if isText(res.Body) {
			j.Body, j.Encoding = string(res.Body), "text"
		} else {
			j.Body, j.Encoding = encodeBase64(res.Body), "base64"
		}
	}
	return j
}

func isText(b []byte) bool { return readguard.IsText(b) }

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
