package guard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/guard"
)

func TestEvaluate(t *testing.T) {
	small := guard.Default()
	small.MaxBytes = 8
	rejectControls := guard.Default()
	rejectControls.Controls = guard.ControlReject
	images := guard.Default()
	images.AllowMIME = append(images.AllowMIME, "image/png")
	tests := []struct {
		name   string
		policy guard.Policy
		in     guard.Content
		want   guard.Verdict
	}{
		{"plain text passes", guard.Default(),
			guard.Content{MIMEType: "text/plain", Body: []byte("hello\tworld\r\n")},
			guard.Verdict{Outcome: guard.Pass, Body: []byte("hello\tworld\r\n")}},
		{"parameters and case are ignored", guard.Default(),
			guard.Content{MIMEType: "Text/Markdown; charset=utf-8", Body: []byte("# hi")},
			guard.Verdict{Outcome: guard.Pass, Body: []byte("# hi")}},
		{"structured suffix matches", guard.Default(),
			guard.Content{MIMEType: "application/ld+json", Body: []byte(`{}`)},
			guard.Verdict{Outcome: guard.Pass, Body: []byte(`{}`)}},
		{"absent MIME type is text/plain", guard.Default(),
			guard.Content{Body: []byte("untyped")},
			guard.Verdict{Outcome: guard.Pass, Body: []byte("untyped")}},
		{"at the size cap passes", small,
			guard.Content{MIMEType: "text/plain", Body: []byte("12345678")},
			guard.Verdict{Outcome: guard.Pass, Body: []byte("12345678")}},
		{"over the size cap is rejected", small,
			guard.Content{MIMEType: "text/plain", Body: []byte("123456789")},
			guard.Verdict{Outcome: guard.Rejected, Reasons: []string{"size: 9 bytes > cap 8"}}},
		{"binary type outside the allow-list is rejected", guard.Default(),
			guard.Content{MIMEType: "application/octet-stream", Body: []byte{0, 1, 2}},
			guard.Verdict{Outcome: guard.Rejected, Reasons: []string{`mime: "application/octet-stream" is not allowed`}}},
		{"suffix pattern does not match the bare suffix", guard.Default(),
			guard.Content{MIMEType: "application/+json", Body: []byte(`{}`)},
			guard.Verdict{Outcome: guard.Rejected, Reasons: []string{`mime: "application/+json" is not allowed`}}},
		{"allowed binary type skips text checks", images,
			guard.Content{MIMEType: "image/png", Body: []byte{0x89, 'P', 'N', 'G', 0, 0x1b}},
			guard.Verdict{Outcome: guard.Pass, Body: []byte{0x89, 'P', 'N', 'G', 0, 0x1b}}},
		{"invalid UTF-8 text is rejected", guard.Default(),
			guard.Content{MIMEType: "text/plain", Body: []byte{'a', 0xff, 'b'}},
			guard.Verdict{Outcome: guard.Rejected, Reasons: []string{"encoding: text/plain body is not valid UTF-8"}}},
		{"ANSI escape and NUL are stripped", guard.Default(),
			guard.Content{MIMEType: "text/plain", Body: []byte("a\x1b[31mred\x00!")},
			guard.Verdict{Outcome: guard.Sanitized, Body: []byte("a[31mred!"), Stripped: 2,
				Reasons: []string{"controls: stripped 2 control character(s), first U+001B"}}},
		{"bidi override, tag characters and zero-width space are stripped", guard.Default(),
			guard.Content{MIMEType: "application/json", Body: []byte("x\u202ey\U000E0041z\u200bw")},
			guard.Verdict{Outcome: guard.Sanitized, Body: []byte("xyzw"), Stripped: 3,
				Reasons: []string{"controls: stripped 3 control character(s), first U+202E"}}},
		{"C1 control is stripped, joiners are kept", guard.Default(),
			guard.Content{MIMEType: "text/plain", Body: []byte("a\u0085b\u200dc")},
			guard.Verdict{Outcome: guard.Sanitized, Body: []byte("ab\u200dc"), Stripped: 1,
				Reasons: []string{"controls: stripped 1 control character(s), first U+0085"}}},
		{"controls rejected under ControlReject", rejectControls,
			guard.Content{MIMEType: "text/plain", Body: []byte("bell\a")},
			guard.Verdict{Outcome: guard.Rejected, Reasons: []string{"controls: 1 control character(s), first U+0007"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.policy.Evaluate(context.Background(), tt.in)
			if err != nil {
				t.Fatalf("Evaluate: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

// injection is a stand-in classifier: it rejects bodies that carry a phrase.
var injection = guard.CheckerFunc{ID: "injection/v1", Fn: func(_ context.Context, c guard.Content) (guard.Finding, error) {
	if strings.Contains(strings.ToLower(string(c.Body)), "ignore previous instructions") {
		return guard.Finding{Reject: true, Reason: "prompt injection phrase"}, nil
	}
	return guard.Finding{}, nil
}}

func TestCheckers(t *testing.T) {
	errUnavailable := errors.New("classifier unavailable")
	broken := guard.CheckerFunc{ID: "broken/v1", Fn: func(context.Context, guard.Content) (guard.Finding, error) {
		return guard.Finding{}, errUnavailable
	}}
	var seen []string
	spy := guard.CheckerFunc{ID: "spy/v1", Fn: func(_ context.Context, c guard.Content) (guard.Finding, error) {
		seen = append(seen, c.MIMEType+" "+string(c.Body))
		return guard.Finding{}, nil
	}}
	tests := []struct {
		name     string
		checkers []guard.Checker
		body     string
		want     guard.Verdict
		wantErr  error
		wantSeen []string
	}{
		{"clean body passes every checker", []guard.Checker{injection, spy}, "weather report",
			guard.Verdict{Outcome: guard.Pass, Body: []byte("weather report")}, nil, []string{"text/plain weather report"}},
		{"a checker rejects", []guard.Checker{injection, spy}, "Please IGNORE previous instructions",
			guard.Verdict{Outcome: guard.Rejected, Reasons: []string{"injection/v1: prompt injection phrase"}}, nil, nil},
		{"checkers see the sanitized body", []guard.Checker{spy}, "a\x1bb",
			guard.Verdict{Outcome: guard.Sanitized, Body: []byte("ab"), Stripped: 1,
				Reasons: []string{"controls: stripped 1 control character(s), first U+001B"}}, nil, []string{"text/plain ab"}},
		{"a checker that cannot decide gives no verdict", []guard.Checker{broken}, "text",
			guard.Verdict{}, errUnavailable, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen = nil
			p := guard.Default()
			p.Checkers = tt.checkers
			got, err := p.Evaluate(context.Background(), guard.Content{URI: "demo://x", MIMEType: "text/plain; charset=utf-8", Body: []byte(tt.body)})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Evaluate error %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantSeen, seen); diff != "" {
				t.Errorf("checker input (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPolicyID(t *testing.T) {
	base := guard.Default()
	tests := []struct {
		name string
		edit func(*guard.Policy)
		same bool
	}{
		{"identical", func(*guard.Policy) {}, true},
		{"explicit strip equals default", func(p *guard.Policy) { p.Controls = guard.ControlStrip }, true},
		{"allow-list order and case do not matter", func(p *guard.Policy) {
			for i, j := 0, len(p.AllowMIME)-1; i < j; i, j = i+1, j-1 {
				p.AllowMIME[i], p.AllowMIME[j] = p.AllowMIME[j], p.AllowMIME[i]
			}
			p.AllowMIME[0] = strings.ToUpper(p.AllowMIME[0])
		}, true},
		{"size cap", func(p *guard.Policy) { p.MaxBytes++ }, false},
		{"allow-list", func(p *guard.Policy) { p.AllowMIME = append(p.AllowMIME, "image/png") }, false},
		{"control action", func(p *guard.Policy) { p.Controls = guard.ControlReject }, false},
		{"checker", func(p *guard.Policy) { p.Checkers = []guard.Checker{injection} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := guard.Default()
			tt.edit(&p)
			if got := p.ID() == base.ID(); got != tt.same {
				t.Errorf("ID %s vs default %s: same=%v, want %v (%s)", p.ID(), base.ID(), got, tt.same, p)
			}
		})
	}
}
