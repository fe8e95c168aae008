package devtemporal_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
)

const taskQueue = "devtemporal-test"

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// warnLogger writes warnings to stderr. Not a logger bound to t: the server's and the
// client's goroutines may still log while a test's cleanups stop them, and logging through
// a finished test panics the whole test binary.
func warnLogger() *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.Lock(os.Stderr), zap.WarnLevel))
}

func start(t *testing.T, opts devtemporal.Options) *devtemporal.Server {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = warnLogger()
	}
	s, err := devtemporal.Start(ctxFor(t), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// startGreeter starts a worker on taskQueue with Greet and Hello registered; the caller
// stops it.
func startGreeter(t *testing.T, c client.Client) worker.Worker {
	t.Helper()
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflow(Greet)
	w.RegisterActivity(Hello)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	return w
}

func dial(t *testing.T, s *devtemporal.Server) client.Client {
	t.Helper()
	c, err := client.DialContext(ctxFor(t), client.Options{
		HostPort:  s.FrontendAddress(),
		Namespace: s.Namespace(),
		Logger:    devtemporal.SDKLogger(warnLogger()),
	})
	if err != nil {
		t.Fatalf("dial %s: %v", s.FrontendAddress(), err)
	}
	t.Cleanup(c.Close)
	return c
}

// Greet is the trivial workflow: one activity, one result.
func Greet(ctx workflow.Context, name string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var out string
	err := workflow.ExecuteActivity(ctx, Hello, name).Get(ctx, &out)
	return out, err
}

// Hello is Greet's activity.
func Hello(ctx context.Context, name string) (string, error) {
	return "hello " + name + " from " + activity.GetInfo(ctx).TaskQueue, nil
}

func portOf(t *testing.T, hostPort string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(hostPort, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func TestServerLifecycle(t *testing.T) {
	dir := t.TempDir()
	s := start(t, devtemporal.Options{DataDir: dir})
	c := dial(t, s)
	ctx := ctxFor(t)

	t.Run("namespace and search attributes", func(t *testing.T) {
		if _, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: "default"}); err != nil {
			t.Fatalf("describe namespace default: %v", err)
		}
		resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: "default"})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]enumspb.IndexedValueType{}
		for name, typ := range resp.GetCustomAttributes() {
			if strings.HasPrefix(name, "Mcpsync") {
				got[name] = typ
			}
		}
		want := map[string]enumspb.IndexedValueType{
			"McpsyncSource":    enumspb.INDEXED_VALUE_TYPE_KEYWORD,
			"McpsyncURI":       enumspb.INDEXED_VALUE_TYPE_KEYWORD,
			"McpsyncState":     enumspb.INDEXED_VALUE_TYPE_KEYWORD,
			"McpsyncPrincipal": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("custom search attributes (-want +got):\n%s", diff)
		}
	})

	t.Run("workflow runs to completion", func(t *testing.T) {
		w := startGreeter(t, c)
		defer w.Stop()
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
			ID:        "greet-1",
			TaskQueue: taskQueue,
			TypedSearchAttributes: temporal.NewSearchAttributes(
				temporal.NewSearchAttributeKeyKeyword("McpsyncSource").ValueSet("demo"),
			),
		}, Greet, "world")
		if err != nil {
			t.Fatal(err)
		}
		var out string
		if err := run.Get(ctx, &out); err != nil {
			t.Fatalf("workflow: %v", err)
		}
		if want := "hello world from " + taskQueue; out != want {
			t.Errorf("workflow result %q, want %q", out, want)
		}
	})

	t.Run("web UI serves HTML", func(t *testing.T) {
		resp, err := http.Get(s.UIURL() + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("GET %s/: %s, Content-Type %q", s.UIURL(), resp.Status, resp.Header.Get("Content-Type"))
		}
		if !strings.Contains(strings.ToLower(string(body)), "<html") {
			t.Errorf("GET %s/ did not return an HTML page: %.200s", s.UIURL(), body)
		}
	})

	t.Run("second server on the same data directory is refused", func(t *testing.T) {
		_, err := devtemporal.Start(ctxFor(t), devtemporal.Options{DataDir: dir, DisableUI: true})
		if !errors.Is(err, devtemporal.ErrDataDirInUse) {
			t.Errorf("second Start on %s: %v, want ErrDataDirInUse", dir, err)
		}
	})

	frontendPort, uiPort := portOf(t, s.FrontendAddress()), portOf(t, s.UIURL())
	c.Close()
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, p := range []int{frontendPort, uiPort} {
		if !portFree(p) {
			t.Errorf("port %d still taken after Stop", p)
		}
	}

	t.Run("restart keeps workflows", func(t *testing.T) {
		again := start(t, devtemporal.Options{DataDir: dir, FrontendPort: frontendPort, UIPort: uiPort})
		c := dial(t, again)
		ctx := ctxFor(t)
		desc, err := c.DescribeWorkflowExecution(ctx, "greet-1", "")
		if err != nil {
			t.Fatalf("describe greet-1 after restart: %v", err)
		}
		if st := desc.GetWorkflowExecutionInfo().GetStatus(); st != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
			t.Errorf("greet-1 after restart: status %s, want COMPLETED", st)
		}
		list, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: `McpsyncSource = "demo"`})
		if err != nil {
			t.Fatalf("list by search attribute: %v", err)
		}
		var ids []string
		for _, e := range list.GetExecutions() {
			ids = append(ids, e.GetExecution().GetWorkflowId())
		}
		if diff := cmp.Diff([]string{"greet-1"}, ids); diff != "" {
			t.Errorf("workflows with McpsyncSource=demo after restart (-want +got):\n%s", diff)
		}
	})
}

