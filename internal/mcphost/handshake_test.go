package mcphost_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// heldInitialize serves next but holds each initialize reply, already handled by the server,
// until release is closed: a server that accepted the session and has not answered yet.
type heldInitialize struct {
	next      http.Handler
	accepted  chan struct{} // closed when the first initialize was handled
	abandoned chan struct{} // closed when the client gave up on a held reply
	release   chan struct{}
}

func (h *heldInitialize) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if r.Method != http.MethodPost || !strings.Contains(string(body), `"method":"initialize"`) {
		h.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	h.next.ServeHTTP(rec, r)
	closeChan(h.accepted)
	select {
	case <-h.release:
	case <-r.Context().Done():
		closeChan(h.abandoned)
		<-h.release
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// Issue 12 defect 6, found by the scale-out test under load: a host that stopped maintaining
// a source (shed to another host, or stopping) while its initialize was in flight abandoned
// the handshake. The server had accepted the session, but its ID arrives only with the reply,
// so the host could not end it, released the lease, and the next holder's session overlapped
// the orphan on the server. Now the handshake runs to its end (bounded by ConnectTimeout) and
// the session is closed before the lease is released: when Run returns, the server holds no
// session of the source.
func TestStopDuringHandshakeClosesTheSessionBeforeRelease(t *testing.T) {
	f := newFixture(t)
	srv := chaosmcp.New(chaosmcp.Options{Name: "held-initialize"})
	t.Cleanup(func() { srv.Close() })
	held := &heldInitialize{next: srv.HTTPHandler(), accepted: make(chan struct{}),
		abandoned: make(chan struct{}), release: make(chan struct{})}
	hs := httptest.NewServer(held)
	t.Cleanup(hs.Close)
	t.Cleanup(func() { closeChan(held.release) })
	src := f.addSource(ledger.SourceSpec{Name: "held", Transport: ledger.TransportHTTP, URL: hs.URL})

	h := mcphost.New(mcphost.Options{
		Store: f.store, Signaler: newRecorder(), Queue: "host-held", Lease: 5 * time.Second,
		ClaimInterval: 50 * time.Millisecond, ConnectTimeout: 20 * time.Second,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()

	select {
	case <-held.accepted:
	case <-time.After(20 * time.Second):
		t.Fatal("the host never sent initialize")
	}
	if n := srv.Stats().LiveSessions; n != 1 {
		t.Fatalf("server sessions after initialize was handled: %d, want 1", n)
	}
	cancel() // the host stops while its handshake waits for the reply
	// A host that abandons the handshake cancels the request at once; one that does not never
	// does, so its reply is released after a bound.
	select {
	case <-held.abandoned:
	case <-time.After(500 * time.Millisecond):
	}
	closeChan(held.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the host did not stop")
	}
	if n := srv.Stats().LiveSessions; n != 0 {
		t.Errorf("server sessions after the host stopped and released the lease: %d, want 0 (an orphan the next holder would overlap)", n)
	}
	cur, err := f.store.SourceByID(f.ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.HostQueue != "" {
		t.Errorf("lease holder after stop: %q, want released", cur.HostQueue)
	}
}

// closeChan closes ch unless it is closed already (one goroutine at a time).
func closeChan(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}
