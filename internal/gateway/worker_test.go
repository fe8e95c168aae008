package gateway_test

import (
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// mcpsync-worker's gateway address: unset → the default, "off" (any case) or empty → none,
// anything else as given.
func TestAddrFromEnv(t *testing.T) {
	for _, tc := range []struct {
		set       bool
		val, want string
	}{
		{false, "", gateway.DefaultAddr},
		{true, "off", ""},
		{true, " OFF ", ""},
		{true, "", ""},
		{true, "0.0.0.0:9000", "0.0.0.0:9000"},
	} {
		if tc.set {
			t.Setenv(gateway.EnvAddr, tc.val)
		} else {
			t.Setenv(gateway.EnvAddr, "x") // registers the restore; then unset
			if err := syscall.Unsetenv(gateway.EnvAddr); err != nil {
				t.Fatal(err)
			}
		}
		if got := gateway.AddrFromEnv(); got != tc.want {
			t.Errorf("%s=%q (set %v): %q, want %q", gateway.EnvAddr, tc.val, tc.set, got, tc.want)
		}
	}
}

// A worker started with GatewayAddr serves the gateway on the real port it bound (an agent
// reads through it), a second worker asking for the same address runs on without a gateway
// after one WARN line naming MCPSYNC_GATEWAY_ADDR, and stopping the worker stops the gateway.
func TestWorkerServesGateway(t *testing.T) {
	s := newGWStack(t)
	s.Put("demo://w/1", "worker body\n")
	s.Grant("carol", testSource)
	s.Subscribe("carol", testSource, "demo://w/1", "worker body\n")
	tok := s.Token("carol")

	start := func(name, addr string, log *zap.Logger) *workerapp.Worker {
		t.Helper()
		w, err := workerapp.Start(s.Ctx, workerapp.Config{DatabaseURL: s.Stack.DatabaseURL, Namespace: s.Stack.Namespace,
			Client: s.Stack.Client, HostQueue: name + "-" + t.Name(), Logger: log, GatewayAddr: addr})
		if err != nil {
			t.Fatalf("start worker %s: %v", name, err)
		}
		t.Cleanup(w.Stop)
		return w
	}
	w := start("gw-a", "127.0.0.1:0", s.Log)
	url := w.GatewayURL()
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.HasPrefix(url, "http://127.0.0.1:0/") || !strings.HasSuffix(url, gateway.Path) {
		t.Fatalf("worker gateway URL %q: want http://127.0.0.1:<real port>/mcp", url)
	}
	for _, era := range eras {
		gs := *s
		gs.URL = url
		c := gs.MustConnect(tok, era, nil)
		res, err := c.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: GatewayURI(testSource, "demo://w/1")})
		if err != nil || res.Contents[0].Text != "worker body\n" {
			t.Fatalf("%s: read through the worker's gateway: %v %+v", era, err, res)
		}
	}

	core, logs := observer.New(zapcore.WarnLevel)
	w2 := start("gw-b", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), gateway.Path), zap.New(core))
	if w2.GatewayURL() != "" {
		t.Errorf("second worker on a taken address serves %q", w2.GatewayURL())
	}
	warns := logs.FilterMessageSnippet("gateway not served: address in use; set " + gateway.EnvAddr).All()
	if len(warns) != 1 {
		t.Errorf("warnings %v, want one naming %s", logs.All(), gateway.EnvAddr)
	}

	w.Stop()
	resp, err := http.Post(url, "application/json", strings.NewReader(initializeBody))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("gateway still answers after the worker stopped: %s", resp.Status)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Logf("after stop: %v", err)
	}
}
