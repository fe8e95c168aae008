// Package logging builds mcpsync's zap loggers and adapts them for the Temporal SDK, so that
// every component logs structured lines through one core.
package logging

import (
	"fmt"
	"log/slog"
	"os"

	"go.temporal.io/sdk/log"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// New returns a console logger on stderr at level ("debug", "info", "warn", "error").
func New(level string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	cfg := zap.NewDevelopmentEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(cfg), zapcore.Lock(os.Stderr), lvl)
	return zap.New(core), nil
}

// Temporal adapts a zap logger to the Temporal SDK's logger interface.
func Temporal(z *zap.Logger) log.Logger {
	return log.NewStructuredLogger(slog.New(zapslog.NewHandler(z.Core())))
}
