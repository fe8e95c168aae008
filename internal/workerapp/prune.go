package workerapp

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Environment variables of the worker's retention schedule (issue 17 item 6).
const (
	// EnvPruneEvery: how often the worker runs `mcpsync prune` itself, as a Go duration
	// ("1h"); unset, empty or "0" is off (the default).
	EnvPruneEvery = "MCPSYNC_PRUNE_EVERY"
	// EnvPruneOlderThan: the age below which rows are kept (default ledger.DefaultPruneOlderThan).
	EnvPruneOlderThan = "MCPSYNC_PRUNE_OLDER_THAN"
)

// MinPruneEvery is the shortest schedule the worker accepts: a prune examines every row of the
// tables it visits, so running it back to back would only load the ledger.
const MinPruneEvery = time.Minute

// PruneSchedule is the worker's retention schedule: every Every, a ledger.Prune of the rows
// older than OlderThan. A zero Every is off.
type PruneSchedule struct {
	Every     time.Duration
	OlderThan time.Duration
}

// PruneScheduleFromEnv reads the schedule from getenv (EnvPruneEvery, EnvPruneOlderThan). A
// malformed or out-of-range value is an error naming the variable, so the worker refuses to
// start rather than prune on a schedule nobody asked for.
func PruneScheduleFromEnv(getenv func(string) string) (PruneSchedule, error) {
	s := PruneSchedule{OlderThan: ledger.DefaultPruneOlderThan}
	if v := getenv(EnvPruneEvery); v != "" && v != "0" {
		d, err := time.ParseDuration(v)
		if err != nil || d < MinPruneEvery {
			return PruneSchedule{}, fmt.Errorf("%s=%q: want a duration of at least %s (e.g. 1h), or 0 for off", EnvPruneEvery, v, MinPruneEvery)
		}
		s.Every = d
	}
	if v := getenv(EnvPruneOlderThan); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return PruneSchedule{}, fmt.Errorf("%s=%q: want a duration of 0 or more (e.g. 720h)", EnvPruneOlderThan, v)
		}
		s.OlderThan = d
	}
	return s, nil
}

// pruneSchedule is cfg.Prune, or the schedule of the process environment when it is nil.
func (cfg Config) pruneSchedule() (PruneSchedule, error) {
	if cfg.Prune != nil {
		if cfg.Prune.Every < 0 || cfg.Prune.OlderThan < 0 {
			return PruneSchedule{}, fmt.Errorf("prune schedule %+v: negative duration", *cfg.Prune)
		}
		return *cfg.Prune, nil
	}
	return PruneScheduleFromEnv(os.Getenv)
}

// RunPruneSchedule prunes st every s.Every until ctx ends (immediately if s.Every is zero),
// logging each run's totals and each failure; a failed run is retried at the next tick. Several
// workers may run it at once: every prune statement carries its whole keep-condition, so two
// prunes only ever delete each row once. It returns the number of runs that completed.
func RunPruneSchedule(ctx context.Context, st *ledger.Store, s PruneSchedule, log *zap.Logger) int {
	if s.Every <= 0 {
		return 0
	}
	if log == nil {
		log = zap.NewNop()
	}
	log.Info("prune schedule", zap.Duration("every", s.Every), zap.Duration("older_than", s.OlderThan))
	tick := time.NewTicker(s.Every)
	defer tick.Stop()
	runs := 0
	for {
		select {
		case <-ctx.Done():
			return runs
		case <-tick.C:
		}
		rep, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: s.OlderThan})
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("prune failed; retried at the next tick", zap.Error(err))
			}
			continue
		}
		runs++
		fields := []zap.Field{zap.Int64("deleted", rep.Deleted()), zap.Duration("elapsed", rep.Elapsed), zap.Time("cutoff", rep.Cutoff)}
		for _, t := range rep.Tables {
			if t.Deleted > 0 {
				fields = append(fields, zap.Int64(t.Table, t.Deleted))
			}
		}
		log.Info("pruned", fields...)
	}
}

// startPrune runs the schedule in a goroutine bound to ctx (the worker's host context, ended by
// Stop).
func startPrune(ctx context.Context, st *ledger.Store, s PruneSchedule, log *zap.Logger) {
	if s.Every > 0 {
		go RunPruneSchedule(ctx, st, s, log)
	}
}
