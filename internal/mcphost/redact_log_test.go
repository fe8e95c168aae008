package mcphost_test

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// lockedBuffer is a log sink safe for the host's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A source stored before URLs with credentials were refused fails to connect; the session
// failure the host logs through the worker's logger (logging.New's core) carries neither the
// URL's userinfo nor its secret query parameter (issue 14 item 3). Two layers keep it so:
// the host masks the error it logs and records, and the core masks every line it writes;
// this test fails only if both give way.
func TestSessionFailureLogRedacted(t *testing.T) {
	f := newFixture(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close() // nothing listens: every connect fails
	const userToken, queryToken = "tok3nuserinfo", "k3yqueryvalue"
	legacy := "http://" + userToken + "@127.0.0.1:" + port + "/mcp?api_key=" + queryToken
	if _, err := f.store.Pool().Exec(f.ctx, `INSERT INTO sources (name, transport, url) VALUES ('legacy', 'http', $1)`, legacy); err != nil {
		t.Fatal(err)
	}
	var sink lockedBuffer
	h := mcphost.New(mcphost.Options{
		Store: f.store, Signaler: newRecorder(), Queue: "host-redact",
		ClaimInterval: 50 * time.Millisecond, Lease: 5 * time.Second,
		Logger: zap.New(logging.NewCore(zapcore.AddSync(&sink), zapcore.DebugLevel)),
	})
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	waitFor(t, 20*time.Second, "a logged session failure naming the server", func() (bool, string) {
		out := sink.String()
		return strings.Contains(out, "127.0.0.1:"+port), out
	})
	out := sink.String()
	for _, secret := range []string{userToken, queryToken} {
		if strings.Contains(out, secret) {
			t.Errorf("the host's log carries %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "***") {
		t.Errorf("no masked URL in the log:\n%s", out)
	}
	// The last error recorded for `source list` / `status` is masked too.
	var lastErr string
	waitFor(t, 20*time.Second, "a recorded last error", func() (bool, string) {
		err := f.store.Pool().QueryRow(f.ctx, `SELECT coalesce(h.last_error, '') FROM source_health h
			JOIN sources s ON s.id = h.source_id WHERE s.name = 'legacy'`).Scan(&lastErr)
		return err == nil && lastErr != "", lastErr
	})
	for _, secret := range []string{userToken, queryToken} {
		if strings.Contains(lastErr, secret) {
			t.Errorf("source_health.last_error carries %q: %s", secret, lastErr)
		}
	}
}
