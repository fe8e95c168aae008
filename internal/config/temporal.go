package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// TemporalConn holds how a binary authenticates to its Temporal cluster (issue 17 item 1),
// under the environment names the Temporal CLI uses. It holds file paths, never certificate or
// key contents. APIKey is a secret: TemporalConn's String and GoString mask it, and no error of
// this package quotes it. The zero value connects in plain text without credentials (the
// embedded mcpsync-dev server).
type TemporalConn struct {
	TLSCert       string // TEMPORAL_TLS_CERT: PEM client certificate file (mTLS); needs TLSKey
	TLSKey        string // TEMPORAL_TLS_KEY: PEM private key file of TLSCert
	TLSCA         string // TEMPORAL_TLS_CA: PEM file of the CAs that sign the server's certificate
	TLSServerName string // TEMPORAL_TLS_SERVER_NAME: name to verify the server's certificate against
	// TLS is TEMPORAL_TLS: "true" forces TLS with the system's root CAs when nothing else asks
	// for it, "false" forbids it (an API key over plain text, for a local proxy); empty means
	// TLS exactly when a certificate, CA, server name or API key is set.
	TLS    string
	APIKey string // TEMPORAL_API_KEY: sent as "Authorization: Bearer …"; never printed
}

// temporalConnFromEnv reads the TEMPORAL_TLS_* and TEMPORAL_API_KEY variables.
func temporalConnFromEnv() TemporalConn {
	return TemporalConn{
		TLSCert:       os.Getenv("TEMPORAL_TLS_CERT"),
		TLSKey:        os.Getenv("TEMPORAL_TLS_KEY"),
		TLSCA:         os.Getenv("TEMPORAL_TLS_CA"),
		TLSServerName: os.Getenv("TEMPORAL_TLS_SERVER_NAME"),
		TLS:           os.Getenv("TEMPORAL_TLS"),
		APIKey:        os.Getenv("TEMPORAL_API_KEY"),
	}
}

// String lists the settings that are set, with the API key masked.
func (t TemporalConn) String() string {
	var parts []string
	for _, kv := range [][2]string{
		{"TEMPORAL_TLS", t.TLS}, {"TEMPORAL_TLS_CERT", t.TLSCert}, {"TEMPORAL_TLS_KEY", t.TLSKey},
		{"TEMPORAL_TLS_CA", t.TLSCA}, {"TEMPORAL_TLS_SERVER_NAME", t.TLSServerName},
	} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+kv[1])
		}
	}
	if t.APIKey != "" {
		parts = append(parts, "TEMPORAL_API_KEY="+redact.Mask)
	}
	return strings.Join(parts, " ")
}

// GoString is String, so that %#v masks the API key too.
func (t TemporalConn) GoString() string { return "config.TemporalConn{" + t.String() + "}" }

// Flags registers --temporal-tls-cert, --temporal-tls-key, --temporal-tls-ca,
// --temporal-tls-server-name and --temporal-tls on fs, each defaulting to t's current value
// (read from the environment), so a flag overrides its variable. There is deliberately no
// flag for the API key: a command line is visible to every user of the machine
// (TEMPORAL_API_KEY only).
func (t *TemporalConn) Flags(fs *flag.FlagSet) {
	fs.StringVar(&t.TLSCert, "temporal-tls-cert", t.TLSCert, "PEM client certificate file for Temporal mTLS (TEMPORAL_TLS_CERT); needs --temporal-tls-key")
	fs.StringVar(&t.TLSKey, "temporal-tls-key", t.TLSKey, "PEM private key file of --temporal-tls-cert (TEMPORAL_TLS_KEY)")
	fs.StringVar(&t.TLSCA, "temporal-tls-ca", t.TLSCA, "PEM file of the CAs trusted to sign the Temporal server's certificate (TEMPORAL_TLS_CA; default: the system's)")
	fs.StringVar(&t.TLSServerName, "temporal-tls-server-name", t.TLSServerName, "server name to verify the Temporal server's certificate against (TEMPORAL_TLS_SERVER_NAME)")
	fs.Var((*boolString)(&t.TLS), "temporal-tls", "always use TLS to Temporal; =false: never (TEMPORAL_TLS; default: when any TLS setting or TEMPORAL_API_KEY is set)")
}

// boolString is a boolean flag kept as the string TemporalConn.TLS holds ("" when unset).
type boolString string

func (b *boolString) String() string { return string(*b) }

