package config_test

import (
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/config"
)

// A listen address is checked as written, before anything listens: host:port with a usable
// port passes, anything a listener would refuse fails with one line naming the setting.
func TestCheckListenAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8765", true},
		{":9090", true},
		{"127.0.0.1:0", true},
		{"127.0.0.1:", true},
		{"[::1]:8765", true},
		{"localhost:http", true},
		{"nonsense", false},
		{"127.0.0.1:99999", false},
		{"127.0.0.1:-1", false},
		{"127.0.0.1:no-such-service-here", false},
		{"::1:8765", false},
		{"", false},
	} {
		err := config.CheckListenAddr("MCPSYNC_GATEWAY_ADDR", tc.addr)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListenAddr(%q) = %v, want ok %v", tc.addr, err, tc.ok)
			continue
		}
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "MCPSYNC_GATEWAY_ADDR=") || !strings.Contains(msg, "want host:port") || strings.Contains(msg, "\n") {
				t.Errorf("CheckListenAddr(%q): %q, want one line naming the variable and what it wants", tc.addr, msg)
			}
		}
	}
}
