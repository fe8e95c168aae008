package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Server-supplied text at the ledger's boundary.
//
// PostgreSQL's text type rejects the NUL character and (in a UTF8 database) invalid UTF-8;
// jsonb additionally rejects the JSON escape \u0000. A server that puts either into its
// serverInfo, a resource name, a MIME type or an error message would otherwise make the
// statement that stores it fail on every retry. Every column the ledger fills from what a
// server said therefore goes through SafeText (or SafeTexts, SafeJSON) first:
//
//   - a NUL byte becomes the six characters \u0000;
//   - each byte that is not part of valid UTF-8 becomes the four characters \xNN (upper-case
//     hex of the byte);
//   - everything else, including other control characters, is kept as it is: it is storable,
//     and the CLI escapes it when it prints it.
//
// SafeText is the identity on every string PostgreSQL accepts, so stored data that was valid
// before reads back unchanged. The escape is visible and "reversible enough": a reader can see
// exactly which bytes were replaced, but a backslash that the server itself sent is not
// escaped, so the original bytes cannot always be recovered mechanically. Identity columns
// (URIs) never need it: a normalized URI contains no control or non-ASCII byte (internal/uri).

// SafeText returns s with every NUL byte replaced by `\u0000` and every byte of invalid UTF-8
// replaced by `\xNN`, so that PostgreSQL text accepts it. It returns s itself when nothing needs
// replacing.
func SafeText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02X`, s[i])
		case r == 0:
			b.WriteString(`\u0000`)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// SafeTexts applies SafeText to every element; it returns ss itself when nothing changes.
func SafeTexts(ss []string) []string {
	var out []string
	for i, s := range ss {
		safe := SafeText(s)
		if safe != s && out == nil {
			out = make([]string, len(ss))
			copy(out, ss)
		}
		if out != nil {
			out[i] = safe
		}
	}
	if out == nil {
		return ss
	}
	return out
}

// SafeJSON returns raw in a form PostgreSQL jsonb accepts: every string (object keys included)
// has NUL and invalid UTF-8 escaped as SafeText does. Valid JSON that needs no change is
// returned as it is; JSON that needs a change is decoded and re-encoded (numbers kept exactly;
// object key order, which jsonb does not keep anyway, may change). Input that is not JSON at
// all is stored as one JSON string holding SafeText of it, so the receipt is kept, not lost.
// Empty input returns nil (SQL NULL).
func SafeJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	fixed := escapeRawBytes(raw)
	if !json.Valid(fixed) {
		out, _ := json.Marshal(SafeText(string(raw))) // a string always marshals
		return out
	}
	if !bytes.Contains(fixed, []byte(`\u0000`)) {
		return fixed
	}
	dec := json.NewDecoder(bytes.NewReader(fixed))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		out, _ := json.Marshal(SafeText(string(raw)))
		return out
	}
	out, err := json.Marshal(safeValue(v))
	if err != nil {
		out, _ = json.Marshal(SafeText(string(raw)))
	}
	return out
}

// escapeRawBytes replaces NUL bytes and invalid UTF-8 in raw JSON text by the JSON spelling of
// SafeText's escapes (a backslash is itself escaped inside a JSON string), so that a string
// holding them stays valid JSON and decodes to SafeText's result.
func escapeRawBytes(raw []byte) []byte {
	if utf8.Valid(raw) && bytes.IndexByte(raw, 0) < 0 {
		return raw
	}
	var b bytes.Buffer
	for i := 0; i < len(raw); {
		r, size := utf8.DecodeRune(raw[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\\x%02X`, raw[i])
		case r == 0:
			b.WriteString(`\\u0000`)
		default:
			b.Write(raw[i : i+size])
		}
		i += size
	}
	return b.Bytes()
}

// safeValue applies SafeText to every string in a decoded JSON value, keys included.
func safeValue(v any) any {
	switch x := v.(type) {
	case string:
		return SafeText(x)
	case []any:
		for i := range x {
			x[i] = safeValue(x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[SafeText(k)] = safeValue(e)
		}
		return out
	default:
		return v
	}
}
