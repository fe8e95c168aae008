package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"strings"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	register(command{"get", "SOURCE URI [--principal P] [--json]: the accepted body's exact bytes on stdout", get})
}

// getJSON is what get --json prints.
type getJSON struct {
	statusJSON
	Body     string `json:"body,omitempty"`
	Encoding string `json:"encoding,omitempty"`
}

func get(ctx context.Context, e *runEnv, args []string) error {
	const usage = "mcpsync get SOURCE URI [--principal P] [--json]"
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	principal := fs.String("principal", "default", "principal reading")
	asJSON := fs.Bool("json", false, "print JSON (metadata and body)")
	pos, err := parse(fs, args, 2, 2, usage)
	if err != nil {
		return err
	}
	st, err := e.store(ctx)
	if err != nil {
		return err
	}
	src, norm, err := resolve(ctx, st, pos[0], pos[1])
	if err != nil {
		return err
	}
	sub, err := st.SubscriptionByKey(ctx, *principal, src.Name, norm)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundErr("no subscription of %s to %s on %s", *principal, norm, src.Name)
	}
	if err != nil {
		return err
	}
	v, err := st.LatestVersion(ctx, sub.ID)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundErr("no accepted version of %s yet (state %s)", norm, sub.State)
	}
	if err != nil {
		return err
	}
	if v.Kind == "tombstone" {
		return notFoundErr("%s was deleted (tombstone at ordinal %d)", norm, v.ReadOrdinal)
	}
	body, err := st.Blob(ctx, v.Digest)
	if err != nil {
		return err
	}
	if *asJSON {
		j := getJSON{statusJSON: statusOf(ctx, st, sub)}
		j.Digest, j.MIMEType, j.Size = v.Digest, v.MIMEType, v.Size
		if isText(body) {
			j.Body, j.Encoding = string(body), "text"
		} else {
			j.Body, j.Encoding = encodeBase64(body), "base64"
		}
		return writeJSON(e.Stdout, j)
	}
	_, err = e.Stdout.Write(body)
	return err
}

func isText(b []byte) bool {
	s := string(b)
	return strings.ToValidUTF8(s, "\uFFFD") == s && !strings.ContainsRune(s, 0)
}

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
