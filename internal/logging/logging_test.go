package logging_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/logging"
)

// A secret that reaches a log line through any path — message, error field, string field,
// a field added with With, the Temporal adapter — is masked in what is written (issue 14
// item 3: session failure logs must not carry a URL's credentials or a bearer token).
func TestLogLinesAreRedacted(t *testing.T) {
	const (
		pw    = "hunter2pw"
		token = "tok3nVALUE123"
	)
	sessionErr := fmt.Errorf("session: %w", errors.New(`Post "https://user:`+pw+`@mcp.example/mcp?api_key=`+token+`": 401 Unauthorized`))
	for _, tc := range []struct {
		name string
		log  func(*zap.Logger)
	}{
		{"error field", func(l *zap.Logger) { l.Warn("session failed", zap.Error(sessionErr)) }},
		{"message", func(l *zap.Logger) { l.Error("cannot open postgres://mcpsync:" + pw + "@db:5432/ledger") }},
		{"string field", func(l *zap.Logger) { l.Info("connect", zap.String("url", "https://x:"+pw+"@h/mcp")) }},
		{"with field", func(l *zap.Logger) {
			l.With(zap.String("dsn", "host=db user=u password="+pw)).Info("opened")
		}},
		{"bearer", func(l *zap.Logger) { l.Info("sent", zap.String("header", "Authorization: Bearer "+token)) }},
		{"any field", func(l *zap.Logger) { l.Info("cfg", zap.Any("cfg", map[string]string{"url": "https://u:" + pw + "@h"})) }},
		{"stringer", func(l *zap.Logger) { l.Info("err", zap.Stringer("e", stringer(`{"access_token":"`+token+`"}`))) }},
		{"temporal adapter", func(l *zap.Logger) { logging.Temporal(l).Warn("activity failed", "Error", sessionErr) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tc.log(zap.New(logging.NewCore(zapcore.AddSync(&buf), zapcore.DebugLevel)))
			out := buf.String()
			if out == "" {
				t.Fatal("nothing logged")
			}
			for _, secret := range []string{pw, token} {
				if strings.Contains(out, secret) {
					t.Errorf("log line carries a secret %q:\n%s", secret, out)
				}
			}
			if !strings.Contains(out, "***") {
				t.Errorf("log line has no mask:\n%s", out)
			}
		})
	}
}

// Lines without secrets are written exactly as the plain console encoder writes them.
func TestLogLinesWithoutSecretsUnchanged(t *testing.T) {
	var plain, red bytes.Buffer
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	log := func(core zapcore.Core) {
		zap.New(core).Info("session open", zap.String("server", "demo 1.0"), zap.String("url", "https://h/mcp?page=2"), zap.Int64("generation", 3))
	}
	log(zapcore.NewCore(enc.Clone(), zapcore.AddSync(&plain), zapcore.DebugLevel))
	log(zapcore.NewCore(logging.RedactingEncoder(enc.Clone()), zapcore.AddSync(&red), zapcore.DebugLevel))
	// The time differs between the two lines; compare what follows it.
	_, p, _ := strings.Cut(plain.String(), "\t")
	_, r, _ := strings.Cut(red.String(), "\t")
	if p != r {
		t.Errorf("redacting encoder changed a line without secrets:\nplain %q\nred   %q", p, r)
	}
}

type stringer string

func (s stringer) String() string { return string(s) }
