package config_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/testpki"
)

const apiKey = "tk_live_s3cr3t-api-key-value"

// FromEnv reads every variable under the Temporal CLI's names (issue 17 item 1).
func TestFromEnvTemporalConn(t *testing.T) {
	for k, v := range map[string]string{
		"TEMPORAL_ADDRESS": "temporal.example:7233", "TEMPORAL_NAMESPACE": "prod",
		"TEMPORAL_TLS_CERT": "/c.pem", "TEMPORAL_TLS_KEY": "/k.pem", "TEMPORAL_TLS_CA": "/ca.pem",
		"TEMPORAL_TLS_SERVER_NAME": "temporal.internal", "TEMPORAL_TLS": "true", "TEMPORAL_API_KEY": apiKey,
	} {
		t.Setenv(k, v)
	}
	got := config.FromEnv()
	want := config.Env{TemporalAddress: "temporal.example:7233", Namespace: "prod", DatabaseURL: config.DefaultDatabaseURL,
		Temporal: config.TemporalConn{TLSCert: "/c.pem", TLSKey: "/k.pem", TLSCA: "/ca.pem", TLSServerName: "temporal.internal", TLS: "true", APIKey: apiKey}}
	if got != want {
		t.Errorf("FromEnv = %#v, want %#v (API key compared, not shown)", got, want)
	}
}

// However an Env or TemporalConn is printed, TEMPORAL_API_KEY is masked.
func TestAPIKeyMasked(t *testing.T) {
	env := config.Env{TemporalAddress: "a:1", Namespace: "n", Temporal: config.TemporalConn{TLSCA: "/ca.pem", APIKey: apiKey}}
	for _, out := range []string{
		fmt.Sprint(env), fmt.Sprintf("%+v", env), fmt.Sprintf("%#v", env), fmt.Sprint(env.Temporal),
		fmt.Sprintf("%+v", env.Temporal), fmt.Sprintf("%#v", env.Temporal),
		fmt.Sprintf("%v", struct{ C config.TemporalConn }{env.Temporal}),
	} {
		if strings.Contains(out, apiKey) || !strings.Contains(out, "TEMPORAL_API_KEY=***") || !strings.Contains(out, "/ca.pem") {
			t.Errorf("printed as %q", out)
		}
	}
}

