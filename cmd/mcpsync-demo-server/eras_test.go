package main_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestErasFlag: by default the demo server speaks the legacy era only (a go-sdk client that
// negotiates freely gets 2025-11-25); with --eras both a go-sdk client negotiates 2026-07-28.
func TestErasFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{args: nil, want: "2025-11-25"},
		{args: []string{"--eras", "both"}, want: "2026-07-28"},
	} {
		t.Run(tt.want, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			cmd := exec.Command(binary, append([]string{"--interval", "1h"}, tt.args...)...)
			c := mcp.NewClient(&mcp.Implementation{Name: "eras", Version: "0"}, nil)
			cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != tt.want {
				t.Errorf("negotiated %s, want %s", got, tt.want)
			}
			if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://notes/1"}); err != nil {
				t.Errorf("read demo://notes/1 at %s: %v", tt.want, err)
			}
		})
	}
}
