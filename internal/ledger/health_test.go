package ledger_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Only the host holding a source's live lease writes its health (issue 14, item 2): another
// host, and the same host once its lease expired or passed to another host, is refused with
// ErrLeaseLost and changes nothing, so a host that lost its lease cannot overwrite what its
// successor reports. While the same host reports the same state, the state's since-time is
// kept; reconnects accumulate; a report without an error keeps the last error and its time.
func TestSourceHealthFence(t *testing.T) {
	ctx := t.Context()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "h", Transport: ledger.TransportHTTP, URL: "http://127.0.0.1:1/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	health := func() ledger.SourceHealth {
		t.Helper()
		h, err := st.SourceHealth(ctx, src.ID)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if h := health(); h.Reported || h.Session != nil || h.LeaseHolder != "" {
		t.Fatalf("health before any report: %+v", h)
	}
	// No host holds the lease yet: nobody may write.
	if err := st.SetSourceHealth(ctx, src.ID, "host-a", ledger.HealthReport{State: ledger.HealthConnecting}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("report without a lease: %v, want ErrLeaseLost", err)
	}
	if _, err := st.ClaimSources(ctx, "host-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)
	errAt := t1.Add(-500 * time.Millisecond)
	steps := []ledger.HealthReport{
		{State: ledger.HealthConnecting, At: t0},
		{State: ledger.HealthBackoff, At: t1, Err: "connect: connection refused", ErrAt: errAt, NextAttempt: t1.Add(time.Second)},
		{State: ledger.HealthConnecting, At: t2, Reconnects: 1},
		{State: ledger.HealthConnecting, At: t2.Add(time.Second), Reconnects: 2},
	}
	for _, r := range steps {
		if err := st.SetSourceHealth(ctx, src.ID, "host-a", r); err != nil {
			t.Fatalf("report %+v: %v", r, err)
		}
	}
	// Another host does not hold the lease.
	if err := st.SetSourceHealth(ctx, src.ID, "host-b", ledger.HealthReport{State: ledger.HealthLive}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("report of host-b while host-a holds the lease: %v, want ErrLeaseLost", err)
	}
	opts := cmpopts.IgnoreFields(ledger.SourceHealth{}, "UpdatedAt", "LeaseUntil")
	want := ledger.SourceHealth{
		SourceID: src.ID, Reported: true, State: ledger.HealthConnecting, StateSince: t2,
		HostQueue: "host-a", Held: true, LastError: "connect: connection refused", LastErrorAt: &errAt,
		Reconnects: 3, LeaseHolder: "host-a",
	}
	if diff := cmp.Diff(want, utcHealth(health()), opts); diff != "" {
		t.Errorf("health of host-a (-want +got):\n%s", diff)
	}

	// host-a's lease expires: its reports are refused even before another host claims.
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET lease_until = now() - interval '1 second' WHERE id = $1`, src.ID); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSourceHealth(ctx, src.ID, "host-a", ledger.HealthReport{State: ledger.HealthLive}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("report with an expired lease: %v, want ErrLeaseLost", err)
	}
	want.Held, want.LeaseHolder = false, ""
	if diff := cmp.Diff(want, utcHealth(health()), opts); diff != "" {
		t.Errorf("health after host-a's lease expired (-want +got):\n%s", diff)
	}

	// host-b takes the source over and reports; host-a cannot overwrite it.
	if _, err := st.ClaimSources(ctx, "host-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	sess, _, err := st.OpenSession(ctx, src.ID, "host-b", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true, ServerName: "srv"})
	if err != nil {
		t.Fatal(err)
	}
	t3 := t2.Add(time.Minute)
	if err := st.SetSourceHealth(ctx, src.ID, "host-b", ledger.HealthReport{State: ledger.HealthLive, At: t3}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []ledger.HealthReport{
		{State: ledger.HealthAuthFailed, Err: "stale host", Reconnects: 5},
		{State: ledger.HealthLive, Reconnects: 1},
	} {
		if err := st.SetSourceHealth(ctx, src.ID, "host-a", r); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Errorf("report %+v of host-a after host-b took over: %v, want ErrLeaseLost", r, err)
		}
	}
	got := utcHealth(health())
	want = ledger.SourceHealth{
		SourceID: src.ID, Reported: true, State: ledger.HealthLive, StateSince: t3,
		HostQueue: "host-b", Held: true, LastError: "connect: connection refused", LastErrorAt: &errAt,
		Reconnects: 3, LeaseHolder: "host-b", Generation: sess.Generation,
	}
	if diff := cmp.Diff(want, got, opts, cmpopts.IgnoreFields(ledger.SourceHealth{}, "Session")); diff != "" {
		t.Errorf("health of host-b (-want +got):\n%s", diff)
	}
	if got.Session == nil || got.Session.Caps.ProtocolVersion != mcpsync.ProtocolVersion20251125 ||
		!got.Session.Caps.Subscribe || got.Session.Caps.ServerName != "srv" || got.Session.HostQueue != "host-b" || got.Session.EndedAt != nil {
		t.Errorf("session of health: %+v", got.Session)
	}
	all, err := st.SourcesHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[int64]ledger.SourceHealth{src.ID: got}, utcHealthMap(all), cmpopts.IgnoreFields(ledger.SourceHealth{}, "LeaseUntil")); diff != "" {
		t.Errorf("SourcesHealth (-want +got):\n%s", diff)
	}

	if _, err := st.SourceHealth(ctx, src.ID+1000); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("health of an unknown source: %v, want ErrNotFound", err)
	}
	for _, r := range []ledger.HealthReport{{State: "SLEEPING"}, {State: ledger.HealthLive, Reconnects: -1}} {
		if err := st.SetSourceHealth(ctx, src.ID, "host-b", r); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("report %+v: %v, want ErrInvalid", r, err)
		}
	}
}

// A stored error is redacted, one line, storable and bounded, whatever the host passed.
func TestSourceHealthStoresSafeError(t *testing.T) {
	ctx := t.Context()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "h", Transport: ledger.TransportStdio, Command: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, "host-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	raw := "Post \"https://u:hunter2@example.com/mcp?api_key=sk-123\": Authorization: Bearer abc.def-SECRET\n\x00" + strings.Repeat("é", 400)
	if err := st.SetSourceHealth(ctx, src.ID, "host-a", ledger.HealthReport{State: ledger.HealthBackoff, Err: raw}); err != nil {
		t.Fatal(err)
	}
	h, err := st.SourceHealth(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"hunter2", "sk-123", "abc.def-SECRET"} {
		if strings.Contains(h.LastError, secret) {
			t.Errorf("stored error %q contains %q", h.LastError, secret)
		}
	}
	if len(h.LastError) > ledger.MaxHealthErrorBytes || !utf8.ValidString(h.LastError) || strings.ContainsAny(h.LastError, "\n\x00") || !strings.HasSuffix(h.LastError, "…") {
		t.Errorf("stored error is not one bounded, valid, cut line (%d bytes): %q", len(h.LastError), h.LastError)
	}
	if h.LastErrorAt == nil || time.Since(*h.LastErrorAt) > time.Minute {
		t.Errorf("last error time %v", h.LastErrorAt)
	}
}

func TestHealthErrorText(t *testing.T) {
	tests := []struct{ in, want string }{
		{`authentication failed: HTTP 401: Bearer error="invalid_token", error_description="The token expired"`,
			`authentication failed: HTTP 401: Bearer error="invalid_token", error_description="The token expired"`},
		{"Authorization: Bearer eyJhbGciOi.x-y_z", "Authorization: Bearer ***"},
		{"Basic dXNlcjpwYXNz, then", "Basic ***, then"},
		{`Post "https://u:pw@h/mcp?token=abc&x=1": EOF`, `Post "https://u:***@h/mcp?token=***&x=1": EOF`},
		{`token endpoint said {"access_token": "at-1", "error": "x"}`, `token endpoint said {"access_token":"***", "error": "x"}`},
		{"client_secret=s3 scope=read", "client_secret=*** scope=read"},
		{"dial postgres://mcpsync:pw@db/x failed", "dial postgres://mcpsync:***@db/x failed"},
		{"line one\n\tline two  ", "line one line two"},
		{"nul\x00byte \xff", `nul\u0000byte \xFF`},
	}
	for _, tt := range tests {
		if got := ledger.HealthErrorText(tt.in); got != tt.want {
			t.Errorf("HealthErrorText(%q)\n got %q\nwant %q", tt.in, got, tt.want)
		}
	}
	long := ledger.HealthErrorText(strings.Repeat("ab€", 300))
	if len(long) > ledger.MaxHealthErrorBytes || len(long) < ledger.MaxHealthErrorBytes-6 || !utf8.ValidString(long) || !strings.HasSuffix(long, "…") {
		t.Errorf("long text cut to %d bytes: %q", len(long), long)
	}
}

func utcHealth(h ledger.SourceHealth) ledger.SourceHealth {
	h.StateSince = h.StateSince.UTC()
	if h.LastErrorAt != nil {
		at := h.LastErrorAt.UTC()
		h.LastErrorAt = &at
	}
	if h.NextAttemptAt != nil {
		at := h.NextAttemptAt.UTC()
		h.NextAttemptAt = &at
	}
	return h
}

func utcHealthMap(m map[int64]ledger.SourceHealth) map[int64]ledger.SourceHealth {
	for k, h := range m {
		m[k] = utcHealth(h)
	}
	return m
}
