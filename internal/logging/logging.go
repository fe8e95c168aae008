// Package logging builds mcpsync's zap loggers and adapts them for the Temporal SDK, so that
// every component logs structured lines through one core. Every line those loggers write is
// passed through redact.Text after encoding (issue 14 item 3): a URL's credentials, a
// connection string's password, a bearer token or an OAuth token field that reaches a log
// message, an error or any other field is masked before it leaves the process.
package logging

import (
	"fmt"
	"log/slog"
	"os"

	"go.temporal.io/sdk/log"
	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// New returns a console logger on stderr at level ("debug", "info", "warn", "error") whose
// lines are redacted (see RedactingEncoder).
func New(level string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return zap.New(NewCore(zapcore.Lock(os.Stderr), lvl)), nil
}

// NewCore returns the console core New uses, writing redacted lines to w at level lvl and
// above.
func NewCore(w zapcore.WriteSyncer, lvl zapcore.LevelEnabler) zapcore.Core {
	cfg := zap.NewDevelopmentEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	return zapcore.NewCore(RedactingEncoder(zapcore.NewConsoleEncoder(cfg)), w, lvl)
}

// RedactingEncoder wraps enc so that every encoded line — message, logger name, fields
// added with With and fields of the entry, whatever their type — is passed through
// redact.Text before it is written. Lines without secrets are written unchanged.
func RedactingEncoder(enc zapcore.Encoder) zapcore.Encoder {
	return redactingEncoder{enc}
}

type redactingEncoder struct{ zapcore.Encoder }

func (e redactingEncoder) Clone() zapcore.Encoder { return redactingEncoder{e.Encoder.Clone()} }

func (e redactingEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	buf, err := e.Encoder.EncodeEntry(ent, fields)
	if err != nil {
		return buf, err
	}
	line := buf.String()
	if masked := redact.Text(line); masked != line {
		buf.Reset()
		buf.AppendString(masked)
	}
	return buf, nil
}

// Temporal adapts a zap logger to the Temporal SDK's logger interface.
func Temporal(z *zap.Logger) log.Logger {
	return log.NewStructuredLogger(slog.New(zapslog.NewHandler(z.Core())))
}
