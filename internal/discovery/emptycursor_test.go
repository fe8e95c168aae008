package discovery_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/discovery"
)

// TestTranslateEmptyCursorsHTTPBodies: a 2026-07-28 list answer whose result carries an empty
// nextCursor reaches the go-sdk with EmptyCursor in its place, whatever JSON whitespace
// surrounds it and whatever else in the page says "nextCursor"; every other answer (a
// non-empty cursor, none, the text only inside a string) passes byte for byte.
func TestTranslateEmptyCursorsHTTPBodies(t *testing.T) {
	tests := []struct {
		name, body string
		translate  bool // want nextCursor EmptyCursor; otherwise the body unchanged
	}{
		{"empty", `{"jsonrpc":"2.0","id":7,"result":{"resources":[],"nextCursor":""}}`, true},
		{"empty with whitespace", "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"resources\":[],\"nextCursor\" :\n\t \"\"}}", true},
		{"empty after a non-empty one in _meta", `{"jsonrpc":"2.0","id":7,"result":{"_meta":{"nextCursor":"m"},"resources":[],"nextCursor":""}}`, true},
		{"non-empty", `{"jsonrpc":"2.0","id":7,"result":{"resources":[],"nextCursor":"p2"}}`, false},
		{"none", `{"jsonrpc":"2.0","id":7,"result":{"resources":[]}}`, false},
		{"only inside a name", `{"jsonrpc":"2.0","id":7,"result":{"resources":[{"uri":"a://b","name":"\"nextCursor\": \"\""}],"nextCursor":"p2"}}`, false},
		{"empty only in _meta", `{"jsonrpc":"2.0","id":7,"result":{"_meta":{"nextCursor":""},"resources":[],"nextCursor":"p2"}}`, false},
		{"another request's answer", `{"jsonrpc":"2.0","id":8,"result":{"resources":[],"nextCursor":""}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			req := `{"jsonrpc":"2.0","id":7,"method":"resources/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"` +
				mcpsync.ProtocolVersion20260728 + `"}}}`
			resp, err := discovery.TranslateEmptyCursorsHTTP(srv.Client()).Post(srv.URL, "application/json", bytes.NewReader([]byte(req)))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !tt.translate {
				if diff := cmp.Diff(tt.body, string(got)); diff != "" {
					t.Errorf("body changed (-sent +received):\n%s", diff)
				}
				return
			}
			var msg struct {
				Result struct {
					NextCursor *string `json:"nextCursor"`
				} `json:"result"`
			}
			if err := json.Unmarshal(got, &msg); err != nil || msg.Result.NextCursor == nil || *msg.Result.NextCursor != discovery.EmptyCursor {
				t.Errorf("received %s (%v), want nextCursor EmptyCursor", got, err)
			}
		})
	}
}

// The transport taps pass a request on unread only when its header names an era before
// 2026-07-28; one without the header, or of 2026-07-28 and later, is read.
func TestLegacyRequest(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   bool
	}{{"", false}, {"2024-11-05", true}, {"2025-11-25", true}, {"2026-07-28", false}, {"2027-01-01", false}} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Mcp-Protocol-Version", tc.header)
		}
		if got := discovery.LegacyRequest(h); got != tc.want {
			t.Errorf("LegacyRequest(Mcp-Protocol-Version %q) = %v, want %v", tc.header, got, tc.want)
		}
	}
}