// Bad settings are one line naming the setting and file, never a key or a file's contents.
func TestTemporalConnBadInput(t *testing.T) {
	dir := t.TempDir()
	p := testpki.New(t, dir, "p")
	other := testpki.New(t, dir, "o")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a pem "+apiKey), 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "unreadable.pem")
	if err := os.WriteFile(unreadable, []byte("x"), 0o000); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		conn config.TemporalConn
		want []string
	}{
		{"cert without key", config.TemporalConn{TLSCert: p.Cert}, []string{"TEMPORAL_TLS_CERT", p.Cert, "without its key TEMPORAL_TLS_KEY"}},
		{"key without cert", config.TemporalConn{TLSKey: p.Key}, []string{"TEMPORAL_TLS_KEY", p.Key, "without its certificate"}},
		{"missing CA", config.TemporalConn{TLSCA: missing}, []string{"TEMPORAL_TLS_CA", missing, "cannot be read"}},
		{"missing cert", config.TemporalConn{TLSCert: missing, TLSKey: p.Key}, []string{"TEMPORAL_TLS_CERT", missing, "cannot be read"}},
		{"CA not PEM", config.TemporalConn{TLSCA: garbage, APIKey: apiKey}, []string{"TEMPORAL_TLS_CA", garbage, "no PEM certificate"}},
		{"key of another cert", config.TemporalConn{TLSCert: p.Cert, TLSKey: other.Key}, []string{p.Cert, other.Key, "not a usable certificate and key"}},
		{"key not PEM", config.TemporalConn{TLSCert: p.Cert, TLSKey: garbage}, []string{garbage, "not a usable certificate and key"}},
		{"TEMPORAL_TLS not a boolean", config.TemporalConn{TLS: "maybe"}, []string{"TEMPORAL_TLS", `"maybe"`, "true or false"}},
		{"TLS off with a CA", config.TemporalConn{TLS: "false", TLSCA: p.CA}, []string{"TEMPORAL_TLS is false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.conn.ClientOptions("a:1", "n", client.Options{})
			var ce *config.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("ClientOptions: %v, want a *config.ConfigError", err)
			}
			if verr := tc.conn.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate = %v, want %v", verr, err)
			}
			msg := err.Error()
			t.Log(msg)
			if strings.Contains(msg, "\n") || strings.Contains(msg, apiKey) || strings.Contains(msg, "not a pem") {
				t.Errorf("message is not one clean line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
	if os.Geteuid() != 0 { // root reads any file
		_, err := config.TemporalConn{TLSCA: unreadable}.ClientOptions("a:1", "n", client.Options{})
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("unreadable CA: %v", err)
		}
	}
}

// ClientOptions sets TLS exactly when asked for, with the CA, client certificate and server
// name, and the API key as credentials.
func TestTemporalClientOptions(t *testing.T) {
	p := testpki.New(t, t.TempDir(), "p")
	for _, tc := range []struct {
		name       string
		conn       config.TemporalConn
		tls, roots bool
		certs      int
		serverName string
		disabled   bool
		creds      bool
	}{
		{name: "zero: plain text", conn: config.TemporalConn{}},
		{name: "CA", conn: config.TemporalConn{TLSCA: p.CA}, tls: true, roots: true},
		{name: "mTLS", conn: config.TemporalConn{TLSCert: p.Cert, TLSKey: p.Key}, tls: true, certs: 1},
		{name: "server name", conn: config.TemporalConn{TLSServerName: "t.internal"}, tls: true, serverName: "t.internal"},
		{name: "forced", conn: config.TemporalConn{TLS: "1"}, tls: true},
		{name: "API key", conn: config.TemporalConn{APIKey: apiKey}, tls: true, creds: true},
		{name: "API key over plain text", conn: config.TemporalConn{APIKey: apiKey, TLS: "false"}, disabled: true, creds: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := tc.conn.ClientOptions("a:1", "ns", client.Options{Identity: "me"})
			if err != nil {
				t.Fatal(err)
			}
			c := opts.ConnectionOptions.TLS
			type summary struct {
				HostPort, Namespace, Identity string
				TLS, Roots, Disabled, Creds   bool
				Certs                         int
				ServerName                    string
			}
			got := summary{opts.HostPort, opts.Namespace, opts.Identity, c != nil, c != nil && c.RootCAs != nil,
				opts.ConnectionOptions.TLSDisabled, opts.Credentials != nil, 0, ""}
			if c != nil {
				got.Certs, got.ServerName = len(c.Certificates), c.ServerName
			}
			want := summary{"a:1", "ns", "me", tc.tls, tc.roots, tc.disabled, tc.creds, tc.certs, tc.serverName}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

// fakeFrontend is a gRPC server that answers the SDK's connection check (GetSystemInfo,
// unimplemented as on an old server) and records the authorization metadata it received.
type fakeFrontend struct {
	workflowservice.UnimplementedWorkflowServiceServer
	mu   sync.Mutex
	auth []string
	// encodings are the grpc-encoding headers of the requests received ("" for none).
	encodings []string
}

// HandleRPC records each request's compression (stats.Handler).
func (f *fakeFrontend) HandleRPC(_ context.Context, s stats.RPCStats) {
	if h, ok := s.(*stats.InHeader); ok && !h.Client && h.FullMethod != "" {
		f.mu.Lock()
		f.encodings = append(f.encodings, h.Compression)
		f.mu.Unlock()
	}
}

func (f *fakeFrontend) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (f *fakeFrontend) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (f *fakeFrontend) HandleConn(context.Context, stats.ConnStats) {}

func (f *fakeFrontend) seenEncodings() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.encodings...)
}

func (f *fakeFrontend) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.auth...)
}

