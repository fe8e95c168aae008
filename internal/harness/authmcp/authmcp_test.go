package authmcp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/authmcp"
)

// The server publishes its protected-resource metadata where its 401 challenge points, and
// counts what it refused and served.
func TestResourceMetadataAndCounters(t *testing.T) {
	s := authmcp.New(t, authmcp.Options{Tokens: []string{"t"}, Scopes: []string{"mcp:read"},
		AuthorizationServers: []string{"https://as.example"}})
	resp, err := http.Get(s.ResourceMetadataURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"resource": s.URL, "authorization_servers": []any{"https://as.example"},
		"scopes_supported": []any{"mcp:read"}, "bearer_methods_supported": []any{"header"}, "resource_name": "authmcp"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}

	for _, token := range []string{"", "wrong", "t"} {
		req, _ := http.NewRequest(http.MethodPost, s.URL, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantChallenge := ""
		if token != "t" {
			wantChallenge = `Bearer resource_metadata="` + s.ResourceMetadataURL + `", scope="mcp:read"`
		}
		if got := resp.Header.Get("WWW-Authenticate"); got != wantChallenge {
			t.Errorf("token %q: WWW-Authenticate %q, want %q", token, got, wantChallenge)
		}
	}
	if s.Rejected() != 2 || s.Served() != 1 {
		t.Errorf("rejected %d, served %d; want 2 and 1", s.Rejected(), s.Served())
	}
}
