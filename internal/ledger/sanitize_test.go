package ledger_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func TestSafeText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain name", "plain name"},
		{"ünïcode ✓", "ünïcode ✓"},
		{"\x1b]0;pwned\x07", "\x1b]0;pwned\x07"}, // storable; the CLI escapes it on output
		{"a\x00b", `a\u0000b`},
		{"\x00\x00", `\u0000\u0000`},
		{"bad\xff\xfeutf8", `bad\xFF\xFEutf8`},
		{"cut \xe2\x9c", `cut \xE2\x9C`},
		{`already \u0000 literal`, `already \u0000 literal`},
	} {
		if got := ledger.SafeText(tc.in); got != tc.want {
			t.Errorf("SafeText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSafeJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want any // decoded form of the result
	}{
		{"clean stays", `{"resources":{"subscribe":true},"n":1.50}`, map[string]any{"resources": map[string]any{"subscribe": true}, "n": json.Number("1.50")}},
		{"escaped NUL", `{"x":"a\u0000b","k\u0000":[1,"\u0000"]}`, map[string]any{"x": `a\u0000b`, `k\u0000`: []any{json.Number("1"), `\u0000`}}},
		{"raw invalid UTF-8 in a string", "{\"x\":\"a\xffb\"}", map[string]any{"x": `a\xFFb`}},
		{"raw NUL in a string", "{\"x\":\"a\x00b\"}", map[string]any{"x": `a\u0000b`}},
		{"not JSON", "not json\x00", `not json\u0000`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := ledger.SafeJSON(json.RawMessage(tc.in))
			if !json.Valid(out) {
				t.Fatalf("SafeJSON(%q) = %q: not valid JSON", tc.in, out)
			}
			var got any
			dec := json.NewDecoder(bytes.NewReader(out))
			dec.UseNumber()
			if err := dec.Decode(&got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SafeJSON(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
	if got := ledger.SafeJSON(nil); got != nil {
		t.Errorf("SafeJSON(nil) = %q, want nil", got)
	}
}

// hostile is what a hostile server puts into every string it controls: a NUL, invalid UTF-8
// and terminal escape sequences.
const hostile = "evil\x00name\xff\xfe\x1b]0;pwned\x07\x1b[2J\r\u009b"

// hostileStored is hostile as the ledger stores it: NUL and invalid UTF-8 escaped, the rest
// (valid, storable text) kept for the CLI to escape on output.
const hostileStored = `evil\u0000name\xFF\xFE` + "\x1b]0;pwned\x07\x1b[2J\r\u009b"

// Hostile server strings are stored, escaped, wherever the ledger keeps what a server said:
// the session's capability receipt, a catalog's entries and a failed round's failure text, and
// a blob's MIME type. None of them may make the statement fail (it would fail on every retry).
func TestHostileServerStrings(t *testing.T) {
	f := newCatFixture(t, false)
	caps := ledger.CapabilityReceipt{
		ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true,
		ServerName: hostile, ServerVersion: hostile,
		Raw: json.RawMessage(`{"experimental":{"x\u0000":"v\u0000"},"raw":"` + "\xff" + `"}`),
	}
	sess, _, err := f.st.OpenSession(f.ctx, f.src.ID, "cat-host", caps)
	if err != nil {
		t.Fatalf("open session with hostile serverInfo: %v", err)
	}
	f.gen = sess.Generation
	cur, err := f.st.CurrentSession(f.ctx, f.src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Caps.ServerName != hostileStored || cur.Caps.ServerVersion != hostileStored {
		t.Errorf("server name/version read back as %q / %q, want %q", cur.Caps.ServerName, cur.Caps.ServerVersion, hostileStored)
	}
	var rawBack any
	if err := json.Unmarshal(cur.Caps.Raw, &rawBack); err != nil {
		t.Fatal(err)
	}
	wantRaw := map[string]any{"experimental": map[string]any{`x\u0000`: `v\u0000`}, "raw": `\xFF`}
	if diff := cmp.Diff(wantRaw, rawBack); diff != "" {
		t.Errorf("capabilities read back (-want +got):\n%s", diff)
	}

	// A complete round whose entries carry hostile names and MIME types, and a failed round
	// whose failure text is hostile.
	entries := []ledger.ScanEntry{
		{Kind: ledger.EntryResource, URI: "demo://h/1", ServerURI: "demo://h/1", Name: hostile, MIMEType: hostile},
		{Kind: ledger.EntryTemplate, URI: "demo://h/{x}\x00", ServerURI: "demo://h/{x}\x00", Name: hostile, MIMEType: "text/\xff"},
	}
	_, got := f.publishSet(entries, "sha256:hostile")
	want := []ledger.ScanEntry{
		{Kind: ledger.EntryResource, URI: "demo://h/1", ServerURI: "demo://h/1", Name: hostileStored, MIMEType: hostileStored},
		{Kind: ledger.EntryTemplate, URI: `demo://h/{x}\u0000`, ServerURI: `demo://h/{x}\u0000`, Name: hostileStored, MIMEType: `text/\xFF`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("catalog entries (-want +got):\n%s", diff)
	}

	failedRun := f.newRun()
	id, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: failedRun + "/1", Run: failedRun, ScanWorkflowID: failedRun, Round: 1, SourceID: f.src.ID, SessionGeneration: f.gen})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.EndScan(f.ctx, ledger.ScanEnd{ScanID: id, FailureKind: "CURSOR_ERROR", Failure: hostile, SnapshotIDs: []string{hostile}, SnapshotID: hostile}, nil); err != nil {
		t.Fatalf("end failed scan with hostile failure text: %v", err)
	}
	sc, err := f.st.ScanByID(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Failure != hostileStored || sc.SnapshotID != hostileStored || !cmp.Equal(sc.SnapshotIDs, []string{hostileStored}) {
		t.Errorf("failed round read back failure %q, snapshot %q %q; want %q", sc.Failure, sc.SnapshotID, sc.SnapshotIDs, hostileStored)
	}
	abandonRun := f.newRun()
	if _, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: abandonRun + "/1", Run: abandonRun, ScanWorkflowID: abandonRun, Round: 1, SourceID: f.src.ID, SessionGeneration: f.gen}); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.st.AbandonScan(f.ctx, abandonRun+"/1", hostile); err != nil || !ok {
		t.Fatalf("abandon scan with hostile reason: %v %v", ok, err)
	}

	// A blob whose MIME type is hostile.
	digest, err := f.st.PutBlob(f.ctx, []byte("body"), hostile)
	if err != nil {
		t.Fatalf("put blob with hostile MIME type: %v", err)
	}
	var mime string
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT mime_type FROM content_blobs WHERE digest = $1`, digest).Scan(&mime); err != nil {
		t.Fatal(err)
	}
	if mime != hostileStored {
		t.Errorf("blob MIME type read back as %q, want %q", mime, hostileStored)
	}

	// Ending the session with a hostile reason (a server's error text) is stored too.
	if out, err := f.st.CloseSession(f.ctx, f.src.ID, f.gen, hostile); err != nil || out != mcpsync.OutcomeTransitioned {
		t.Fatalf("close session with hostile reason: %v %v", out, err)
	}
}

// Reasons and audit texts can carry a server's words (an error message, a URI it sent): a NUL
// or invalid UTF-8 in them must not make the transition fail on every retry.
func TestHostileReasonsAndAudits(t *testing.T) {
	const hostile = "server said \x00 and \xff\xfe"
	want := "server said \\u0000 and \\xFF\\xFE"
	t.Run("malformed notification audit", func(t *testing.T) {
		f := newFixture(t)
		kind, err := f.st.AuditMalformedNotification(f.ctx, f.src.ID, f.sess.Generation, 1, "demo://\x00bad", hostile)
		if err != nil || kind != mcpsync.ReceiptNotificationMalformedURI {
			t.Fatalf("AuditMalformedNotification = %q, %v", kind, err)
		}
	})
	t.Run("reconciliation required", func(t *testing.T) {
		f := newFixture(t)
		r, err := f.st.MarkReconciliationRequired(f.ctx, f.sub.ID, f.sub.Generation, hostile)
		if err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("MarkReconciliationRequired = %+v, %v", r, err)
		}
		if got := f.refresh().StateReason; got != want {
			t.Errorf("stored reason %q, want %q", got, want)
		}
	})
	t.Run("unsubscribe", func(t *testing.T) {
		f := newFixture(t)
		c, err := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, hostile)
		if err != nil || !c.Outcome.OK() {
			t.Fatalf("BeginUnsubscribe = %+v, %v", c, err)
		}
		r, err := f.st.MarkUnsubscribeUnknown(f.ctx, f.sub.ID, f.sub.Generation, c.CloseEpoch, hostile)
		if err != nil || !r.Outcome.OK() {
			t.Fatalf("MarkUnsubscribeUnknown = %+v, %v", r, err)
		}
		if got := f.refresh().StateReason; got != want {
			t.Errorf("stored reason %q, want %q", got, want)
		}
	})
}
