package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
)

// checkControlAddr refuses a --control address that is not on the loopback interface: the
// endpoint changes resources for anyone who reaches it and has no authentication.
func checkControlAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--control %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--control %q: the control endpoint has no authentication and binds only a loopback address (127.0.0.1, ::1, localhost)", addr)
	}
	return nil
}

// controlHandler changes the server's resources on request: POST /resources with the form
// fields uri and text (and mime, text/plain when absent) sets that resource's content, adding
// the resource when it is new, and announces the change to subscribed sessions as a tick's
// change is announced. It answers 204 once the change is made.
func controlHandler(s *chaosmcp.Server) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /resources", func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
			return
		}
		uri, text := r.PostForm.Get("uri"), r.PostForm.Get("text")
		if uri == "" || !r.PostForm.Has("text") {
			http.Error(w, "the form fields uri and text are required", http.StatusBadRequest)
			return
		}
		mime := r.PostForm.Get("mime")
		if mime == "" {
			mime = "text/plain"
		}
		s.Set(uri, text, mime)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// serveControl serves controlHandler on addr until ctx ends, and writes its URL (e.g.
// http://127.0.0.1:41234) to file, when one is named, once it listens: written whole to a
// temporary file and renamed, so that a reader never sees a partial URL.
func serveControl(ctx context.Context, s *chaosmcp.Server, addr, file string, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("control endpoint: %w", err)
	}
	url := "http://" + ln.Addr().String()
	if file != "" {
		tmp := filepath.Join(filepath.Dir(file), "."+filepath.Base(file)+".tmp")
		if err := os.WriteFile(tmp, []byte(url+"\n"), 0o600); err != nil {
			ln.Close()
			return fmt.Errorf("--control-file: %w", err)
		}
		if err := os.Rename(tmp, file); err != nil {
			ln.Close()
			return fmt.Errorf("--control-file: %w", err)
		}
	}
	srv := &http.Server{Handler: controlHandler(s), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("control endpoint listening", "url", url)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("control endpoint failed", "error", err)
		}
	}()
	return nil
}
