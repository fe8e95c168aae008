package mcphost_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// TestStampNotificationVersion: a 2026-07-28 notification POST without the protocol version in
// _meta gets the header's version there, every other field kept; requests, older eras and
// notifications that carry a version are sent unchanged.
func TestStampNotificationVersion(t *testing.T) {
	const pv = "io.modelcontextprotocol/protocolVersion"
	tests := []struct {
		name, header, body string
		want               any // the decoded body sent; nil: unchanged
	}{
		{"cancelled without _meta", "2026-07-28", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"context canceled","requestId":2}}`,
			map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled",
				"params": map[string]any{"reason": "context canceled", "requestId": 2.0, "_meta": map[string]any{pv: "2026-07-28"}}}},
		{"notification with other _meta", "2026-07-28", `{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":{"_meta":{"k":"v"}}}`,
			map[string]any{"jsonrpc": "2.0", "method": "notifications/roots/list_changed", "params": map[string]any{"_meta": map[string]any{"k": "v", pv: "2026-07-28"}}}},
		{"notification without params", "2026-07-28", `{"jsonrpc":"2.0","method":"notifications/x"}`,
			map[string]any{"jsonrpc": "2.0", "method": "notifications/x", "params": map[string]any{"_meta": map[string]any{pv: "2026-07-28"}}}},
		{"version present", "2026-07-28", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"_meta":{"` + pv + `":"2026-07-28"},"requestId":2}}`, nil},
		{"request", "2026-07-28", `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"a"}}`, nil},
		{"response", "2026-07-28", `{"jsonrpc":"2.0","id":3,"result":{}}`, nil},
		{"2025-11-25 era", "2025-11-25", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`, nil},
		{"no header", "", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`, nil},
		{"not JSON", "2026-07-28", `{"method": nope`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.header != "" {
				h.Set("Mcp-Protocol-Version", tt.header)
			}
			out, changed := mcphost.StampNotificationVersion(h, []byte(tt.body))
			if tt.want == nil {
				if changed || string(out) != tt.body {
					t.Fatalf("changed to %s, want unchanged", out)
				}
				return
			}
			var got any
			if !changed || json.Unmarshal(out, &got) != nil {
				t.Fatalf("changed %v, body %s", changed, out)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
		})
	}
}
