package chaosmcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ConnectInMemory connects a new go-sdk client (configured by opts, which may be nil) to the
// server over in-memory transports, pinned to [ProtocolVersion], and returns the initialized
// client session. Closing the client session ends the server session.
func (s *Server) ConnectInMemory(ctx context.Context, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	return s.ConnectInMemoryAt(ctx, opts, ProtocolVersion)
}

// Serve runs one session over t until the client ends it, the server ends it (Restart,
// Close) or ctx is done. It returns nil when the session ended normally.
func (s *Server) Serve(ctx context.Context, t mcp.Transport) error {
	ss, err := s.mcp.Connect(ctx, withEmptyCursors(t), nil)
	if err != nil {
		return fmt.Errorf("chaosmcp: connect: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- ss.Wait() }()
	select {
	case err := <-done:
		return ignoreClosed(err)
	case <-ctx.Done():
		s.closeSessions(func(sess *session) bool { return sess.ss == ss })
		_ = ss.Close()
		<-done
		return ctx.Err()
	}
}

// ServeStdio runs one session over the process's stdin and stdout (see [Server.Serve]).
func (s *Server) ServeStdio(ctx context.Context) error {
	return s.Serve(ctx, &mcp.StdioTransport{})
}

func ignoreClosed(err error) error {
	if err == nil || errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// HTTPHandler returns a stateful streamable-HTTP handler serving this server: every client
// gets a session with an Mcp-Session-Id; after [Server.Restart] old session IDs get 404.
func (s *Server) HTTPHandler() http.Handler {
	return s.httpHandler("")
}

func (s *Server) httpHandler(listener string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Logger: s.logger,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(listenerHeader)
		if listener != "" {
			r.Header.Set(listenerHeader, listener)
		}
		h.ServeHTTP(w, r)
		if r.Method == http.MethodDelete {
			// The go-sdk closed the session before it answered the DELETE: it is over now, not
			// when the session's goroutines have wound down, so that a client that closes its
			// session and then lets another connect is never counted twice (MaxLiveByListener).
			s.dropSessionID(r.Header.Get(sessionIDHeader))
		}
	})
}

// HTTPServer is a running streamable-HTTP endpoint started by [Server.StartHTTP].
type HTTPServer struct {
	// URL is the MCP endpoint, e.g. "http://127.0.0.1:41234/mcp".
	URL string
	// Addr is the listening address, host:port.
	Addr string

	srv      *http.Server
	owner    *Server
	listener string
	done     chan error
	once     sync.Once
	closeErr error
}

// StartHTTP serves the server over streamable HTTP at path /mcp on addr ("" means
// 127.0.0.1:0, a free loopback port) and returns once the listener is bound.
func (s *Server) StartHTTP(addr string) (*HTTPServer, error) {
	return s.startHTTP(addr, false)
}

// StartHTTPBothEras is StartHTTP serving both eras at /mcp ([Server.BothErasHandler]).
func (s *Server) StartHTTPBothEras(addr string) (*HTTPServer, error) {
	return s.startHTTP(addr, true)
}

func (s *Server) startHTTP(addr string, bothEras bool) (*HTTPServer, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("chaosmcp: listen on %s: %w", addr, err)
	}
	s.mu.Lock()
	s.listenerSeq++
	id := "listener-" + strconv.Itoa(s.listenerSeq)
	s.mu.Unlock()
	mux := http.NewServeMux()
	if bothEras {
		mux.Handle("/mcp", s.bothErasHandler(id))
	} else {
		mux.Handle("/mcp", s.httpHandler(id))
	}
	hs := &HTTPServer{
		URL:      "http://" + ln.Addr().String() + "/mcp",
		Addr:     ln.Addr().String(),
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		owner:    s,
		listener: id,
		done:     make(chan error, 1),
	}
	go func() { hs.done <- hs.srv.Serve(ln) }()
	return hs, nil
}

// Close kills the endpoint as a crashed server process would: the listener and every
// connection are closed at once and the MCP sessions that arrived through it end. Other
// transports of the same Server are unaffected. It is idempotent.
func (h *HTTPServer) Close() error {
	h.once.Do(func() {
		err := h.srv.Close()
		h.owner.closeSessions(func(sess *session) bool { return sess.listener == h.listener })
		if serveErr := <-h.done; !errors.Is(serveErr, http.ErrServerClosed) {
			err = errors.Join(err, serveErr)
		}
		h.closeErr = err
	})
	return h.closeErr
}
