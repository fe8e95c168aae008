package pgcluster

import (
	"bytes"
	"strings"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// lineLog is the server's stdout/stderr: it logs each line through zap at a level derived from
// PostgreSQL's severity and keeps the last lines for error messages.
type lineLog struct {
	log  *zap.Logger
	keep int

	mu      sync.Mutex
	partial []byte
	last    []string
}

func newLineLog(log *zap.Logger, keep int) *lineLog {
	return &lineLog{log: log, keep: keep}
}

// Write implements io.Writer; it never fails.
func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(l.partial[:i]), "\r")
		l.partial = l.partial[i+1:]
		if line == "" {
			continue
		}
		l.last = append(l.last, line)
		if len(l.last) > l.keep {
			l.last = l.last[len(l.last)-l.keep:]
		}
		l.log.Log(severity(line), line)
	}
	return len(p), nil
}

// Tail returns the last lines written, newline-separated.
func (l *lineLog) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}

// severity maps a PostgreSQL log line to a zap level. Client errors (ERROR) are routine — a
// failed statement in a test, a unique violation — so they are logged at info level, and so are
// the FATAL lines every start-up and shutdown produces.
func severity(line string) zapcore.Level {
	switch {
	case strings.HasPrefix(line, "PANIC:"):
		return zapcore.ErrorLevel
	case strings.HasPrefix(line, "FATAL:"):
		for _, routine := range []string{"the database system is", "terminating connection due to administrator command"} {
			if strings.Contains(line, routine) {
				return zapcore.DebugLevel
			}
		}
		return zapcore.WarnLevel
	case strings.HasPrefix(line, "WARNING:"):
		return zapcore.WarnLevel
	case strings.HasPrefix(line, "ERROR:"):
		return zapcore.InfoLevel
	default:
		return zapcore.DebugLevel
	}
}