func startFake(t *testing.T, tlsCfg *tls.Config) (*fakeFrontend, string) {
	t.Helper()
	f := &fakeFrontend{}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	opts = append(opts, grpc.StatsHandler(f), grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		f.mu.Lock()
		f.auth = append(f.auth, md.Get("authorization")...)
		f.mu.Unlock()
		return h(ctx, req)
	}))
	s := grpc.NewServer(opts...)
	workflowservice.RegisterWorkflowServiceServer(s, f)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return f, l.Addr().String()
}

// A client of a loopback address sends its requests uncompressed (the embedded server: gzip
// would cost CPU on both ends for nothing); a compression the caller asks for is kept, and
// other addresses keep the SDK's default, gzip.
func TestTemporalCompression(t *testing.T) {
	for _, tc := range []struct {
		addr string
		base client.GrpcCompression
		want string // "none", "gzip" (asked for) or "default" (the SDK's: gzip)
	}{
		{"127.0.0.1:7233", nil, "none"},
		{"127.9.8.7:7233", nil, "none"},
		{"localhost:7233", nil, "none"},
		{"LOCALHOST", nil, "none"},
		{"[::1]:7233", nil, "none"},
		{"127.0.0.1:7233", &client.GrpcCompressionGzip{}, "gzip"},
		{"temporal.internal:7233", nil, "default"},
		{"10.0.0.5:7233", nil, "default"},
		{"localhost.example.com:7233", nil, "default"},
		{"[2001:db8::1]:7233", nil, "default"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			opts, err := config.TemporalConn{}.ClientOptions(tc.addr, "ns", client.Options{ConnectionOptions: client.ConnectionOptions{GrpcCompression: tc.base}})
			if err != nil {
				t.Fatal(err)
			}
			got := "default"
			switch opts.ConnectionOptions.GrpcCompression.(type) {
			case *client.GrpcCompressionNone:
				got = "none"
			case *client.GrpcCompressionGzip:
				got = "gzip"
			}
			if got != tc.want {
				t.Errorf("compression %s, want %s", got, tc.want)
			}
		})
	}

	// On the wire: the server sees no grpc-encoding from a loopback dial, gzip when asked.
	for _, tc := range []struct {
		name string
		base client.GrpcCompression
		want string
	}{{"loopback", nil, ""}, {"gzip asked for", &client.GrpcCompressionGzip{}, "gzip"}} {
		t.Run("wire "+tc.name, func(t *testing.T) {
			f, addr := startFake(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := config.TemporalConn{}.Dial(ctx, addr, "default", client.Options{ConnectionOptions: client.ConnectionOptions{GrpcCompression: tc.base}})
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			got := f.seenEncodings()
			if len(got) == 0 {
				t.Fatal("the server saw no request")
			}
			for _, e := range got {
				if e != tc.want {
					t.Fatalf("request encodings %q, want every one %q", got, tc.want)
				}
			}
		})
	}
}

