package devtemporal

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uioptions "github.com/temporalio/ui-server/v2/server/server_options"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	mcconfig "github.com/mcpsync/mcpsync/internal/config"
)

// awaitFrontend waits until the frontend answers and knows the namespace, then registers any
// search attribute the namespace lacks (a namespace created by an older version keeps its
// record, and CreateNamespaces never changes an existing one).
func (s *Server) awaitFrontend(ctx context.Context, want map[string]enumspb.IndexedValueType) error {
	c, err := s.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := retry(ctx, func() error {
		_, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.namespace})
		return err
	}); err != nil {
		return fmt.Errorf("namespace %s never became visible: %w", s.namespace, err)
	}
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.namespace})
	if err != nil {
		return fmt.Errorf("list search attributes: %w", err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for name, typ := range want {
		if got, ok := have.GetCustomAttributes()[name]; !ok {
			missing[name] = typ
		} else if got != typ {
			return fmt.Errorf("search attribute %s is registered as %s, want %s", name, got, typ)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: s.namespace, SearchAttributes: missing,
	}); err != nil {
		return fmt.Errorf("add search attributes: %w", err)
	}
	s.log.Info("registered search attributes", zap.Int("count", len(missing)))
	return nil
}

// dial connects an SDK client to the frontend, retrying until it answers or ctx ends.
func (s *Server) dial(ctx context.Context) (client.Client, error) {
	var c client.Client
	err := retry(ctx, func() error {
		var err error
		var conn mcconfig.TemporalConn
		if s.tls != nil {
			conn = s.tls.conn(s.host)
		}
		c, err = conn.Dial(ctx, s.FrontendAddress(), s.namespace, client.Options{
			Logger: SDKLogger(s.log.Named("temporal-client").WithOptions(gate(zapcore.WarnLevel, s.quiet))),
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("frontend %s never answered: %w", s.FrontendAddress(), err)
	}
	return c, nil
}

// retry calls f with a growing pause until it succeeds or ctx ends; then it returns f's last
// error.
func retry(ctx context.Context, f func() error) error {
	delay := 20 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

func (s *Server) startUI(ctx context.Context) error {
	origins := []string{
		"http://" + net.JoinHostPort(s.host, strconv.Itoa(s.uiPort)),
		"http://" + net.JoinHostPort("localhost", strconv.Itoa(s.uiPort)),
	}
	var uiTLS uiconfig.TLS
	if s.tls != nil {
		uiTLS = s.tls.ui(s.host)
	}
	s.ui = uiserver.NewServer(uioptions.WithConfigProvider(&uiconfig.Config{
		Host:                s.host,
		Port:                s.uiPort,
		TemporalGRPCAddress: s.FrontendAddress(),
		EnableUI:            true,
		DefaultNamespace:    s.namespace,
		CORS:                uiconfig.CORS{AllowOrigins: origins, CookieInsecure: true},
		TLS:                 uiTLS,
		HideLogs:            true,
		DisableNewsFetch:    true,
	}))
	go func() { s.uiDone <- s.ui.Start() }()
	health := s.UIURL() + "/healthz"
	hc := &http.Client{Timeout: 2 * time.Second}
	err := retry(ctx, func() error {
		select {
		case err := <-s.uiDone:
			s.uiDone <- err // keep it for shutdown
			return fmt.Errorf("UI server exited: %v", err)
		default:
		}
		resp, err := hc.Get(health)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", health, resp.Status)
		}
		return nil
	})
	if err != nil {
		//lint:ignore ST1005 "Web UI" is a proper noun and the message is shown to users as is.
		return fmt.Errorf("Web UI on %s never answered: %w", s.UIURL(), err)
	}
	return nil
}
