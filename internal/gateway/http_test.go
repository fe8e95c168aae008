package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

// post sends one JSON-RPC body to the gateway with the given headers.
func post(t *testing.T, url string, body io.Reader, size int64, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",` +
	`"capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`

// The HTTP boundary: no or bad token → 401 with WWW-Authenticate: Bearer; an oversized body
// (announced or chunked) → 413 naming the limit, with or without a token; a 2025-11-25
// session cannot be used with another principal's token; a go-sdk client without a token
// cannot connect in either era.
func TestHTTPBoundary(t *testing.T) {
	const limit = 64 << 10
	s := newGWStack(t, func(o *gateway.Options) { o.MaxRequestBytes = limit })
	alice, bob := s.Token("alice"), s.Token("bob")
	big := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"pad":"` + strings.Repeat("x", limit) + `"}}}`

	for _, tc := range []struct {
		name   string
		body   string
		chunk  bool
		hdr    map[string]string
		status int
		msg    string
	}{
		{"no token", initializeBody, false, nil, 401, ""},
		{"unknown token", initializeBody, false, map[string]string{"Authorization": "Bearer mcps_nope"}, 401, ""},
		{"not bearer", initializeBody, false, map[string]string{"Authorization": "Basic " + alice}, 401, ""},
		{"oversized, no token", big, false, nil, 413, "at most 65536 bytes"},
		{"oversized", big, false, map[string]string{"Authorization": "Bearer " + alice}, 413, "at most 65536 bytes"},
		{"oversized chunked", big, true, map[string]string{"Authorization": "Bearer " + alice}, 413, "at most 65536 bytes"},
		{"oversized 2026", big, false, map[string]string{"Authorization": "Bearer " + alice, "Mcp-Protocol-Version": era2026}, 413, "at most 65536 bytes"},
		{"initialize", initializeBody, false, map[string]string{"Authorization": "Bearer " + alice}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := int64(len(tc.body))
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunk {
				size, body = -1, io.MultiReader(strings.NewReader(tc.body)) // unknown length: chunked
			}
			resp, text := post(t, s.URL, body, size, tc.hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%q), want %d", resp.StatusCode, text, tc.status)
			}
			if tc.status == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate: Bearer (got %q)", resp.Header.Get("WWW-Authenticate"))
			}
			if !strings.Contains(text, tc.msg) {
				t.Errorf("body %q does not say %q", text, tc.msg)
			}
		})
	}

	// A session belongs to the principal that opened it.
	resp, _ := post(t, s.URL, strings.NewReader(initializeBody), -1, map[string]string{"Authorization": "Bearer " + alice})
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatal("initialize: no Mcp-Session-Id")
	}
	ping := `{"jsonrpc":"2.0","id":2,"method":"resources/list","params":{}}`
	hdr := map[string]string{"Authorization": "Bearer " + bob, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": era2025}
	if resp, text := post(t, s.URL, bytes.NewReader([]byte(ping)), -1, hdr); resp.StatusCode != http.StatusForbidden {
		t.Errorf("bob on alice's session: status %d %q, want 403", resp.StatusCode, text)
	}

	// DNS-rebinding protection (README: a TLS proxy in front must send the upstream's Host).
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL, strings.NewReader(initializeBody))
	req.Host = "gateway.example.com"
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("non-loopback Host on the loopback listener: %v %v, want 403", err, resp)
	} else {
		resp.Body.Close()
	}

	for _, era := range eras {
		if _, err := s.Connect("", era, nil); err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
			t.Errorf("%s: connect without a token: %v, want a 401", era, err)
		}
	}
}
