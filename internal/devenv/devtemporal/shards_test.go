package devtemporal_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
)

// connectionsTo counts this process's open TCP connections whose remote end is port on
// 127.0.0.1: its sockets (/proc/self/fd) matched against the kernel's table
// (/proc/self/net/tcp). Both ends of a connection inside the process are in the table; only
// the end that dialled port has it as the remote port.
func connectionsTo(t *testing.T, port int) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	f, err := os.Open("/proc/self/net/tcp")
	if err != nil {
		t.Skipf("no /proc/self/net/tcp: %v", err)
	}
	defer f.Close()
	remote := fmt.Sprintf("0100007F:%04X", port) // 127.0.0.1:port, as the kernel prints it
	const listening = "0A"
	n := 0
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[2] == remote && fields[3] != listening && inodes[fields[9]] {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every search-attribute call on the operator service used to make the server dial its own
// frontend once more and never close the connection (one per subscription start, since the
// launch path lists the search attributes first: 5,795 self-connections at 10,000
// subscriptions, and the process ran out of file descriptors). Now the server's connections to
// itself stay as many however many calls it serves.
func TestSearchAttributeCallsDoNotLeakConnections(t *testing.T) {
	const calls = 40
	// Registering an existing attribute is logged as a warning per attribute.
	s := start(t, devtemporal.Options{DataDir: t.TempDir(), DisableUI: true, ServerLogLevel: zapcore.ErrorLevel})
	c := dial(t, s)
	port := portOf(t, s.FrontendAddress())
	tests := []struct {
		name string
		call func(ctx context.Context, op operatorservice.OperatorServiceClient) error
	}{
		{"ListSearchAttributes", func(ctx context.Context, op operatorservice.OperatorServiceClient) error {
			_, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.Namespace()})
			return err
		}},
		{"AddSearchAttributes of registered ones", func(ctx context.Context, op operatorservice.OperatorServiceClient) error {
			_, err := op.AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
				Namespace: s.Namespace(), SearchAttributes: devtemporal.SearchAttributes(),
			})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := ctxFor(t)
			op := c.OperatorService()
			if err := tt.call(ctx, op); err != nil { // connections made once are not a leak
				t.Fatal(err)
			}
			before := connectionsTo(t, port)
			for i := range calls {
				if err := tt.call(ctx, op); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			// A slack of a few for a reconnect; a leak adds one per call.
			if after := connectionsTo(t, port); after > before+3 {
				t.Errorf("connections to the frontend port %d: %d before %d calls, %d after", port, before, calls, after)
			}
		})
	}
}

// The history shard count is fixed when the persistence is created: a data directory or
// database created with another count (1, what every earlier version created) keeps running
// with it, with one log line saying so; a new one gets Options.HistoryShards or the default.
func TestHistoryShardsKeptFromExistingPersistence(t *testing.T) {
	tests := []struct {
		name        string
		persistence devtemporal.Persistence
		createdWith int32 // 0: no earlier server
		restartWith int32 // Options.HistoryShards at the second start
		want        int32
		wantLog     bool
	}{
		{"new SQLite file gets the default", devtemporal.PersistenceSQLite, 0, 0, devtemporal.DefaultHistoryShards(devtemporal.PersistenceSQLite), false},
		{"new SQLite file gets the option", devtemporal.PersistenceSQLite, 0, 2, 2, false},
		{"new PostgreSQL database gets its default", devtemporal.PersistencePostgres, 0, 0, devtemporal.DefaultHistoryShards(devtemporal.PersistencePostgres), false},
		{"1-shard SQLite file keeps 1 shard", devtemporal.PersistenceSQLite, 1, 4, 1, true},
		{"1-shard PostgreSQL database keeps 1 shard", devtemporal.PersistencePostgres, 1, 0, 1, true},
		{"same count logs nothing", devtemporal.PersistenceSQLite, 2, 2, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var pg *devtemporal.Postgres
			if tt.persistence == devtemporal.PersistencePostgres {
				pg = freshPostgres(t)
			}
			opts := func(shards int32, log *zap.Logger) devtemporal.Options {
				return devtemporal.Options{DataDir: dir, DisableUI: true, Persistence: tt.persistence, Postgres: pg, HistoryShards: shards, Logger: log}
			}
			if tt.createdWith != 0 {
				old := start(t, opts(tt.createdWith, nil))
				c := dial(t, old)
				w := startGreeter(t, c)
				run, err := c.ExecuteWorkflow(ctxFor(t), client.StartWorkflowOptions{ID: "before-restart", TaskQueue: taskQueue}, Greet, "shard")
				if err != nil {
					t.Fatal(err)
				}
				if err := run.Get(ctxFor(t), nil); err != nil {
					t.Fatalf("workflow before restart: %v", err)
				}
				w.Stop()
				c.Close()
				if err := old.Stop(); err != nil {
					t.Fatal(err)
				}
			}

			core, logs := observer.New(zapcore.InfoLevel)
			s := start(t, opts(tt.restartWith, zap.New(zapcore.NewTee(core, warnLogger().Core()))))
			if got := s.HistoryShards(); got != tt.want {
				t.Errorf("HistoryShards() = %d, want %d", got, tt.want)
			}
			var mismatch []string
			for _, e := range logs.All() {
				if strings.Contains(e.Message, "history shard count") {
					mismatch = append(mismatch, fmt.Sprintf("%s historyShards=%v", e.Message, e.ContextMap()["historyShards"]))
				}
			}
			if tt.wantLog && len(mismatch) != 1 {
				t.Errorf("log lines about the stored shard count: %q, want exactly one", mismatch)
			}
			if !tt.wantLog && len(mismatch) != 0 {
				t.Errorf("log lines about the stored shard count: %q, want none", mismatch)
			}

			// Every workflow is found on its shard, and new ones run.
			c := dial(t, s)
			w := startGreeter(t, c)
			defer w.Stop()
			ctx := ctxFor(t)
			if tt.createdWith != 0 {
				desc, err := c.DescribeWorkflowExecution(ctx, "before-restart", "")
				if err != nil {
					t.Fatalf("describe the workflow from before the restart: %v", err)
				}
				if diff := cmp.Diff(enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus()); diff != "" {
					t.Errorf("status of the workflow from before the restart (-want +got):\n%s", diff)
				}
			}
			for i := range 8 { // IDs spread over the shards
				run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: fmt.Sprintf("after-restart-%d", i), TaskQueue: taskQueue}, Greet, "shard")
				if err != nil {
					t.Fatal(err)
				}
				var out string
				if err := run.Get(ctx, &out); err != nil {
					t.Fatalf("workflow %d after restart: %v", i, err)
				}
				if want := "hello shard from " + taskQueue; out != want {
					t.Errorf("workflow %d result %q, want %q", i, out, want)
				}
			}
		})
	}
}
