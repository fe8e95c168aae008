package devtemporal

import (
	"errors"

	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	"go.temporal.io/server/common/config"

	mcconfig "github.com/mcpsync/mcpsync/internal/config"
)

// TLS makes the frontend serve gRPC over TLS (issue 17 item 1), so that mcpsync's clients can
// be exercised against a server that needs TEMPORAL_TLS_CA (and, with ClientCAFile,
// TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY). All fields are PEM file paths.
type TLS struct {
	// CertFile and KeyFile are the frontend's certificate and key. Required.
	CertFile, KeyFile string
	// CAFile is the CA that signed CertFile: the server's own clients (the system worker, the
	// Web UI, Start's readiness check) verify the frontend with it. Required.
	CAFile string
	// ServerName is the name those clients verify CertFile against (default: the host).
	ServerName string
	// ClientCAFile, if set, makes the frontend require client certificates signed by it
	// (mutual TLS); the server's own clients then present CertFile and KeyFile.
	ClientCAFile string
}

// validate reports a missing required field.
func (t *TLS) validate() error {
	if t.CertFile == "" || t.KeyFile == "" || t.CAFile == "" {
		return errors.New("devtemporal: Options.TLS needs CertFile, KeyFile and CAFile")
	}
	return nil
}

// apply sets the frontend's server TLS and the system worker's client TLS in cfg.
func (t *TLS) apply(cfg *config.Config, host string) {
	serverName := t.ServerName
	if serverName == "" {
		serverName = host
	}
	server := config.ServerTLS{CertFile: t.CertFile, KeyFile: t.KeyFile}
	if t.ClientCAFile != "" {
		server.ClientCAFiles, server.RequireClientAuth = []string{t.ClientCAFile}, true
	}
	cfg.Global.TLS.Frontend.Server = server
	cfg.Global.TLS.SystemWorker = config.WorkerTLS{
		Client: config.ClientTLS{ServerName: serverName, RootCAFiles: []string{t.CAFile}},
	}
	if t.ClientCAFile != "" {
		cfg.Global.TLS.SystemWorker.CertFile, cfg.Global.TLS.SystemWorker.KeyFile = t.CertFile, t.KeyFile
	}
}

// conn is how the server's own SDK clients reach a TLS frontend.
func (t *TLS) conn(host string) mcconfig.TemporalConn {
	c := mcconfig.TemporalConn{TLSCA: t.CAFile, TLSServerName: t.ServerName}
	if c.TLSServerName == "" {
		c.TLSServerName = host
	}
	if t.ClientCAFile != "" {
		c.TLSCert, c.TLSKey = t.CertFile, t.KeyFile
	}
	return c
}

// ui is the Web UI's client TLS towards a TLS frontend.
func (t *TLS) ui(host string) uiconfig.TLS {
	c := t.conn(host)
	return uiconfig.TLS{CaFile: c.TLSCA, CertFile: c.TLSCert, KeyFile: c.TLSKey, ServerName: c.TLSServerName, EnableHostVerification: true}
}
