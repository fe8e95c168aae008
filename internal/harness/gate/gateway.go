package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

func init() {
	sections = append(sections, section{"gateway", gatewayRevocation})
}

// gatewayRevocationsMax caps the principals of the gateway section: each holds a live MCP
// session to the gateway through the whole section.
const gatewayRevocationsMax = 200

// gatewayPollEvery is how often a principal's agent re-reads its resource while its
// revocation runs.
const gatewayPollEvery = 2 * time.Millisecond

// gatewayRevocation measures R29 through the MCP gateway (issue 15 item 4): min(Revocations,
// 200) principals, each with a bearer token, a subscription and a live go-sdk client session
// to a real gateway (alternately 2025-11-25 and 2026-07-28), are revoked revokeParallel at a
// time with `mcpsync revoke P SOURCE` while their agent re-reads its resource every
// gatewayPollEvery. The latency runs from the revoke command's start to the first read the
// gateway refuses (revoked / no grant); a read after the command returned that still
// succeeds is a violation.
func gatewayRevocation(ctx context.Context, g *run) ([]Row, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := max(1, min(g.opts.Revocations, gatewayRevocationsMax))
	srv, uriOf, err := g.chaosSource(ctx, "gwrev", 0)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		srv.Set(uriOf(i), "content of "+uriOf(i), "text/plain")
	}
	principal := func(k int) string { return fmt.Sprintf("gw-principal-%04d", k) }
	if err := parallel(ctx, n, func(k int) error {
		if _, err := g.stack.MustCLI(ctx, "grant", principal(k), "gwrev"); err != nil {
			return err
		}
		_, err := g.stack.MustCLI(ctx, "subscribe", "gwrev", uriOf(k), "--principal", principal(k), "--wait", "0")
		return err
	}); err != nil {
		return nil, err
	}
	if err := g.waitActive(ctx, "gwrev", n); err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Options{Addr: "127.0.0.1:0", Store: g.stack.Store, Temporal: g.stack.Client,
		Namespace: g.stack.Namespace, Logger: g.opts.Logger.Named("gateway")})
	if err != nil {
		return nil, err
	}
	if err := gw.Start(ctx); err != nil {
		return nil, err
	}
	defer gw.Close()
	eras := []string{"2025-11-25", "2026-07-28"}
	sessions := make([]*mcp.ClientSession, n)
	defer func() {
		for _, cs := range sessions {
			if cs != nil {
				cs.Close()
			}
		}
	}()
	if err := parallel(ctx, n, func(k int) error {
		_, token, err := g.stack.Store.CreateToken(ctx, principal(k), 0)
		if err != nil {
			return err
		}
		cs, err := gatewayClient(ctx, gw.URL(), token, eras[k%2])
		if err != nil {
			return fmt.Errorf("%s: connect: %w", principal(k), err)
		}
		sessions[k] = cs
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: gatewayURIOf(uriOf(k))}); err != nil {
			return fmt.Errorf("%s: read before the revocation: %w", principal(k), err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	g.progress("gateway: %d principals connected to %s, each read its resource", n, gw.URL())

	lat := make([]time.Duration, n)
	var mu sync.Mutex
	servedAfter, otherErrors := 0, 0
	err = parallel(ctx, n, func(k int) error {
		cs, uri := sessions[k], gatewayURIOf(uriOf(k))
		start := time.Now()
		denied := make(chan time.Duration, 1)
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			for pctx.Err() == nil {
				_, err := cs.ReadResource(pctx, &mcp.ReadResourceParams{URI: uri})
				if err != nil && refusedForGrant(err) {
					denied <- time.Since(start)
					return
				}
				if err != nil && pctx.Err() == nil {
					mu.Lock()
					otherErrors++
					mu.Unlock()
				}
				select {
				case <-pctx.Done():
				case <-time.After(gatewayPollEvery):
				}
			}
		}()
		if _, err := g.stack.MustCLI(ctx, "revoke", principal(k), "gwrev", "--wait", "0"); err != nil {
			return err
		}
		// The revocation has committed: no read may be served from here on.
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil || !refusedForGrant(err) {
			mu.Lock()
			servedAfter++
			mu.Unlock()
		}
		select {
		case d := <-denied:
			lat[k] = d
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("%s: the gateway still serves its reads 2 minutes after the revocation", principal(k))
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(lat)
	p99 := lat[min(len(lat)-1, len(lat)*99/100)] // as the revocation section takes it
	detail := fmt.Sprintf("%d revocations (%d at a time) of principals with a live gateway session (both eras), reads every %s; "+
		"p50 %s, p99 %s, max %s; %d other read errors", n, revokeParallel, gatewayPollEvery,
		lat[len(lat)/2].Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), otherErrors)
	return []Row{
		{Requirement: "R29", Metric: "gateway: revoke → gateway denies, p99", Threshold: "< 30 s",
			Measured: p99.Round(time.Millisecond).String(), Value: p99.Seconds(), Pass: p99 < 30*time.Second, Detail: detail},
		zero("R29", "gateway: reads served after the revoke command returned", servedAfter, ""),
	}, nil
}

// gatewayURIOf is the gateway URI of an upstream resource of source gwrev.
func gatewayURIOf(upstream string) string {
	return gateway.URI{Source: "gwrev", Upstream: upstream}.String()
}

// refusedForGrant reports whether err is the gateway's refusal of a read for a revoked or
// missing grant.
func refusedForGrant(err error) bool {
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		return false
	}
	var d gateway.ErrorData
	if json.Unmarshal(je.Data, &d) != nil {
		return false
	}
	return d.Reason == gateway.ReasonRevoked || d.Reason == gateway.ReasonNoGrant
}

// gatewayClient connects a go-sdk client to the gateway at url with a bearer token, in era.
func gatewayClient(ctx context.Context, url, token, era string) (*mcp.ClientSession, error) {
	tr := &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: 1,
		HTTPClient: &http.Client{Transport: bearer{token: token, base: http.DefaultTransport}}}
	var so *mcp.ClientSessionOptions
	if era == "2025-11-25" {
		so = &mcp.ClientSessionOptions{ProtocolVersion: era}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return mcp.NewClient(&mcp.Implementation{Name: "mcpsync-gate", Version: "1"}, nil).Connect(cctx, tr, so)
}

// bearer adds "Authorization: Bearer TOKEN" to every request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
