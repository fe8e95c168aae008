// Package redact masks secrets in text that mcpsync prints, logs or stores (issue 14 item 3):
// the password of a PostgreSQL connection string (URL and key=value forms), the userinfo of a
// URL and the values of query parameters whose names look secret, bearer tokens and
// Authorization header values, OAuth token fields, secret-looking command-line flags. It has
// no dependencies within mcpsync, so every package may use it on anything it is about to show:
// Text for free text (log lines, server messages), Err for an error that is logged or stored,
// URL for a source URL, DSN for DATABASE_URL, Args for a stdio command line, Value for a
// configured literal whose name may be secret.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask is what a masked secret is replaced with.
const Mask = "***"

// secretWords are the fragments that make a query parameter, header or variable name secret.
var secretWords = []string{"token", "secret", "password", "passwd", "pwd", "apikey", "api_key", "api-key",
	"key", "auth", "credential", "signature", "sig", "session", "cookie", "jwt", "bearer", "code"}

// IsSecretName reports whether a query parameter, header or environment variable called name
// should be assumed to carry a secret (case-insensitive match of a fragment such as "token",
// "key", "auth" or "password").
func IsSecretName(name string) bool {
	n := strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// URL returns raw with the password of its userinfo (or the whole userinfo when it has no
// password, since a lone user part is often a token) and the values of secret-looking query
// parameters replaced by Mask. Text that does not parse as a URL with a scheme is returned
// with every "user:pass@" shape masked, so a malformed URL is not a way around redaction.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return userinfoRE.ReplaceAllString(raw, "${1}"+Mask+"@")
	}
	changed := false
	if u.User != nil {
		changed = true
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else {
			u.User = url.User(Mask)
		}
	}
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, p := range parts {
			name, _, hasValue := strings.Cut(p, "=")
			if dec, err := url.QueryUnescape(name); err == nil {
				name = dec
			}
			if hasValue && IsSecretName(name) {
				k, _, _ := strings.Cut(p, "=")
				parts[i] = k + "=" + Mask
				changed = true
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	if !changed {
		return raw
	}
	return strings.ReplaceAll(u.String(), url.QueryEscape(Mask), Mask)
}

// HasSecret reports whether the URL carries credentials that URL would mask: userinfo or a
// secret-looking query parameter with a value.
func HasSecret(raw string) bool { return URL(raw) != raw }

var (
	userinfoRE = regexp.MustCompile(`(?i)([a-z][a-z0-9+.-]*://)[^/@\s]*@`)
	// dsnPasswordRE finds password=VALUE in a key=value connection string, quoted or not.
	dsnPasswordRE = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s"\\]*)`)
)

// DSN masks the password of a PostgreSQL connection string in URL form
// (postgres://user:pass@host/db) or key=value form (password=pass), wherever it occurs in text:
// the text may be an error message that quotes the string.
func DSN(text string) string {
	text = dsnURLRE.ReplaceAllString(text, "${1}${2}:"+Mask+"@")
	return dsnPasswordRE.ReplaceAllString(text, "${1}"+Mask)
}

// dsnURLRE matches scheme://user:password@ in text, password possibly empty.
var dsnURLRE = regexp.MustCompile(`(?i)(postgres(?:ql)?://)([^:/@\s]*):[^@\s]*@`)

// Text masks every secret shape this package knows in free text: connection strings (DSN),
// URLs of any scheme with userinfo or secret query parameters (URL), bearer tokens
// ("Bearer abc…", but not the parameters of a WWW-Authenticate challenge such as
// `Bearer error="invalid_token"`), Authorization header values, and the values of well-known
// credential fields in JSON ("access_token": "…") or form/key=value text (client_secret=…).
// Text is idempotent and leaves text without secrets unchanged, so it is safe to apply to
// every log line (internal/logging does).
func Text(text string) string {
	text = DSN(text)
	text = urlRE.ReplaceAllStringFunc(text, URL)
	text = authHeaderRE.ReplaceAllString(text, "${1}"+Mask)
	text = bearerRE.ReplaceAllString(text, "${1}"+Mask+"${2}")
	text = bearerPaddedRE.ReplaceAllString(text, "${1}"+Mask+"${2}")
	text = jsonFieldRE.ReplaceAllString(text, "${1}"+Mask+"${2}")
	return kvFieldRE.ReplaceAllString(text, "${1}"+Mask)
}

var (
	// urlRE finds URLs of any scheme; it stops at blanks, quotes (also backquotes), angle
	// brackets and backslashes (so a URL inside a JSON-escaped string keeps its escaped
	// closing quote).
	urlRE = regexp.MustCompile("(?i)\\b[a-z][a-z0-9+.-]*://[^\\s\"'`<>\\\\]+")
	// authHeaderRE finds the credentials of an Authorization or Proxy-Authorization header
	// value ("Authorization: Basic …", also as Go prints an http.Header).
	authHeaderRE = regexp.MustCompile(`(?i)(\b(?:proxy-)?authorization"?\s*[:=]\s*\[?"?(?:basic|bearer|digest|token|negotiate|dpop|apikey|key)\s+)[^\s"\\,\]]+`)
	// bearerRE finds "Bearer <token68>" of at least 8 characters whose token is not a
	// challenge parameter (name=…): a token without padding must not be followed by "=", a
	// padded one not by a quote or a value (realm="…", resource_metadata=https://…).
	bearerRE       = regexp.MustCompile(`(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]{8,}([^A-Za-z0-9\-._~+/=*]|$)`)
	bearerPaddedRE = regexp.MustCompile(`(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]{8,}=+([^A-Za-z0-9\-._~+/="*]|$)`)
	// jsonFieldRE finds "name": "value" for credential fields of OAuth and similar payloads.
	jsonFieldRE = regexp.MustCompile(`(?i)(\\?"(?:access_token|refresh_token|id_token|client_secret|password|secret|token|api_key|apikey)\\?"\s*:\s*\\?")(?:[^"\\]|\\[^"])*(\\?")`)
	// kvFieldRE finds name=value for the same fields in form-encoded or key=value text.
	kvFieldRE = regexp.MustCompile(`(?i)(\b(?:access_token|refresh_token|id_token|client_secret|api_key|apikey)=)[^&\s"'\\]+`)
)

// Err returns err with its message passed through Text, or nil for nil. The result unwraps
// to err, so errors.Is and errors.As still see the original chain; only Error() is masked.
// Use it for an error that is logged, stored (a source's last error) or shown.
func Err(err error) error {
	if err == nil {
		return nil
	}
	return redactedError{err}
}

type redactedError struct{ err error }

func (e redactedError) Error() string { return Text(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

// Value returns value, or Mask when name (a header, query parameter or environment variable
// name) looks secret by IsSecretName; for showing configured literals such as a stdio
// source's --env values.
func Value(name, value string) string {
	if value != "" && IsSecretName(name) {
		return Mask
	}
	return value
}

// strongSecretFlag matches flag names that always take a secret as their value.
var strongSecretFlag = regexp.MustCompile(`(?i)(token|secret|password|passwd|api[-_]?key)`)

// Args returns a copy of a command line (a stdio source's argv) fit to show: every argument
// passed through Text, the value of --name=value masked when name looks secret
// (IsSecretName), and the argument after a flag such as --token, --password or --api-key
// masked. The argv itself is not changed.
func Args(argv []string) []string {
	out := make([]string, len(argv))
	maskNext := false
	for i, a := range argv {
		switch {
		case maskNext && !strings.HasPrefix(a, "-"):
			out[i] = Mask
		case strings.HasPrefix(a, "-") && strings.Contains(a, "="):
			name, value, _ := strings.Cut(a, "=")
			out[i] = name + "=" + Text(value)
			if value != "" && IsSecretName(strings.TrimLeft(name, "-")) {
				out[i] = name + "=" + Mask
			}
		default:
			out[i] = Text(a)
		}
		maskNext = strings.HasPrefix(a, "-") && !strings.Contains(a, "=") && strongSecretFlag.MatchString(a)
	}
	return out
}
