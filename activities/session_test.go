package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func uriData(u string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"uri": u})
	return b
}

// Errors are classified by JSON-RPC code: the three not-found dialects, request errors a
// retry cannot fix, server errors worth retrying, and a connection that ended.
func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want activities.ErrorClass
	}{
		{"-32002 resource not found", &jsonrpc.Error{Code: -32002, Message: "Resource not found"}, activities.ClassNotFound},
		{"-32602 with data.uri", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Resource not found", Data: uriData("demo://x")}, activities.ClassNotFound},
		{"-32602 with a not found message", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Resource demo://x Not Found"}, activities.ClassNotFound},
		{"wrapped -32002", fmt.Errorf("calling: %w", &jsonrpc.Error{Code: -32002}), activities.ClassNotFound},
		{"-32602 other", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor"}, activities.ClassPermanent},
		{"-32602 with data without uri", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "bad", Data: json.RawMessage(`{"field":"x"}`)}, activities.ClassPermanent},
		{"-32601 method not found", &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "no subscriptions"}, activities.ClassPermanent},
		{"-32600 invalid request", &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest}, activities.ClassPermanent},
		{"-32700 parse error", &jsonrpc.Error{Code: jsonrpc.CodeParseError}, activities.ClassPermanent},
		{"-32603 internal error", &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: chaosmcp.TransientMessage}, activities.ClassTransient},
		{"-32000 server error", &jsonrpc.Error{Code: -32000, Message: "busy"}, activities.ClassTransient},
		{"-32001 request timeout", &jsonrpc.Error{Code: -32001, Message: "Request timed out"}, activities.ClassTransient},
		{"connection closed", fmt.Errorf("%w: calling \"resources/read\": client is closing", mcp.ErrConnectionClosed), activities.ClassSessionEnded},
		{"http session missing", fmt.Errorf("GET: %w", mcp.ErrSessionMissing), activities.ClassSessionEnded},
		{"deadline", context.DeadlineExceeded, activities.ClassTransient},
		{"transport failure", errors.New("dial tcp 127.0.0.1:1: connection refused"), activities.ClassTransient},
	}
	for _, tt := range tests {
		if got := activities.Classify(tt.err); got != tt.want {
			t.Errorf("%s: Classify(%v) = %s, want %s", tt.name, tt.err, got, tt.want)
		}
		if got, want := activities.IsNotFound(tt.err), tt.want == activities.ClassNotFound; got != want {
			t.Errorf("%s: IsNotFound = %v, want %v", tt.name, got, want)
		}
	}
}

// outcome is what a session-bound activity call came to, as the workflow sees it.
type outcome struct {
	Found        bool
	Digest       string
	ErrType      string // "" for no error; the application error type, or "retryable"
	NonRetryable bool
}

func outcomeOf(out contract.ReadOutput, err error) outcome {
	o := outcome{Found: out.Found, Digest: out.Digest}
	if err == nil {
		return o
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		o.ErrType, o.NonRetryable = appErr.Type(), appErr.NonRetryable()
	} else {
		o.ErrType = "retryable"
	}
	return o
}