func TestPortInUse(t *testing.T) {
	tests := []struct {
		service string
		opts    func(port int) devtemporal.Options
	}{
		{"frontend", func(port int) devtemporal.Options { return devtemporal.Options{FrontendPort: port} }},
		{"ui", func(port int) devtemporal.Options { return devtemporal.Options{UIPort: port} }},
	}
	for _, tt := range tests {
		t.Run(tt.service, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			port := l.Addr().(*net.TCPAddr).Port
			opts := tt.opts(port)
			opts.DataDir = t.TempDir()
			s, err := devtemporal.Start(ctxFor(t), opts)
			if err == nil {
				s.Stop()
				t.Fatalf("Start with %s port %d taken succeeded", tt.service, port)
			}
			var pe *devtemporal.PortInUseError
			if !errors.As(err, &pe) || pe.Service != tt.service || pe.Port != port {
				t.Fatalf("Start error = %v, want *PortInUseError{Service: %s, Port: %d}", err, tt.service, port)
			}
			// Nothing may be left holding the data directory.
			again := start(t, devtemporal.Options{DataDir: opts.DataDir, DisableUI: true})
			again.Stop()
		})
	}
}

// A namespace created before the project had all its search attributes gets the missing ones
// at the next start.
func TestRestartRegistersMissingSearchAttributes(t *testing.T) {
	dir := t.TempDir()
	old := start(t, devtemporal.Options{
		DataDir:          dir,
		DisableUI:        true,
		SearchAttributes: map[string]enumspb.IndexedValueType{"McpsyncSource": enumspb.INDEXED_VALUE_TYPE_KEYWORD},
	})
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}

	s := start(t, devtemporal.Options{DataDir: dir, DisableUI: true})
	resp, err := dial(t, s).OperatorService().ListSearchAttributes(ctxFor(t), &operatorservice.ListSearchAttributesRequest{Namespace: s.Namespace()})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]enumspb.IndexedValueType{}
	for name, typ := range resp.GetCustomAttributes() {
		if strings.HasPrefix(name, "Mcpsync") {
			got[name] = typ
		}
	}
	if diff := cmp.Diff(devtemporal.SearchAttributes(), got); diff != "" {
		t.Errorf("custom search attributes after restart (-want +got):\n%s", diff)
	}
}
