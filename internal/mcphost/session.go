package mcphost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// configError is a failure to build a source's transport from its definition (a missing
// environment variable or file, an unknown transport): retrying soon will not fix it, so the
// source's health is FAILED rather than BACKOFF (issue 14, item 2).
// An *EraError (a pinned revision the server does not speak) is one too.
type configError struct{ err error }

func (e *configError) Error() string {
	if _, ok := errors.AsType[*EraError](e.err); ok {
		return "protocol: " + e.err.Error()
	}
	return "transport: " + e.err.Error()
}
func (e *configError) Unwrap() error { return e.err }

// session runs one connection from connect to end: it connects, records the new generation
// and its capability receipt, reports the source LIVE, tells every live subscription of the
// source that the session changed, routes notifications until the connection ends, and
// records the end. It returns the end reason of a session that opened (redacted; empty when
// none opened) and, as the error, what kept it from opening (a *configError when the
// transport could not be built) or the *AuthError with which the server ended it.
func (h *Host) session(ctx context.Context, src ledger.Source, log *zap.Logger, rep *healthReporter) (string, error) {
	c := &Conn{source: src, host: h, wake: make(chan struct{}, 1), uris: map[string]*uriSubscription{},
		slots: make(chan struct{}, updatesInFlight)}
	client := mcp.NewClient(&mcp.Implementation{Name: "mcpsync", Version: "0.1.0"}, &mcp.ClientOptions{
		Capabilities:               &mcp.ClientCapabilities{},
		ResourceUpdatedHandler:     c.onUpdated,
		ResourceListChangedHandler: c.onListChanged,
		KeepAlive:                  h.opts.KeepAlive,
		KeepAliveFailureThreshold:  2,
	})
	GuardClient(client, Guard{Audit: c.auditProtocol})
	client.AddSendingMiddleware(c.stampReads)
	listen := c.newListenSet(log)
	listen.Install(client)
	defer listen.Close()
	// The handshake is not abandoned when ctx ends (the source is shed, or the host stops): a
	// server that accepted initialize holds a session whose ID the client learns only from the
	// reply, so an abandoned handshake would leave a session nobody can end, and the next
	// holder's session would overlap it on the server (issue 12, defect 6). It runs to its
	// end, bounded by ConnectTimeout, and a session that opens after ctx ended is closed before
	// maintain releases the lease.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.ConnectTimeout)
	var built bool
	cs, tr, err := Connect(cctx, client, src.Connection.Protocol, func() (mcp.Transport, error) {
		tr, err := h.opts.Transport(ctx, src)
		if err != nil {
			return nil, &configError{err}
		}
		built = true
		return tapListen(listen, tr), nil
	})
	cancel()
	if err != nil {
		if !built {
			return "", err // a *configError: the transport could not be built
		}
		if ee, ok := errors.AsType[*EraError](err); ok {
			// The server does not speak the pinned revision: FAILED, with the reason.
			return "", &configError{ee}
		}
		return "", withAuthFailure(tr, fmt.Errorf("connect: %w", err))
	}
	if ctx.Err() != nil {
		_ = cs.Close()
		return "", context.Cause(ctx)
	}
	c.cs = cs
	c.caps = receipt(cs)
	if IsModern(c.caps.ProtocolVersion) {
		listen.Bind(cs)
		c.listen = listen
	}
	if !c.caps.Resources {
		log.Warn("server does not declare the resources capability", zap.String("server", c.caps.ServerName))
	}
	sess, live, err := h.opts.Store.OpenSession(ctx, src.ID, h.opts.Queue, c.caps)
	if err != nil {
		_ = cs.Close()
		return "", fmt.Errorf("open session: %w", err)
	}
	c.gen = sess.Generation
	rep.report(ledger.HealthReport{State: ledger.HealthLive, At: time.Now()})
	log = log.With(zap.Int64("generation", c.gen))
	log.Info("session open", zap.String("protocol", c.caps.ProtocolVersion),
		zap.Bool("subscribe", c.caps.Subscribe), zap.Bool("listChanged", c.caps.ListChanged),
		zap.String("server", c.caps.ServerName+" "+c.caps.ServerVersion))
	h.setConn(src.ID, c)
	h.startSourceEvents(ctx, c)
	routed := make(chan struct{})
	stopRouting := make(chan struct{})
	go func() {
		defer close(routed)
		c.route(stopRouting, log)
	}()
	// Signalled in the background, so that a slow Temporal never delays noticing the end.
	h.wg.Go(func() { h.paceSessionChanged(ctx, c.gen, live, log) }) // storm.go: in a moving window
	done := make(chan error, 1)
	go func() { done <- cs.Wait() }()
	if IsModern(c.caps.ProtocolVersion) {
		stopKeepAlive := make(chan struct{})
		defer close(stopKeepAlive)
		go keepModernAlive(cs, h.opts.KeepAlive, src.Transport == ledger.TransportHTTP, stopKeepAlive, log)
	}
	reason := "connection closed"
	var waitErr error
	select {
	case <-ctx.Done():
		reason = "host stopping"
		if cause := context.Cause(ctx); cause != nil && cause != context.Canceled {
			reason = ledger.HealthErrorText(cause.Error())
		}
		_ = cs.Close()
		<-done
	case err := <-done:
		waitErr = err
		if err != nil {
			reason = "connection closed: " + ledger.HealthErrorText(err.Error())
		}
		// Release the transport: reaps a dead stdio child, ends the keep-alive.
		_ = cs.Close()
	}
	h.clearConn(src.ID, c)
	h.stopSourceEvents(c)
	// Route what arrived before the end under this generation, then record the end.
	close(stopRouting)
	<-routed
	ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer ecancel()
	if err := h.opts.Store.EndSession(ectx, src.ID, c.gen, reason); err != nil {
		log.Warn("recording session end failed", zap.Error(err))
	}
	if ctx.Err() == nil {
		// A session the server ended by refusing the credentials (an expired token on the
		// event stream or a keep-alive ping) is an authentication failure, not an end.
		if ae := AuthFailure(tr, waitErr); ae != nil {
			return reason, fmt.Errorf("session ended: %w", ae)
		}
	}
	return reason, nil
}

