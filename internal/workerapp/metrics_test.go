package workerapp_test

import (
	"net"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// The worker's metrics address (issue 17, part 2): empty disables metrics; a free address is
// served; an address in use is one WARN line naming MCPSYNC_METRICS_ADDR and the worker runs
// on without metrics; a malformed address stops the worker with an error naming the variable.
func TestMetricsAddr(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tests := []struct {
		name     string
		addr     string
		wantURL  bool
		wantErr  string
		wantWarn string
	}{
		{name: "disabled", addr: ""},
		{name: "free port", addr: "127.0.0.1:0", wantURL: true},
		{name: "in use", addr: taken.Addr().String(), wantWarn: "metrics not served: address in use; set MCPSYNC_METRICS_ADDR"},
		{name: "malformed", addr: "127.0.0.1:port", wantErr: "MCPSYNC_METRICS_ADDR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			url, stop, err := workerapp.StartMetricsForTest(tt.addr, zap.New(core))
			defer stop()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := url != ""; got != tt.wantURL {
				t.Errorf("url %q, want served: %v", url, tt.wantURL)
			}
			warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
			switch {
			case tt.wantWarn == "" && len(warns) != 0:
				t.Errorf("unexpected warnings: %v", warns)
			case tt.wantWarn != "" && (len(warns) != 1 || !strings.Contains(warns[0].Message, tt.wantWarn)):
				t.Errorf("warnings %v, want exactly one containing %q", warns, tt.wantWarn)
			}
		})
	}
}
