// Package redact masks secrets in text that mcpsync prints, logs or stores: the password of a
// PostgreSQL connection string (URL and key=value forms), the userinfo of a URL and the values
// of query parameters whose names look secret. It has no dependencies, so every package may use
// it on anything it is about to show.
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
	dsnPasswordRE = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)
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

// Text masks every secret shape this package knows in free text: connection strings and URLs
// with userinfo or secret query parameters.
func Text(text string) string {
	text = DSN(text)
	return urlRE.ReplaceAllStringFunc(text, URL)
}

var urlRE = regexp.MustCompile(`(?i)\bhttps?://[^\s"'<>]+`)
