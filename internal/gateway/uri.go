package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Scheme is the URI scheme of every resource the gateway serves.
const Scheme = "mcpsync"

// ErrBadURI is wrapped by every ParseURI failure.
var ErrBadURI = errors.New("not a gateway URI")

// URI names an upstream resource of a source: mcpsync://SOURCE/ followed by the upstream URI
// percent-encoded as one path segment (url.PathEscape), so any upstream URI round-trips.
type URI struct {
	Source   string // the source's name
	Upstream string // the upstream server's URI, exactly
}

// String returns the gateway URI of u.
func (u URI) String() string {
	return Scheme + "://" + u.Source + "/" + url.PathEscape(u.Upstream)
}

// ParseURI inverts URI.String. It refuses anything else (another scheme, an empty source or
// upstream URI, extra path segments, a query or fragment) with an error wrapping ErrBadURI that
// says what is wrong.
func ParseURI(s string) (URI, error) {
	rest, ok := strings.CutPrefix(s, Scheme+"://")
	if !ok {
		return URI{}, fmt.Errorf("%w: %q does not start with %s://", ErrBadURI, s, Scheme)
	}
	source, enc, ok := strings.Cut(rest, "/")
	if !ok || source == "" {
		return URI{}, fmt.Errorf("%w: %q has no source name (want %s://SOURCE/ENCODED-URI)", ErrBadURI, s, Scheme)
	}
	if enc == "" {
		return URI{}, fmt.Errorf("%w: %q has no upstream URI after the source name", ErrBadURI, s)
	}
	if strings.ContainsAny(enc, "/?#") {
		return URI{}, fmt.Errorf("%w: %q: the upstream URI must be one percent-encoded path segment", ErrBadURI, s)
	}
	up, err := url.PathUnescape(enc)
	if err != nil {
		return URI{}, fmt.Errorf("%w: %q: %v", ErrBadURI, s, err)
	}
	if strings.ContainsAny(source, "%?#@:") {
		return URI{}, fmt.Errorf("%w: %q: bad source name %q", ErrBadURI, s, source)
	}
	return URI{Source: source, Upstream: up}, nil
}