func (b *boolString) Set(v string) error {
	p, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	*b = boolString(strconv.FormatBool(p))
	return nil
}

func (b *boolString) IsBoolFlag() bool { return true }

// ConfigError is a Temporal connection setting that cannot be used: a certificate without its
// key, an unreadable or malformed file, a bad TEMPORAL_TLS. Its message is one line naming the
// setting and file, never a file's contents or the API key.
type ConfigError struct{ msg string }

// Error is the one-line description.
func (e *ConfigError) Error() string { return e.msg }

func configErr(format string, args ...any) error {
	return &ConfigError{msg: redact.Text(fmt.Sprintf(format, args...))}
}

// tlsMode resolves TEMPORAL_TLS: on reports whether TLS is forced on, off whether forced off.
func (t TemporalConn) tlsMode() (on, off bool, err error) {
	if t.TLS == "" {
		return false, false, nil
	}
	b, perr := strconv.ParseBool(t.TLS)
	if perr != nil {
		return false, false, configErr("TEMPORAL_TLS is %q, want true or false", t.TLS)
	}
	return b, !b, nil
}

// Validate checks the settings without connecting: the certificate and key come together and
// form a pair, the CA file holds at least one PEM certificate, TEMPORAL_TLS is a boolean and
// does not contradict the TLS files. Every failure is a *ConfigError.
func (t TemporalConn) Validate() error {
	_, err := t.tlsConfig()
	return err
}

