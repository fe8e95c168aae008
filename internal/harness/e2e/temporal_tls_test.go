package e2e_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/harness/testpki"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// The embedded Temporal server serves TLS on its frontend (a generated CA and certificate);
// the worker and the CLI connect with TEMPORAL_TLS_CA, and a CA that did not sign the
// server's certificate fails with one line that names the CA file and says the certificate is
// not trusted (issue 17 item 1).
func TestTemporalTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	good := testpki.New(t, dir, "good")
	wrong := testpki.New(t, dir, "wrong")
	log := zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	srv, err := devtemporal.Start(ctx, devtemporal.Options{
		DataDir: filepath.Join(dir, "temporal"), DisableUI: true, Logger: log,
		TLS: &devtemporal.TLS{CertFile: good.Cert, KeyFile: good.Key, CAFile: good.CA},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	addr, ns := srv.FrontendAddress(), srv.Namespace()

	// The frontend really requires TLS: a plain-text client is refused.
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	if c, err := (config.TemporalConn{}).Dial(pctx, addr, ns, client.Options{}); err == nil {
		c.Close()
		t.Fatal("a plain-text client connected to the TLS frontend")
	}
	pcancel()

	dbURL := pgtest.NewDB(t)
	trusted := config.TemporalConn{TLSCA: good.CA}
	w, err := workerapp.Start(ctx, workerapp.Config{
		DatabaseURL: dbURL, TemporalAddress: addr, Namespace: ns, TemporalConn: trusted, Logger: log,
		HostQueue: "tls-host",
	})
	if err != nil {
		t.Fatalf("worker with TEMPORAL_TLS_CA: %v", err)
	}
	t.Cleanup(w.Stop)
	// The worker polls over TLS.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := w.Client.WorkflowService().DescribeTaskQueue(ctx, &workflowservice.DescribeTaskQueueRequest{
			Namespace: ns, TaskQueue: &taskqueuepb.TaskQueue{Name: contract.TaskQueue, Kind: enumspb.TASK_QUEUE_KIND_NORMAL},
			TaskQueueType: enumspb.TASK_QUEUE_TYPE_WORKFLOW,
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetPollers()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the TLS worker never polled its task queue")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, _, err := w.Store.AddSource(ctx, ledger.SourceSpec{Name: "tls", Transport: ledger.TransportHTTP, URL: "http://127.0.0.1:1/mcp"}); err != nil {
		t.Fatal(err)
	}

	// The CLI reads the same variables the Temporal CLI uses.
	run := func(ca string) (string, cli.ExitCode) {
		t.Helper()
		t.Setenv("TEMPORAL_ADDRESS", addr)
		t.Setenv("TEMPORAL_NAMESPACE", ns)
		t.Setenv("DATABASE_URL", dbURL)
		t.Setenv("TEMPORAL_TLS_CA", ca)
		var out, errb bytes.Buffer
		code := cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb}, []string{"reconcile", "tls", "--json"})
		return errb.String(), code
	}
	if stderr, code := run(good.CA); code != cli.ExitOK {
		t.Fatalf("mcpsync reconcile with TEMPORAL_TLS_CA: exit %d: %s", code, stderr)
	}

	// A CA that did not sign the server's certificate: one line naming the CA file.
	stderr, code := run(wrong.CA)
	t.Logf("wrong CA, CLI: exit %d: %s", code, stderr)
	if code != cli.ExitFailure {
		t.Errorf("wrong CA: exit %d, want %d (%s)", code, cli.ExitFailure, stderr)
	}
	if lines := strings.Count(stderr, "\n"); lines != 1 || !strings.Contains(stderr, wrong.CA) || !strings.Contains(stderr, "not trusted") {
		t.Errorf("wrong CA: want one line naming %s and saying the certificate is not trusted, got %q", wrong.CA, stderr)
	}
	_, err = workerapp.Start(ctx, workerapp.Config{
		DatabaseURL: dbURL, TemporalAddress: addr, Namespace: ns, TemporalConn: config.TemporalConn{TLSCA: wrong.CA}, Logger: log,
	})
	t.Logf("wrong CA, worker: %v", err)
	if err == nil || !strings.Contains(err.Error(), wrong.CA) || !strings.Contains(err.Error(), "not trusted") || strings.Contains(err.Error(), "\n") {
		t.Errorf("worker with the wrong CA: want one line naming %s and saying not trusted, got %v", wrong.CA, err)
	}
}

// With mutual TLS the frontend requires a client certificate: the worker and the CLI present
// TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY, and without them the connection is refused.
func TestTemporalMutualTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	p := testpki.New(t, dir, "mtls")
	log := zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	srv, err := devtemporal.Start(ctx, devtemporal.Options{
		DataDir: filepath.Join(dir, "temporal"), DisableUI: true, Logger: log,
		TLS: &devtemporal.TLS{CertFile: p.Cert, KeyFile: p.Key, CAFile: p.CA, ClientCAFile: p.CA},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	addr, ns := srv.FrontendAddress(), srv.Namespace()
	dbURL := pgtest.NewDB(t)

	noCert := config.TemporalConn{TLSCA: p.CA}
	if _, err := workerapp.Start(ctx, workerapp.Config{DatabaseURL: dbURL, TemporalAddress: addr, Namespace: ns, TemporalConn: noCert, Logger: log}); err == nil {
		t.Fatal("a worker without a client certificate connected to the mutual-TLS frontend")
	} else {
		t.Logf("without a client certificate: %v", err)
	}
	w, err := workerapp.Start(ctx, workerapp.Config{
		DatabaseURL: dbURL, TemporalAddress: addr, Namespace: ns, Logger: log, HostQueue: "mtls-host",
		TemporalConn: config.TemporalConn{TLSCA: p.CA, TLSCert: p.Cert, TLSKey: p.Key},
	})
	if err != nil {
		t.Fatalf("worker with TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY: %v", err)
	}
	t.Cleanup(w.Stop)
	if _, _, err := w.Store.AddSource(ctx, ledger.SourceSpec{Name: "mtls", Transport: ledger.TransportHTTP, URL: "http://127.0.0.1:1/mcp"}); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"TEMPORAL_ADDRESS": addr, "TEMPORAL_NAMESPACE": ns, "DATABASE_URL": dbURL,
		"TEMPORAL_TLS_CA": p.CA, "TEMPORAL_TLS_CERT": p.Cert, "TEMPORAL_TLS_KEY": p.Key} {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	if code := cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb}, []string{"reconcile", "mtls"}); code != cli.ExitOK {
		t.Fatalf("mcpsync reconcile with a client certificate: exit %d: %s", code, errb.String())
	}
}
