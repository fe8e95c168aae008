package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// authServer is an httptest server with the gateway's bearer check in front of a handler
// that reports the principal it sees, at gateway.Path, and the protected-resource metadata.
func authServer(t *testing.T) (*ledger.Store, *httptest.Server) {
	t.Helper()
	st := ledger.New(pgtest.NewPool(t))
	// protect uses no Temporal; a lazy client never dials.
	tc, err := client.NewLazyClient(client.Options{HostPort: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Options{Store: st, Temporal: tc, Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(gateway.Path, gateway.Protect(g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, id, ok := gateway.PrincipalFrom(r.Context())
		if !ok {
			http.Error(w, "no principal", http.StatusTeapot)
			return
		}
		io.WriteString(w, p+" "+id)
	})))
	gateway.MountMetadata(g, mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return st, srv
}

func get(t *testing.T, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// Every request needs a valid bearer token: a missing header, another scheme, a malformed,
// unknown, expired or revoked token get 401 with WWW-Authenticate: Bearer naming the
// protected-resource metadata; a valid one reaches the handler with its principal and token ID
// (issue 15 item 2).
func TestProtect(t *testing.T) {
	ctx := context.Background()
	st, srv := authServer(t)
	alice, aliceTok, err := st.CreateToken(ctx, "alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bob, bobTok, err := st.CreateToken(ctx, "bob", 0)
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedTok, err := st.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.RevokeToken(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	_, expiredTok, err := st.CreateToken(ctx, "alice", time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past the microsecond token's expiry
	_, otherDBTok, err := ledger.New(pgtest.NewPool(t)).CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	wantChallenge := `Bearer resource_metadata="` + srv.URL + gateway.MetadataPath + gateway.Path + `"`

	for _, tt := range []struct {
		name, auth string
		want       string // the handler's answer; "" for 401
	}{
		{"no header", "", ""},
		{"basic scheme", "Basic " + aliceTok, ""},
		{"bearer without token", "Bearer", ""},
		{"token without scheme", aliceTok, ""},
		{"three fields", "Bearer " + aliceTok + " x", ""},
		{"malformed", "Bearer mcps_short", ""},
		{"unknown", "Bearer " + otherDBTok, ""},
		{"expired", "Bearer " + expiredTok, ""},
		{"revoked", "Bearer " + revokedTok, ""},
		{"alice", "Bearer " + aliceTok, "alice " + alice.ID},
		{"bob, lower-case scheme", "bearer " + bobTok, "bob " + bob.ID},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.auth != "" {
				h["Authorization"] = tt.auth
			}
			resp, body := get(t, srv.URL+gateway.Path, h)
			if tt.want != "" {
				if resp.StatusCode != http.StatusOK || body != tt.want {
					t.Errorf("status %d, body %q; want 200 %q", resp.StatusCode, body, tt.want)
				}
				return
			}
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("status %d (body %q), want 401", resp.StatusCode, body)
			}
			if got := resp.Header.Values("WWW-Authenticate"); len(got) != 1 || got[0] != wantChallenge {
				t.Errorf("WWW-Authenticate %q, want %q", got, wantChallenge)
			}
			for _, secret := range []string{aliceTok, bobTok, revokedTok, expiredTok, otherDBTok} {
				if strings.Contains(body, secret[5:]) {
					t.Errorf("401 body %q repeats a token", body)
				}
			}
		})
	}

	// Revocation holds for the very next request.
	if resp, _ := get(t, srv.URL+gateway.Path, map[string]string{"Authorization": "Bearer " + bobTok}); resp.StatusCode != http.StatusOK {
		t.Fatalf("bob before revocation: %d", resp.StatusCode)
	}
	if _, err := st.RevokeToken(ctx, bob.ID); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, srv.URL+gateway.Path, map[string]string{"Authorization": "Bearer " + bobTok}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("bob after revocation: %d, want 401", resp.StatusCode)
	}
}

// The protected-resource metadata (RFC 9728) is served, without a token, at the URL the
// 401's challenge names and at the root well-known path; its resource is the MCP endpoint as
// the client reached it (https behind a TLS-terminating proxy).
func TestProtectedResourceMetadata(t *testing.T) {
	_, srv := authServer(t)
	resp, _ := get(t, srv.URL+gateway.Path, nil)
	challenge := resp.Header.Get("WWW-Authenticate")
	metaURL, ok := strings.CutPrefix(challenge, `Bearer resource_metadata="`)
	metaURL, ok2 := strings.CutSuffix(metaURL, `"`)
	if !ok || !ok2 {
		t.Fatalf("challenge %q names no resource_metadata", challenge)
	}
	type metadata struct {
		Resource               string   `json:"resource"`
		AuthorizationServers   []string `json:"authorization_servers"`
		BearerMethodsSupported []string `json:"bearer_methods_supported"`
		ResourceName           string   `json:"resource_name"`
	}
	for _, tt := range []struct {
		name, url string
		header    map[string]string
		want      metadata
	}{
		{"challenge URL", metaURL, nil, metadata{Resource: srv.URL + gateway.Path, BearerMethodsSupported: []string{"header"}, ResourceName: "mcpsync gateway"}},
		{"root", srv.URL + gateway.MetadataPath, nil, metadata{Resource: srv.URL + gateway.Path, BearerMethodsSupported: []string{"header"}, ResourceName: "mcpsync gateway"}},
		{"behind TLS proxy", metaURL, map[string]string{"X-Forwarded-Proto": "https"},
			metadata{Resource: "https://" + strings.TrimPrefix(srv.URL, "http://") + gateway.Path, BearerMethodsSupported: []string{"header"}, ResourceName: "mcpsync gateway"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := get(t, tt.url, tt.header)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("GET %s: %d %s %q", tt.url, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			var got metadata
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("metadata (-want +got):\n%s", diff)
			}
		})
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+gateway.MetadataPath, strings.NewReader("{}"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST metadata: %d, want 405", resp.StatusCode)
	}
}