// tlsConfig builds the TLS configuration, or nil for plain text.
func (t TemporalConn) tlsConfig() (*tls.Config, error) {
	on, off, err := t.tlsMode()
	if err != nil {
		return nil, err
	}
	files := t.TLSCert != "" || t.TLSKey != "" || t.TLSCA != "" || t.TLSServerName != ""
	if off && files {
		return nil, configErr("TEMPORAL_TLS is false but a TLS certificate, key, CA or server name is set")
	}
	switch {
	case t.TLSCert != "" && t.TLSKey == "":
		return nil, configErr("TEMPORAL_TLS_CERT %s is set without its key TEMPORAL_TLS_KEY", t.TLSCert)
	case t.TLSKey != "" && t.TLSCert == "":
		return nil, configErr("TEMPORAL_TLS_KEY %s is set without its certificate TEMPORAL_TLS_CERT", t.TLSKey)
	}
	if !files && !on && (t.APIKey == "" || off) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.TLSServerName}
	if t.TLSCert != "" {
		for _, f := range []struct{ name, path string }{{"TEMPORAL_TLS_CERT", t.TLSCert}, {"TEMPORAL_TLS_KEY", t.TLSKey}} {
			if err := readable(f.name, f.path); err != nil {
				return nil, err
			}
		}
		pair, err := tls.LoadX509KeyPair(t.TLSCert, t.TLSKey)
		if err != nil {
			// The error of tls.LoadX509KeyPair names the problem, never the key's bytes.
			return nil, configErr("TEMPORAL_TLS_CERT %s and TEMPORAL_TLS_KEY %s are not a usable certificate and key: %v", t.TLSCert, t.TLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if t.TLSCA != "" {
		if err := readable("TEMPORAL_TLS_CA", t.TLSCA); err != nil {
			return nil, err
		}
		pem, err := os.ReadFile(t.TLSCA)
		if err != nil {
			return nil, configErr("TEMPORAL_TLS_CA cannot be read: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configErr("TEMPORAL_TLS_CA %s holds no PEM certificate", t.TLSCA)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// readable reports a missing or unreadable file as a *ConfigError naming the setting.
func readable(name, path string) error {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return configErr("%s %s cannot be read: %v", name, path, err)
	}
	return f.Close()
}

// ClientOptions returns base with HostPort, Namespace, TLS and credentials set from address,
// namespace and t: the one place every mcpsync binary builds its Temporal client options.
// Requests to a loopback address (the embedded mcpsync-dev server) are not compressed unless
// base asks for a compression: on one machine gzip spends CPU on both ends and saves nothing
// (issue 16 item 4: about 2.5 % of both cores while 10,000 subscriptions start); elsewhere the
// SDK's default, gzip, stays. An unusable setting is a *ConfigError.
func (t TemporalConn) ClientOptions(address, namespace string, base client.Options) (client.Options, error) {
	cfg, err := t.tlsConfig()
	if err != nil {
		return client.Options{}, err
	}
	opts := base
	opts.HostPort, opts.Namespace = address, namespace
	opts.ConnectionOptions.TLS = cfg
	if _, off, _ := t.tlsMode(); off {
		opts.ConnectionOptions.TLSDisabled = true
	}
	if t.APIKey != "" {
		opts.Credentials = client.NewAPIKeyStaticCredentials(t.APIKey)
	}
	if opts.ConnectionOptions.GrpcCompression == nil && Loopback(address) {
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	}
	return opts, nil
}

// Loopback reports whether address (host:port, or a host) names this machine: localhost, or
// an IP address in 127.0.0.0/8 or ::1. A name that only resolves to one is not looked up.
func Loopback(address string) bool {
	host := address
	if h, _, err := net.SplitHostPort(address); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Dial connects to Temporal at address with t's settings (ClientOptions), bounded by ctx.
// On failure it returns a *ConfigError for an unusable setting, or an error whose one-line
// message names the address and, when the TLS handshake failed, why: a server certificate the
// CA (TEMPORAL_TLS_CA, or the system's roots) does not trust, a name mismatch, TLS against a
// plain-text server or the reverse. No message carries the API key.
func (t TemporalConn) Dial(ctx context.Context, address, namespace string, base client.Options) (client.Client, error) {
	opts, err := t.ClientOptions(address, namespace, base)
	if err != nil {
		return nil, err
	}
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, t.dialError(address, opts.ConnectionOptions.TLS != nil, err)
	}
	return c, nil
}

// DialError is a failed connection to Temporal. Error is one line; Unwrap gives the SDK's error.
type DialError struct {
	Address string
	// Hint says what to check, e.g. that the server's certificate is not trusted.
	Hint string
	Err  error
}

// Error names the address, the hint when there is one, and the cause, redacted.
func (e *DialError) Error() string {
	cause := strings.Join(strings.Fields(redact.Text(e.Err.Error())), " ")
	if e.Hint == "" {
		return fmt.Sprintf("temporal at %s unreachable (%s)", e.Address, cause)
	}
	return fmt.Sprintf("temporal at %s: %s (%s)", e.Address, e.Hint, cause)
}

// Unwrap returns the SDK's error.
func (e *DialError) Unwrap() error { return e.Err }

// dialError wraps a failed dial in a *DialError whose hint names the likely cause of a TLS or
// credentials failure in terms of the settings.
func (t TemporalConn) dialError(address string, useTLS bool, err error) error {
	msg := err.Error()
	hint := ""
	has := func(s ...string) bool {
		for _, x := range s {
			if strings.Contains(msg, x) {
				return true
			}
		}
		return false
	}
	ca := "the system's root CAs (set TEMPORAL_TLS_CA to the CA file that signed it)"
	if t.TLSCA != "" {
		ca = "the CA in TEMPORAL_TLS_CA " + t.TLSCA
	}
	switch {
	case has("certificate has expired", "is not yet valid"):
		hint = "the server's TLS certificate has expired or is not yet valid"
	case has("certificate signed by unknown authority", "certificate is not trusted"):
		hint = "the server's TLS certificate is not trusted by " + ca
	case has("certificate is valid for", "certificate is not valid for any names"):
		hint = "the server's TLS certificate does not match the host name (set TEMPORAL_TLS_SERVER_NAME to a name it is valid for)"
	case useTLS && has("first record does not look like a TLS handshake"):
		hint = "the server does not speak TLS (unset TEMPORAL_TLS_* or set TEMPORAL_TLS=false)"
	case !useTLS && has("connection closed before server preface", "error reading server preface", "http2: frame too large"):
		hint = "the server may require TLS (set TEMPORAL_TLS_CA, TEMPORAL_TLS=true or TEMPORAL_API_KEY)"
	// A server that wants a client certificate answers a missing or untrusted one with
	// "certificate required" (TLS 1.3), or "bad certificate" / "handshake failure" (TLS 1.2).
	case has("certificate required", "bad certificate", "unknown certificate authority", "remote error: tls: handshake failure") && t.TLSCert == "":
		hint = "the server refused the TLS handshake without a client certificate (set TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY)"
	case has("certificate required", "bad certificate", "unknown certificate authority", "remote error: tls: handshake failure"):
		hint = "the server refused the TLS handshake with the client certificate in TEMPORAL_TLS_CERT " + t.TLSCert
	case has("Unauthenticated", "PermissionDenied", "Request unauthorized"):
		hint = "the server refused the credentials (check TEMPORAL_API_KEY or the client certificate)"
	}
	return &DialError{Address: address, Hint: hint, Err: err}
}
