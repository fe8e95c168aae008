package cli

import (
	"flag"
	"fmt"
	neturl "net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// repeated is a flag that may be given several times; each value is kept in order.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ", ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// sourceFlags are the flags that define a source, shared by `source add`, `source update` and
// `source check`.
type sourceFlags struct {
	usage                       string
	fs                          *flag.FlagSet
	stdio, url, subject         *string
	backstop, poll              *time.Duration
	headers, headerEnv, env     repeated
	bearerEnv, bearerFile       *string
	caFile, certFile, keyFile   *string
	cwd                         *string
	maxBytes                    *int64
	protocol                    *string
	oauth, oauthClientID        *string
	oauthSecretEnv, oauthSecret *string
	oauthScopes, oauthTokenFile *string
	oauthClientMetadataURL      *string
	oauthClientKeyFile          *string
}

// sourceFlagsUsage is the flag part of the usage line of the commands that take sourceFlags.
const sourceFlagsUsage = `--stdio "CMD ARGS" [--env K=V|K=env:VAR]... [--cwd DIR] | --url URL [--header 'Name: value']... [--header-env Name=VAR]... [--bearer-env VAR | --bearer-file PATH | --oauth client_credentials|authorization_code ...] [--ca-file PATH] [--cert-file PATH --key-file PATH]; [--subject S] [--backstop 30s] [--poll 30s] [--max-bytes N] [--protocol auto|2025-11-25|2026-07-28]`

func newSourceFlags(fs *flag.FlagSet, usage string) *sourceFlags {
	f := &sourceFlags{fs: fs, usage: usage}
	f.stdio = fs.String("stdio", "", "command line of a stdio MCP server")
	f.url = fs.String("url", "", "streamable HTTP endpoint of an MCP server")
	f.subject = fs.String("subject", "default", "authorization subject the session connects as")
	f.backstop = fs.Duration("backstop", 30*time.Second, "backstop re-read period of subscribed resources")
	f.poll = fs.Duration("poll", 30*time.Second, "poll period when the server lacks resources.subscribe or leaves a URI out of its subscriptions/listen acknowledgement")
	fs.Var(&f.headers, "header", "HTTP header 'Name: value' sent on every request (not for secrets; repeatable)")
	fs.Var(&f.headerEnv, "header-env", "HTTP header Name=VAR whose value is the worker's environment variable VAR (repeatable)")
	f.bearerEnv = fs.String("bearer-env", "", "worker environment variable holding the bearer token")
	f.bearerFile = fs.String("bearer-file", "", "file holding the bearer token, read at each connect")
	f.caFile = fs.String("ca-file", "", "PEM file of the CA certificates that verify the server")
	f.certFile = fs.String("cert-file", "", "client certificate (PEM) for mTLS")
	f.keyFile = fs.String("key-file", "", "client key (PEM) for mTLS")
	fs.Var(&f.env, "env", "stdio child variable K=V, or K=env:VAR to pass the worker's VAR (repeatable)")
	f.cwd = fs.String("cwd", "", "working directory of the stdio child")
	f.maxBytes = fs.Int64("max-bytes", ledger.DefaultMaxBytes, "largest resource read stored from this source, in bytes")
	f.protocol = fs.String("protocol", ledger.ProtocolAuto, "MCP revision: auto (negotiated), "+ledger.ProtocolLegacy+" or "+ledger.ProtocolModern+" (pinned: a server that does not speak it fails the connect)")
	f.oauth = fs.String("oauth", "", "OAuth 2.1 flow: client_credentials or authorization_code")
	f.oauthClientID = fs.String("oauth-client-id", "", "pre-registered OAuth client ID")
	f.oauthSecretEnv = fs.String("oauth-client-secret-env", "", "worker environment variable holding the OAuth client secret")
	f.oauthSecret = fs.String("oauth-client-secret-file", "", "file holding the OAuth client secret")
	f.oauthScopes = fs.String("oauth-scopes", "", "OAuth scopes to request, space- or comma-separated")
	f.oauthTokenFile = fs.String("oauth-token-file", "", "file (mode 0600) that keeps the authorization-code flow's tokens")
	f.oauthClientKeyFile = fs.String("oauth-client-key-file", "", "PEM private key (EC P-256 or RSA) for private_key_jwt client authentication (client credentials)")
	f.oauthClientMetadataURL = fs.String("oauth-client-metadata-url", "", "https URL of the client ID metadata document used as client ID where the server supports it (authorization code)")
	return f
}

// spec builds a source definition named name from the parsed flags; any malformed value is a
// usage error.
func (f *sourceFlags) spec(name string) (ledger.SourceSpec, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"backstop", *f.backstop}, {"poll", *f.poll}} {
		if d.v < time.Second || d.v%time.Second != 0 {
			return ledger.SourceSpec{}, usageErr("--%s must be a whole number of seconds, at least 1s, got %s", d.name, d.v)
		}
		if d.v > ledger.MaxPeriodSeconds*time.Second {
			return ledger.SourceSpec{}, usageErr("--%s must be at most %s, got %s", d.name, ledger.MaxPeriodSeconds*time.Second, d.v)
		}
	}
	if *f.maxBytes < 1 || *f.maxBytes > ledger.MaxMaxBytes {
		return ledger.SourceSpec{}, usageErr("--max-bytes must be between 1 and %d, got %d", ledger.MaxMaxBytes, *f.maxBytes)
	}
	spec := ledger.SourceSpec{Name: name, Subject: *f.subject,
		BackstopSeconds: int(f.backstop.Seconds()), PollSeconds: int(f.poll.Seconds())}
	if *f.maxBytes != ledger.DefaultMaxBytes {
		spec.Connection.MaxBytes = *f.maxBytes
	}
	switch *f.protocol {
	case ledger.ProtocolAuto:
		// stored as "": every source defined before --protocol existed is auto too
	case ledger.ProtocolLegacy, ledger.ProtocolModern:
		spec.Connection.Protocol = *f.protocol
	default:
		return ledger.SourceSpec{}, usageErr("--protocol must be %s, %s or %s, got %q", ledger.ProtocolAuto, ledger.ProtocolLegacy, ledger.ProtocolModern, *f.protocol)
	}
	switch {
	case isSet(f.fs, "stdio") && *f.stdio == "":
		return spec, usageErr("--stdio must not be empty")
	case isSet(f.fs, "url") && *f.url == "":
		return spec, usageErr("--url must not be empty")
	case *f.stdio != "" && *f.url != "":
		return spec, usageErr("give either --stdio or --url, not both")
	case *f.stdio != "":
		argv, err := SplitCommand(*f.stdio)
		if err != nil {
			return spec, usageErr("--stdio: %v", err)
		}
		if len(argv) == 0 {
			return spec, usageErr("--stdio: empty command")
		}
		spec.Transport, spec.Command = ledger.TransportStdio, argv
	case *f.url != "":
		if u, err := neturl.Parse(*f.url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return spec, usageErr("--url %s is not an http:// or https:// URL with a host", quoteURL(*f.url))
		}
		spec.Transport, spec.URL = ledger.TransportHTTP, *f.url
	default:
		return spec, usageErr("give --stdio \"CMD ARGS\" or --url URL (usage: %s)", f.usage)
	}
	if err := f.connection(&spec.Connection); err != nil {
		return spec, err
	}
	if err := spec.Validate(); err != nil {
		return spec, usageErr("%v", strings.TrimSuffix(err.Error(), ": "+ledger.ErrInvalid.Error()))
	}
	return spec, nil
}

