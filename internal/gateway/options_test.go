package gateway_test

import (
	"errors"
	"net"
	"strings"
	"testing"

	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// New refuses options it cannot run with, each with a line saying what is wrong; Start on a
// taken address fails with ErrAddrInUse naming MCPSYNC_GATEWAY_ADDR and leaves nothing
// listening; a gateway that never started closes cleanly.
func TestNewAndStartRefusals(t *testing.T) {
	tc, err := client.NewLazyClient(client.Options{HostPort: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	st := ledger.New(nil)
	for _, tt := range []struct {
		name string
		opts gateway.Options
		want string
	}{
		{"no store", gateway.Options{Temporal: tc}, "no ledger store"},
		{"no temporal", gateway.Options{Store: st}, "no Temporal client"},
		{"negative body", gateway.Options{Store: st, Temporal: tc, MaxRequestBytes: -1}, "negative limit"},
		{"negative streams", gateway.Options{Store: st, Temporal: tc, MaxStreamsPerToken: -1}, "negative limit"},
	} {
		if _, err := gateway.New(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: New = %v, want an error saying %q", tt.name, err, tt.want)
		}
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	gw, err := gateway.New(gateway.Options{Addr: taken.Addr().String(), Store: st, Temporal: tc})
	if err != nil {
		t.Fatal(err)
	}
	err = gw.Start(t.Context())
	if !errors.Is(err, gateway.ErrAddrInUse) || !strings.Contains(err.Error(), gateway.EnvAddr) {
		t.Errorf("Start on a taken address: %v, want ErrAddrInUse naming %s", err, gateway.EnvAddr)
	}
	if got := gw.URL(); got != "http://"+taken.Addr().String()+gateway.Path {
		t.Errorf("URL after a failed start: %q", got)
	}
	if err := gw.Close(); err != nil {
		t.Errorf("Close of a gateway that never started: %v", err)
	}

	def, err := gateway.New(gateway.Options{Store: st, Temporal: tc})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := def.URL(), "http://"+gateway.DefaultAddr+gateway.Path; got != want {
		t.Errorf("default URL %q, want %q (loopback)", got, want)
	}
}
