package ledger

import (
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// Connection is how a worker connects to a source beyond its transport and target. It holds
// literal values only where they are not secret (header values, environment values the
// operator typed); every secret is a reference resolved by the worker at each connect: an
// environment variable name or a file path. It is stored as JSON in sources.connection.
type Connection struct {
	// Headers are literal HTTP headers sent on every request. A header whose name looks
	// secret (Authorization, Cookie, X-Api-Key, …) is refused: use HeaderEnv.
	Headers []Header `json:"headers,omitempty"`
	// HeaderEnv are HTTP headers whose value is read from a worker environment variable.
	HeaderEnv []HeaderRef `json:"headerEnv,omitempty"`
	// BearerEnv / BearerFile name where the bearer token is read at each connect (the value,
	// or "Bearer <value>"); at most one of them, and not together with OAuth.
	BearerEnv  string `json:"bearerEnv,omitempty"`
	BearerFile string `json:"bearerFile,omitempty"`
	// OAuth configures OAuth 2.1 (client credentials or authorization code with PKCE).
	OAuth *OAuthConfig `json:"oauth,omitempty"`
	// CAFile is a PEM bundle that replaces the system roots; CertFile and KeyFile are the
	// client certificate and key for mTLS (both or neither).
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`

	// Env are the variables a stdio child gets on top of the minimal environment.
	Env []EnvVar `json:"env,omitempty"`
	// Cwd is the stdio child's working directory (the worker's if empty).
	Cwd string `json:"cwd,omitempty"`

	// MaxBytes bounds the size of one resource read from this source; a larger one leaves a
	// TOO_LARGE receipt and nothing else. DefaultMaxBytes if zero.
	MaxBytes int64 `json:"maxBytes,omitempty"`

	// Protocol is the MCP revision the worker speaks with the source: ProtocolAuto (also
	// when empty), ProtocolLegacy or ProtocolModern (issue 13 item 1). A pinned revision the
	// server does not speak fails the connect; the source's health says so.
	Protocol string `json:"protocol,omitempty"`
}

// Protocol choices of a source (Connection.Protocol).
const (
	// ProtocolAuto negotiates the revision (the session host's era policy, mcphost.Connect).
	ProtocolAuto = "auto"
	// ProtocolLegacy pins 2025-11-25: initialize, protocol sessions, resources/subscribe.
	ProtocolLegacy = mcpsync.ProtocolVersion20251125
	// ProtocolModern pins 2026-07-28: server/discover, stateless, subscriptions/listen.
	ProtocolModern = mcpsync.ProtocolVersion20260728
)

// EffectiveProtocol is the source's protocol choice, ProtocolAuto when none is stored.
func (c Connection) EffectiveProtocol() string {
	if c.Protocol == "" {
		return ProtocolAuto
	}
	return c.Protocol
}

// DefaultMaxBytes is the per-source resource size bound when Connection.MaxBytes is zero.
const DefaultMaxBytes = 8 << 20

// MaxMaxBytes is the largest --max-bytes a source may set.
const MaxMaxBytes = 1 << 30

// Header is a literal, non-secret HTTP header.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// HeaderRef is an HTTP header whose value is the worker's environment variable Env.
type HeaderRef struct {
	Name string `json:"name"`
	Env  string `json:"env"`
}

// EnvVar is one variable of a stdio child's environment: either the literal Value or, when
// FromEnv is set, the value of the worker's variable FromEnv at each start.
type EnvVar struct {
	Name    string `json:"name"`
	Value   string `json:"value,omitempty"`
	FromEnv string `json:"fromEnv,omitempty"`
}

// OAuth flows a source can use.
const (
	OAuthClientCredentials = "client_credentials"
	OAuthAuthorizationCode = "authorization_code"
)

// OAuthConfig configures OAuth 2.1 for an HTTP source. Secrets are references only.
type OAuthConfig struct {
	// Flow is OAuthClientCredentials or OAuthAuthorizationCode.
	Flow string `json:"flow"`
	// ClientID is the pre-registered client ID (empty: dynamic registration or a client ID
	// metadata document, where the server allows it).
	ClientID string `json:"clientId,omitempty"`
	// ClientSecretEnv / ClientSecretFile name where the client secret is read.
	ClientSecretEnv  string `json:"clientSecretEnv,omitempty"`
	ClientSecretFile string `json:"clientSecretFile,omitempty"`
	// Scopes requested; empty means what the server's metadata suggests.
	Scopes []string `json:"scopes,omitempty"`
	// TokenFile keeps the tokens of the authorization-code flow (mode 0600), written by
	// `mcpsync source login` and refreshed by the worker.
	TokenFile string `json:"tokenFile,omitempty"`
	// ClientMetadataURL is the client's ID as a client ID metadata document URL (an https URL
	// with a path), used by `source login` when the authorization server supports them.
	ClientMetadataURL string `json:"clientMetadataUrl,omitempty"`
	// ClientKeyFile is a PEM private key (EC P-256 or RSA) with which a client-credentials
	// client authenticates by a signed JWT (private_key_jwt, RFC 7523) instead of a secret.
	ClientKeyFile string `json:"clientKeyFile,omitempty"`
}

// MaxSourceNameBytes bounds a source name (it becomes part of workflow IDs).
const MaxSourceNameBytes = 200

var (
	envNameRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// secretHeaders are header names that always carry credentials.
var secretHeaders = map[string]bool{"authorization": true, "proxy-authorization": true, "cookie": true}

// validate reports a malformed connection for a source of the given transport with ErrInvalid.
func (c Connection) validate(name, transport string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("source %q: "+format+": %w", append(append([]any{name}, args...), ErrInvalid)...)
	}
	if transport != TransportHTTP {
		if len(c.Headers) > 0 || len(c.HeaderEnv) > 0 || c.BearerEnv != "" || c.BearerFile != "" ||
			c.OAuth != nil || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			return bad("headers, bearer tokens, OAuth and TLS files apply to --url sources only")
		}
	}
	if transport != TransportStdio && (len(c.Env) > 0 || c.Cwd != "") {
		return bad("--env and --cwd apply to --stdio sources only")
	}
	seen := map[string]bool{}
	for _, h := range c.Headers {
		if !headerNameRE.MatchString(h.Name) {
			return bad("header name %q is not a valid HTTP header name", h.Name)
		}
		if secretHeaders[strings.ToLower(h.Name)] || redact.IsSecretName(h.Name) {
			return bad("header %q carries a secret: give it with --header-env %s=VAR so that only the variable name is stored", h.Name, h.Name)
		}
		if strings.ContainsAny(h.Value, "\r\n\x00") {
			return bad("header %q: value contains a line break or NUL", h.Name)
		}
		seen[strings.ToLower(h.Name)] = true
	}
	for _, h := range c.HeaderEnv {
		if !headerNameRE.MatchString(h.Name) {
			return bad("header name %q is not a valid HTTP header name", h.Name)
		}
		if !envNameRE.MatchString(h.Env) {
			return bad("header %q: %q is not an environment variable name", h.Name, h.Env)
		}
		if seen[strings.ToLower(h.Name)] {
			return bad("header %q given twice", h.Name)
		}
		seen[strings.ToLower(h.Name)] = true
	}
	auths := 0
	for _, set := range []bool{c.BearerEnv != "", c.BearerFile != "", c.OAuth != nil, seen["authorization"]} {
		if set {
			auths++
		}
	}
	if auths > 1 {
		return bad("give at most one of --bearer-env, --bearer-file, OAuth and an Authorization header")
	}
	if c.BearerEnv != "" && !envNameRE.MatchString(c.BearerEnv) {
		return bad("--bearer-env %q is not an environment variable name", c.BearerEnv)
	}
	if o := c.OAuth; o != nil {
		if err := o.validate(); err != nil {
			return bad("%v", err)
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return bad("--cert-file and --key-file go together")
	}
	for _, p := range []struct{ flag, path string }{{"bearer-file", c.BearerFile}, {"ca-file", c.CAFile},
		{"cert-file", c.CertFile}, {"key-file", c.KeyFile}, {"cwd", c.Cwd}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			return bad("--%s %q must be an absolute path (the worker resolves it)", p.flag, p.path)
		}
	}
	names := map[string]bool{}
	for _, v := range c.Env {
		if !envNameRE.MatchString(v.Name) {
			return bad("--env %q is not an environment variable name", v.Name)
		}
		if v.FromEnv != "" && !envNameRE.MatchString(v.FromEnv) {
			return bad("--env %s=env:%s: %q is not an environment variable name", v.Name, v.FromEnv, v.FromEnv)
		}
		if v.FromEnv != "" && IsReservedWorkerVar(v.FromEnv) {
			return bad("--env %s=env:%s: a stdio child may not receive the worker's configuration variables (DATABASE_URL, TEMPORAL_*, MCPSYNC_*, PG*)", v.Name, v.FromEnv)
		}
		if names[v.Name] {
			return bad("--env %s given twice", v.Name)
		}
		names[v.Name] = true
	}
	switch c.Protocol {
	case "", ProtocolAuto, ProtocolLegacy, ProtocolModern:
	default:
		return bad("--protocol %q is not one of %s, %s, %s", c.Protocol, ProtocolAuto, ProtocolLegacy, ProtocolModern)
	}
	if c.MaxBytes < 0 || c.MaxBytes > MaxMaxBytes {
		return bad("--max-bytes must be between 1 and %d, got %d", MaxMaxBytes, c.MaxBytes)
	}
	return nil
}

func (o OAuthConfig) validate() error {
	switch o.Flow {
	case OAuthClientCredentials:
		if o.ClientID == "" {
			return fmt.Errorf("OAuth client credentials need --oauth-client-id")
		}
	case OAuthAuthorizationCode:
		if o.TokenFile == "" {
			return fmt.Errorf("OAuth authorization code needs --oauth-token-file")
		}
	default:
		return fmt.Errorf("unknown OAuth flow %q (want %s or %s)", o.Flow, OAuthClientCredentials, OAuthAuthorizationCode)
	}
	if o.ClientSecretEnv != "" && o.ClientSecretFile != "" {
		return fmt.Errorf("give --oauth-client-secret-env or --oauth-client-secret-file, not both")
	}
	if o.ClientKeyFile != "" {
		if o.Flow != OAuthClientCredentials {
			return fmt.Errorf("--oauth-client-key-file applies to --oauth %s only", OAuthClientCredentials)
		}
		if o.ClientSecretEnv != "" || o.ClientSecretFile != "" {
			return fmt.Errorf("give a client secret or --oauth-client-key-file, not both")
		}
	}
	if o.ClientSecretEnv != "" && !envNameRE.MatchString(o.ClientSecretEnv) {
		return fmt.Errorf("--oauth-client-secret-env %q is not an environment variable name", o.ClientSecretEnv)
	}
	if o.ClientMetadataURL != "" {
		if o.Flow != OAuthAuthorizationCode {
			return fmt.Errorf("--oauth-client-metadata-url applies to --oauth %s only", OAuthAuthorizationCode)
		}
		if u, err := url.Parse(o.ClientMetadataURL); err != nil || u.Scheme != "https" || u.Host == "" || strings.Trim(u.Path, "/") == "" || u.User != nil {
			return fmt.Errorf("--oauth-client-metadata-url %q must be an https URL with a path", redact.URL(o.ClientMetadataURL))
		}
	}
	for _, p := range []string{o.ClientSecretFile, o.TokenFile, o.ClientKeyFile} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("OAuth file %q must be an absolute path (the worker resolves it)", p)
		}
	}
	return nil
}

// EffectiveMaxBytes is the resource size bound of the source.
func (c Connection) EffectiveMaxBytes() int64 {
	if c.MaxBytes == 0 {
		return DefaultMaxBytes
	}
	return c.MaxBytes
}

// IsReservedWorkerVar reports whether name is one of the worker's own configuration
// variables, which hold the ledger's and Temporal's credentials: a stdio child never gets them,
// declared or not (DATABASE_URL, TEMPORAL_*, MCPSYNC_*, and libpq's PG* that reach the same
// database).
func IsReservedWorkerVar(name string) bool {
	return name == "DATABASE_URL" || strings.HasPrefix(name, "TEMPORAL_") || strings.HasPrefix(name, "MCPSYNC_") ||
		strings.HasPrefix(name, "PG")
}