// withAuthFailure returns err, wrapping the *AuthError that AuthFailure finds for the
// transport when err's chain does not hold it already (the go-sdk does not pass every 401 on
// as an error chain), so that maintain classifies it as AUTH_FAILED.
func withAuthFailure(tr mcp.Transport, err error) error {
	ae := AuthFailure(tr, err)
	if ae == nil {
		return err
	}
	if _, ok := errors.AsType[*AuthError](err); ok {
		return err
	}
	return fmt.Errorf("%w (%w)", err, ae)
}

// signalParallelism bounds the concurrent SessionChanged signals of one new session.
const signalParallelism = 8

// signalSessionChanged tells every live subscription of the source that its session changed
// to generation gen (R12). A signal that cannot be delivered is retried a few times; the
// subscription is fenced in the ledger anyway, so its next read is refused and it
// re-establishes itself.
func (h *Host) signalSessionChanged(ctx context.Context, gen int64, live []ledger.LiveSubscription, log *zap.Logger) {
	h.signalChanged(ctx, contract.SessionChanged{Generation: gen}, live, log)
}

// signalChanged sends sc to every subscription of live (signalSessionChanged; a listen epoch).
func (h *Host) signalChanged(ctx context.Context, sc contract.SessionChanged, live []ledger.LiveSubscription, log *zap.Logger) {
	work := make(chan ledger.LiveSubscription)
	var wg sync.WaitGroup
	for range min(signalParallelism, len(live)) {
		wg.Go(func() {
			for sub := range work {
				err := retry(ctx, func(ctx context.Context) error {
					return h.opts.Signaler.SignalWorkflow(ctx, sub.WorkflowID, "", contract.SignalSessionChanged, sc)
				})
				if err != nil {
					log.Warn("session-changed signal not delivered", zap.String("workflow", sub.WorkflowID), zap.Error(err))
				}
			}
		})
	}
	for _, sub := range live {
		work <- sub
	}
	close(work)
	wg.Wait()
}

// retry runs f up to three times with a short backoff, each attempt bounded by 10 s.
func retry(ctx context.Context, f func(context.Context) error) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (after %d attempts; last error: %w)", ctx.Err(), attempt, err)
			case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
			}
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f(actx)
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

// receipt is the capability receipt of a connected session (R1, R9): the revision it
// negotiated (its era) and the capabilities the host can use on it (on a 2026-07-28 session
// Subscribe means subscriptions/listen carries resource subscriptions; which URIs a stream
// honours is per URI, recorded by Activate). Raw keeps the capabilities exactly as the server
// declared them.
func receipt(cs *mcp.ClientSession) ledger.CapabilityReceipt {
	r := ledger.CapabilityReceipt{ProtocolVersion: ProtocolVersion}
	ir := cs.InitializeResult()
	if ir == nil {
		return r
	}
	r.ProtocolVersion = ir.ProtocolVersion
	if ir.ServerInfo != nil {
		r.ServerName, r.ServerVersion = ir.ServerInfo.Name, ir.ServerInfo.Version
	}
	if caps := ir.Capabilities; caps != nil {
		if caps.Resources != nil {
			r.Resources, r.Subscribe, r.ListChanged = true, caps.Resources.Subscribe, caps.Resources.ListChanged
		}
		_, r.SnapshotIDs = caps.Experimental[SnapshotCapability]
		r.Raw, _ = json.Marshal(caps)
	}
	return r
}
