package devtemporal

import (
	"log/slog"
	"sync/atomic"

	sdklog "go.temporal.io/sdk/log"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// gate filters a logger's entries by level, and drops all but the most severe while quiet is
// set. Unlike zap.IncreaseLevel it never complains when level is below the logger's own.
func gate(level zapcore.LevelEnabler, quiet *atomic.Bool) zap.Option {
	return zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return gatedCore{Core: c, level: level, quiet: quiet}
	})
}

type gatedCore struct {
	zapcore.Core
	level zapcore.LevelEnabler
	quiet *atomic.Bool
}

func (c gatedCore) allowed(l zapcore.Level) bool {
	if c.quiet.Load() {
		return l >= zapcore.DPanicLevel
	}
	return c.level.Enabled(l)
}

func (c gatedCore) Enabled(l zapcore.Level) bool { return c.allowed(l) && c.Core.Enabled(l) }

func (c gatedCore) With(fields []zapcore.Field) zapcore.Core {
	return gatedCore{Core: c.Core.With(fields), level: c.level, quiet: c.quiet}
}

func (c gatedCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.allowed(e.Level) {
		return ce
	}
	return c.Core.Check(e, ce)
}

// SDKLogger adapts a zap logger to the Temporal SDK's logger interface.
func SDKLogger(l *zap.Logger) sdklog.Logger {
	return sdklog.NewStructuredLogger(slog.New(zapslog.NewHandler(l.Core())))
}