// The session-bound activities against a live session: a read stores the body and returns
// its digest; not-found in each server dialect is Found=false, not an error; a transient
// server error is retried; a call with an old session generation fails non-retryably with
// StaleSession; a subscribe the server refuses for good is PermanentMCPError.
func TestSessionActivities(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	srv := chaosmcp.New(chaosmcp.Options{})
	t.Cleanup(func() { srv.Close() })
	srv.Set("demo://notes/1", "hello\n", "text/plain")
	hs, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	noSub := chaosmcp.New(chaosmcp.Options{Capabilities: &chaosmcp.Capabilities{}})
	t.Cleanup(func() { noSub.Close() })
	hs2, err := noSub.StartHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs2.Close() })
	src, _, err := store.AddSource(ctx, ledger.SourceSpec{Name: "chaos", Transport: ledger.TransportHTTP, URL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	src2, _, err := store.AddSource(ctx, ledger.SourceSpec{Name: "nosub", Transport: ledger.TransportHTTP, URL: hs2.URL})
	if err != nil {
		t.Fatal(err)
	}
	h := runHost(ctx, t, store, "host-a", zap.WarnLevel)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	c, err := h.WaitSession(wctx, src.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := h.WaitSession(wctx, src2.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	gen := c.Generation()
	a := &activities.Session{Host: h, Store: store}

	read := func(u string, g int64) func() outcome {
		return func() outcome {
			return outcomeOf(a.MCPRead(ctx, contract.ReadInput{SourceID: src.ID, SessionGeneration: g, ServerURI: u, Ordinal: 1, RequestID: "r"}))
		}
	}
	withStyle := func(style chaosmcp.NotFoundStyle, f func() outcome) func() outcome {
		return func() outcome {
			srv.SetNotFoundStyle(style)
			defer srv.SetNotFoundStyle(chaosmcp.NotFoundMCP)
			return f()
		}
	}
	tests := []struct {
		name string
		call func() outcome
		want outcome
	}{
		{"read", read("demo://notes/1", gen), outcome{Found: true, Digest: ledger.Digest([]byte("hello\n"))}},
		{"not found -32002", withStyle(chaosmcp.NotFoundMCP, read("demo://notes/404", gen)), outcome{}},
		{"not found -32602 data.uri", withStyle(chaosmcp.NotFoundInvalidParams, read("demo://notes/404", gen)), outcome{}},
		{"not found -32602 message", withStyle(chaosmcp.NotFoundMessage, read("demo://notes/404", gen)), outcome{}},
		{"transient -32603", func() outcome {
			defer srv.AddReadFault(chaosmcp.ReadFault{URI: "demo://notes/1", Fail: chaosmcp.ReadTransient})()
			return read("demo://notes/1", gen)()
		}, outcome{ErrType: "retryable"}},
		{"read on an old generation", read("demo://notes/1", gen-1), outcome{ErrType: contract.ErrTypeStaleSession, NonRetryable: true}},
		{"read on a future generation", read("demo://notes/1", gen+1), outcome{ErrType: contract.ErrTypeStaleSession, NonRetryable: true}},
		{"subscribe on an old generation", func() outcome {
			_, err := a.MCPSubscribe(ctx, contract.SessionCall{SourceID: src.ID, SessionGeneration: gen - 1, ServerURI: "demo://notes/1", SubscriptionID: 1})
			return outcomeOf(contract.ReadOutput{}, err)
		}, outcome{ErrType: contract.ErrTypeStaleSession, NonRetryable: true}},
		{"unsubscribe on an old generation", func() outcome {
			_, err := a.MCPUnsubscribe(ctx, contract.SessionCall{SourceID: src.ID, SessionGeneration: gen - 1, ServerURI: "demo://notes/1", SubscriptionID: 1})
			return outcomeOf(contract.ReadOutput{}, err)
		}, outcome{ErrType: contract.ErrTypeStaleSession, NonRetryable: true}},
		{"subscribe refused: no resources.subscribe", func() outcome {
			_, err := a.MCPSubscribe(ctx, contract.SessionCall{SourceID: src2.ID, SessionGeneration: c2.Generation(), ServerURI: "demo://notes/1", SubscriptionID: 1})
			return outcomeOf(contract.ReadOutput{}, err)
		}, outcome{ErrType: contract.ErrTypePermanent, NonRetryable: true}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.call()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	body, err := store.Blob(ctx, ledger.Digest([]byte("hello\n")))
	if err != nil || string(body) != "hello\n" {
		t.Errorf("stored blob %q, %v", body, err)
	}
	// The transient fault was one read; the reads of unknown URIs reached the server.
	if diff := cmp.Diff(map[string]int{"demo://notes/1": 2, "demo://notes/404": 3}, srv.Stats().Reads, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("server reads (-want +got):\n%s", diff)
	}
}

type nopSignaler struct{}

func (nopSignaler) SignalWorkflow(context.Context, string, string, string, any) error { return nil }

// runHost runs a session host on store with the given queue until the test ends, logging at
// level and above.
func runHost(ctx context.Context, t *testing.T, store *ledger.Store, queue string, level zapcore.Level) *mcphost.Host {
	t.Helper()
	h := mcphost.New(mcphost.Options{Store: store, Signaler: nopSignaler{}, Queue: queue, ClaimInterval: 50 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(level))})
	hctx, hcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Run(hctx)
	}()
	t.Cleanup(func() {
		hcancel()
		<-done
	})
	return h
}
