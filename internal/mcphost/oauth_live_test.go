package mcphost_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// An OAuth client-credentials source goes LIVE in a real session host (the token obtained
// from the authorization server, the session recorded with its receipt), and `source list`
// shows it LIVE with its OAuth reference only: no secret and no token anywhere in the output.
func TestOAuthSourceGoesLiveInHost(t *testing.T) {
	f := newFixture(t)
	as, rs := oauthStack(t, 0)
	const secret = "svc-secret"
	t.Setenv("MCPSYNC_TEST_LIVE_CC_SECRET", secret)
	src := f.addSource(ledger.SourceSpec{Name: "secured", Transport: ledger.TransportHTTP, URL: rs.URL,
		Connection: ledger.Connection{OAuth: &ledger.OAuthConfig{Flow: ledger.OAuthClientCredentials, ClientID: "svc",
			ClientSecretEnv: "MCPSYNC_TEST_LIVE_CC_SECRET"}}})
	h := f.startHost("host-oauth", mcphost.Options{}, newRecorder())
	c := f.waitSession(h, src.ID, 0)
	health := f.waitHealth(src.ID, "LIVE", func(h ledger.SourceHealth) bool { return h.State == ledger.HealthLive })
	if health.Generation != c.Generation() {
		t.Errorf("health generation %d, live session generation %d", health.Generation, c.Generation())
	}
	if n := as.Grants("client_credentials"); n < 1 {
		t.Errorf("client_credentials grants = %d, want at least 1", n)
	}
	tokens := rs.Tokens()
	for _, args := range [][]string{{"source", "list"}, {"source", "list", "--json"}, {"source", "show", "secured"}} {
		var out, errOut bytes.Buffer
		if code := cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errOut, Store: f.store}, args); code != cli.ExitOK {
			t.Fatalf("mcpsync %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
		}
		text := out.String()
		t.Logf("mcpsync %s:\n%s", strings.Join(args, " "), text)
		if !strings.Contains(text, "LIVE") {
			t.Errorf("mcpsync %s does not show the source LIVE:\n%s", strings.Join(args, " "), text)
		}
		for _, s := range append([]string{secret}, tokens...) {
			if s != "" && strings.Contains(text, s) {
				t.Errorf("mcpsync %s shows a secret or token", strings.Join(args, " "))
			}
		}
	}
}
