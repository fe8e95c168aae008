// Package guard is the output guard content passes before it may reach a model (SPEC.md R22):
// a defence against hostile tool output. A Policy checks, in this order, and stops at the first
// rejection:
//
//  1. Size: a body larger than MaxBytes is rejected.
//  2. MIME type: the type (parameters ignored, case-insensitive) must match the allow-list;
//     patterns are exact ("application/json"), a wildcard subtype ("text/*") or a structured
//     suffix ("application/*+json"). An absent MIME type is treated as text/plain.
//  3. Encoding: a textual type must be valid UTF-8, else rejected.
//  4. Control characters, in textual types only: C0 controls except TAB, LF and CR; DEL; C1
//     controls (U+0080-U+009F); the bidirectional embeddings, overrides and isolates
//     (U+202A-U+202E, U+2066-U+2069, the "Trojan Source" characters); invisible separators
//     (U+200B, U+2060, U+FEFF); and Unicode tag characters (U+E0000-U+E007F, used to smuggle
//     invisible instructions). With ControlStrip (the default) they are removed and the
//     verdict is Sanitized: the bytes delivered are the stripped body, whose digest differs
//     from the accepted one, and the count is recorded. With ControlReject the content is
//     rejected. Joiners (U+200C, U+200D) are kept: emoji and several scripts need them.
//  5. Checkers: each pluggable Checker sees the (sanitized) body and may reject it.
//
// A verdict depends only on the content and the policy, so callers store it once per (content
// digest, Policy.ID()). Change a checker's Name when its behaviour changes, so that verdicts of
// the old behaviour are not reused.
package guard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"mime"
	"slices"
	"strings"
	"unicode/utf8"
)

// Outcome is a verdict's outcome; the strings are the ones the ledger stores.
type Outcome string

// Outcomes.
const (
	Pass      Outcome = "PASS"      // deliver the body as it is
	Sanitized Outcome = "SANITIZED" // deliver Verdict.Body, from which characters were removed
	Rejected  Outcome = "REJECTED"  // deliver nothing
)

// Content is what the guard inspects.
type Content struct {
	URI      string
	MIMEType string
	Body     []byte
}

// Verdict is the guard's decision on one content.
type Verdict struct {
	Outcome  Outcome
	Reasons  []string // why it was rejected or sanitized, e.g. "size: 2048 bytes > 1024"
	Body     []byte   // the bytes that may be delivered: nil when Rejected
	Stripped int      // control characters removed
}

// Finding is one checker's answer.
type Finding struct {
	Reject bool
	Reason string
}

// Checker is a pluggable content check (a prompt-injection classifier, a secret scanner, ...).
// Check returns an error only when it cannot decide; the guard then gives no verdict.
type Checker interface {
	// Name identifies the checker and its behaviour in the policy ID, e.g. "secrets/v2".
	Name() string
	Check(ctx context.Context, c Content) (Finding, error)
}

// CheckerFunc adapts a function to a Checker.
type CheckerFunc struct {
	ID string
	Fn func(ctx context.Context, c Content) (Finding, error)
}

// Name returns f.ID.
func (f CheckerFunc) Name() string { return f.ID }

// Check calls f.Fn.
func (f CheckerFunc) Check(ctx context.Context, c Content) (Finding, error) { return f.Fn(ctx, c) }

// ControlAction is what happens to control characters in textual content.
type ControlAction string

// Control actions.
const (
	ControlStrip  ControlAction = "strip"
	ControlReject ControlAction = "reject"
)

// Policy is one guard configuration.
type Policy struct {
	MaxBytes  int64
	AllowMIME []string
	Controls  ControlAction
	Checkers  []Checker
}

// DefaultMaxBytes is the default size cap: 1 MiB.
const DefaultMaxBytes = 1 << 20

// DefaultAllowMIME is the default allow-list: textual types only.
var DefaultAllowMIME = []string{
	"text/*", "application/json", "application/*+json", "application/xml", "application/*+xml",
	"application/yaml", "application/x-yaml", "application/toml", "application/javascript",
}

// Default returns the default policy: 1 MiB, textual types, control characters stripped, no
// checkers.
func Default() Policy {
	return Policy{MaxBytes: DefaultMaxBytes, AllowMIME: slices.Clone(DefaultAllowMIME), Controls: ControlStrip}
}

// String describes the policy; ID is derived from it.
func (p Policy) String() string {
	names := make([]string, len(p.Checkers))
	for i, c := range p.Checkers {
		names[i] = c.Name()
	}
	allow := slices.Clone(p.AllowMIME)
	for i := range allow {
		allow[i] = strings.ToLower(allow[i])
	}
	slices.Sort(allow)
	return fmt.Sprintf("guard/v1 max=%d mime=%s controls=%s checks=%s",
		p.MaxBytes, strings.Join(allow, ","), p.controls(), strings.Join(names, ","))
}