// TEMPORAL_API_KEY reaches the server as "Authorization: Bearer …", over TLS verified with
// TEMPORAL_TLS_CA and over plain text when TEMPORAL_TLS=false; a CA that did not sign the
// server's certificate fails with one line naming the CA file.
func TestTemporalDial(t *testing.T) {
	dir := t.TempDir()
	p := testpki.New(t, dir, "server")
	wrong := testpki.New(t, dir, "wrong")
	pair, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	tlsFake, tlsAddr := startFake(t, &tls.Config{Certificates: []tls.Certificate{pair}})
	clientCAs := x509.NewCertPool()
	caPEM, err := os.ReadFile(p.CA)
	if err != nil || !clientCAs.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	// TLS 1.2: the client learns of a refused client certificate within the handshake (with
	// TLS 1.3 the alert may lose the race against the client's first write).
	_, mtlsAddr := startFake(t, &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: clientCAs,
		ClientAuth: tls.RequireAndVerifyClientCert, MaxVersion: tls.VersionTLS12})
	plainFake, plainAddr := startFake(t, nil)
	ctx := context.Background()

	dial := func(conn config.TemporalConn, addr string) error {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := conn.Dial(dctx, addr, "default", client.Options{})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(config.TemporalConn{TLSCA: p.CA, APIKey: apiKey}, tlsAddr); err != nil {
		t.Fatalf("TLS with the right CA and an API key: %v", err)
	}
	if got := tlsFake.seen(); len(got) == 0 || got[0] != "Bearer "+apiKey {
		t.Errorf("authorization over TLS = %d values, want the API key", len(got))
	}
	if err := dial(config.TemporalConn{TLS: "false", APIKey: apiKey}, plainAddr); err != nil {
		t.Fatalf("plain text with an API key: %v", err)
	}
	if got := plainFake.seen(); len(got) == 0 || got[0] != "Bearer "+apiKey {
		t.Errorf("authorization over plain text = %d values, want the API key", len(got))
	}

	for _, tc := range []struct {
		name string
		conn config.TemporalConn
		addr string
		want []string
	}{
		{"wrong CA", config.TemporalConn{TLSCA: wrong.CA, APIKey: apiKey}, tlsAddr, []string{tlsAddr, "not trusted", wrong.CA}},
		{"system roots", config.TemporalConn{TLS: "true"}, tlsAddr, []string{"not trusted", "system's root CAs", "TEMPORAL_TLS_CA"}},
		{"wrong server name", config.TemporalConn{TLSCA: p.CA, TLSServerName: "temporal.example"}, tlsAddr, []string{"does not match", "TEMPORAL_TLS_SERVER_NAME"}},
		{"TLS to a plain-text server", config.TemporalConn{TLSCA: p.CA}, plainAddr, []string{"does not speak TLS"}},
		{"plain text to a TLS server", config.TemporalConn{}, tlsAddr, []string{"may require TLS"}},
		{"no client certificate", config.TemporalConn{TLSCA: p.CA}, mtlsAddr, []string{"refused the TLS handshake without a client certificate", "TEMPORAL_TLS_CERT"}},
		{"client certificate of another CA", config.TemporalConn{TLSCA: p.CA, TLSCert: wrong.Cert, TLSKey: wrong.Key}, mtlsAddr, []string{"refused the TLS handshake with the client certificate", wrong.Cert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := dial(tc.conn, tc.addr)
			var de *config.DialError
			if !errors.As(err, &de) {
				t.Fatalf("dial: %v, want a *config.DialError", err)
			}
			msg := err.Error()
			t.Log(msg)
			if strings.Contains(msg, "\n") || strings.Contains(msg, apiKey) {
				t.Errorf("not one clean line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
		})
	}
}

// Flags override the environment; the API key has no flag.
func TestTemporalFlags(t *testing.T) {
	t.Setenv("TEMPORAL_TLS_CA", "/env-ca.pem")
	t.Setenv("TEMPORAL_TLS_SERVER_NAME", "env.internal")
	env := config.FromEnv()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	env.TemporalFlags(fs)
	if err := fs.Parse([]string{"--temporal-tls-ca", "/flag-ca.pem", "--temporal-tls", "--temporal-address", "t:7233"}); err != nil {
		t.Fatal(err)
	}
	want := config.TemporalConn{TLSCA: "/flag-ca.pem", TLSServerName: "env.internal", TLS: "true"}
	if env.Temporal != want || env.TemporalAddress != "t:7233" {
		t.Errorf("after flags: %v", env)
	}
	if fs.Lookup("temporal-api-key") != nil {
		t.Error("there is a flag for the API key; it would be visible in the process list")
	}
	if err := fs.Parse([]string{"--temporal-tls=maybe"}); err == nil {
		t.Error("--temporal-tls=maybe accepted")
	}
}