// connection fills c from the connection flags; relative paths are made absolute, since the
// worker resolves them.
func (f *sourceFlags) connection(c *ledger.Connection) error {
	for _, h := range f.headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return usageErr("--header %q must be 'Name: value'", h)
		}
		c.Headers = append(c.Headers, ledger.Header{Name: strings.TrimSpace(name), Value: strings.TrimSpace(value)})
	}
	for _, h := range f.headerEnv {
		name, env, ok := strings.Cut(h, "=")
		if !ok || name == "" || env == "" {
			return usageErr("--header-env %q must be Name=VAR", h)
		}
		c.HeaderEnv = append(c.HeaderEnv, ledger.HeaderRef{Name: name, Env: env})
	}
	for _, kv := range f.env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return usageErr("--env %q must be K=V or K=env:VAR", kv)
		}
		v := ledger.EnvVar{Name: name, Value: value}
		if from, ok := strings.CutPrefix(value, "env:"); ok {
			v = ledger.EnvVar{Name: name, FromEnv: from}
		}
		c.Env = append(c.Env, v)
	}
	c.BearerEnv = *f.bearerEnv
	var err error
	abs := func(flagName, p string) string {
		if p == "" || err != nil {
			return p
		}
		a, aerr := filepath.Abs(p)
		if aerr != nil {
			err = usageErr("--%s %q: %v", flagName, p, aerr)
		}
		return a
	}
	c.BearerFile = abs("bearer-file", *f.bearerFile)
	c.CAFile = abs("ca-file", *f.caFile)
	c.CertFile = abs("cert-file", *f.certFile)
	c.KeyFile = abs("key-file", *f.keyFile)
	c.Cwd = abs("cwd", *f.cwd)
	oauthSet := *f.oauthClientID != "" || *f.oauthSecretEnv != "" || *f.oauthSecret != "" || *f.oauthScopes != "" || *f.oauthTokenFile != "" || *f.oauthClientMetadataURL != "" || *f.oauthClientKeyFile != ""
	switch {
	case *f.oauth == "" && oauthSet:
		return usageErr("--oauth-* flags need --oauth client_credentials or --oauth authorization_code")
	case *f.oauth != "":
		o := &ledger.OAuthConfig{Flow: *f.oauth, ClientID: *f.oauthClientID, ClientSecretEnv: *f.oauthSecretEnv,
			ClientSecretFile: abs("oauth-client-secret-file", *f.oauthSecret), TokenFile: abs("oauth-token-file", *f.oauthTokenFile),
			ClientMetadataURL: *f.oauthClientMetadataURL, ClientKeyFile: abs("oauth-client-key-file", *f.oauthClientKeyFile)}
		o.Scopes = strings.FieldsFunc(*f.oauthScopes, func(r rune) bool { return r == ' ' || r == ',' })
		if len(o.Scopes) == 0 {
			o.Scopes = nil
		}
		c.OAuth = o
	}
	return err
}

// quoteURL quotes a URL for an error message with its secrets masked.
func quoteURL(u string) string { return fmt.Sprintf("%q", redactURL(u)) }