// ID is a short stable identifier of the policy: equal policies have equal IDs, and any change
// of limit, allow-list, control action or checker name changes it.
func (p Policy) ID() string {
	sum := sha256.Sum256([]byte(p.String()))
	return "guard-" + hex.EncodeToString(sum[:6])
}

func (p Policy) controls() ControlAction {
	if p.Controls == "" {
		return ControlStrip
	}
	return p.Controls
}

// Evaluate runs the policy on c. An error means a checker could not decide.
func (p Policy) Evaluate(ctx context.Context, c Content) (Verdict, error) {
	reject := func(format string, args ...any) (Verdict, error) {
		return Verdict{Outcome: Rejected, Reasons: []string{fmt.Sprintf(format, args...)}}, nil
	}
	if p.MaxBytes > 0 && int64(len(c.Body)) > p.MaxBytes {
		return reject("size: %d bytes > cap %d", len(c.Body), p.MaxBytes)
	}
	mt := mediaType(c.MIMEType)
	if !p.allowed(mt) {
		return reject("mime: %q is not allowed", mt)
	}
	v := Verdict{Outcome: Pass, Body: c.Body}
	if textual(mt) {
		if !utf8.Valid(c.Body) {
			return reject("encoding: %s body is not valid UTF-8", mt)
		}
		clean, n, first := stripControls(c.Body)
		if n > 0 {
			if p.controls() == ControlReject {
				return reject("controls: %d control character(s), first %U", n, first)
			}
			v = Verdict{Outcome: Sanitized, Body: clean, Stripped: n,
				Reasons: []string{fmt.Sprintf("controls: stripped %d control character(s), first %U", n, first)}}
		}
	}
	for _, ch := range p.Checkers {
		f, err := ch.Check(ctx, Content{URI: c.URI, MIMEType: mt, Body: v.Body})
		if err != nil {
			return Verdict{}, fmt.Errorf("guard: checker %s: %w", ch.Name(), err)
		}
		if f.Reject {
			return reject("%s: %s", ch.Name(), f.Reason)
		}
	}
	return v, nil
}

// mediaType returns the lower-case type/subtype of a MIME type, text/plain when empty.
func mediaType(s string) string {
	if strings.TrimSpace(s) == "" {
		return "text/plain"
	}
	if mt, _, err := mime.ParseMediaType(s); err == nil {
		return mt
	}
	mt, _, _ := strings.Cut(s, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

func (p Policy) allowed(mt string) bool {
	typ, sub, ok := strings.Cut(mt, "/")
	if !ok || typ == "" || sub == "" {
		return false
	}
	for _, pat := range p.AllowMIME {
		pat = strings.ToLower(strings.TrimSpace(pat))
		ptyp, psub, _ := strings.Cut(pat, "/")
		switch {
		case pat == mt:
			return true
		case ptyp != typ:
		case psub == "*":
			return true
		case strings.HasPrefix(psub, "*+") && strings.HasSuffix(sub, psub[1:]) && len(sub) > len(psub)-1:
			return true
		}
	}
	return false
}

// textual reports types whose bodies are text and get the encoding and control checks.
func textual(mt string) bool {
	typ, sub, _ := strings.Cut(mt, "/")
	if typ == "text" {
		return true
	}
	switch sub {
	case "json", "xml", "yaml", "x-yaml", "toml", "javascript", "ecmascript", "x-sh", "sql", "graphql":
		return typ == "application"
	}
	return strings.HasSuffix(sub, "+json") || strings.HasSuffix(sub, "+xml") || strings.HasSuffix(sub, "+yaml")
}

// IsControl reports whether the guard removes (or rejects) r in textual content.
func IsControl(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r':
		return false
	case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r == 0x200b || r == 0x2060 || r == 0xfeff:
		return true
	case r >= 0xe0000 && r <= 0xe007f:
		return true
	}
	return false
}

// stripControls removes control characters from valid UTF-8, returning the result, how many
// were removed and the first one.
func stripControls(b []byte) ([]byte, int, rune) {
	n := 0
	var first rune
	var out []byte
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if IsControl(r) {
			if n == 0 {
				first = r
				out = append(make([]byte, 0, len(b)), b[:i]...)
			}
			n++
		} else if n > 0 {
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	if n == 0 {
		return b, 0, 0
	}
	return out, n, first
}
