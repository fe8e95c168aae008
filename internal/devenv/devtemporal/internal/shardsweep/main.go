// Command shardsweep measures the embedded Temporal server (devtemporal) with the floor
// workload (internal/harness/floor) over history shard counts and history.shardIOConcurrency
// values, on the SQLite file and on PostgreSQL (a private durable cluster, as mcpsync-dev
// starts it), to choose devtemporal's defaults (issue 16 item 2). Each configuration runs on a
// fresh data directory / fresh databases; configurations and persistences are interleaved in
// the order given, and a configuration listed twice is measured twice (the mean is reported).
// The first configuration is the baseline of the summary lines:
//
//	bench: shards-<persistence>-<S>x<IO>-accepted-<n> <v> /s (baseline shards-<persistence>-<first>-accepted-<n> <v> /s, ratio <r>)
//
//	go run ./internal/devenv/devtemporal/internal/shardsweep [-workflows 1000] [-rate 150] [-duration 15s] [-configs 1x1,4x8] [-only sqlite,postgres]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/harness/floor"
	"github.com/mcpsync/mcpsync/internal/redact"
)

func main() {
	n := flag.Int("workflows", 1000, "entity workflows")
	rate := flag.Float64("rate", 150, "offered signals per second")
	d := flag.Duration("duration", 15*time.Second, "offered phase")
	configs := flag.String("configs", "1x1,4x1,4x8,8x8,4x32", "SHARDSxIO pairs")
	only := flag.String("only", "sqlite,postgres", "persistences")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *n, *rate, *d, *configs, *only); err != nil {
		fmt.Fprintln(os.Stderr, "shardsweep:", redact.Text(err.Error()))
		os.Exit(1)
	}
}

func run(ctx context.Context, n int, rate float64, d time.Duration, configs, only string) error {
	tmp, err := os.MkdirTemp("", "mcpsync-shardsweep-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	log := zap.NewNop()
	var admin string
	pers := strings.Split(only, ",")
	if slices.Contains(pers, "postgres") {
		if err := pgcluster.EnsureInstalled(ctx, log); err != nil {
			return err
		}
		password, err := pgcluster.NewPassword()
		if err != nil {
			return err
		}
		cl, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: tmp + "/pg", Password: password, Logger: log,
			Settings: map[string]string{"max_connections": "200"}})
		if err != nil {
			return err
		}
		defer func() {
			if err := cl.Stop(context.WithoutCancel(ctx)); err == nil {
				_ = cl.RemoveData()
			}
		}()
		admin = cl.AdminURL()
	}
	fmt.Printf("floor: %d workflows, offered %.0f/s for %s\n", n, rate, d)
	type key struct{ p, cfg string }
	var order []key
	acc, p99 := map[key][]float64{}, map[key][]float64{}
	seq := 0
	for _, cfg := range strings.Split(configs, ",") {
		a, b, _ := strings.Cut(cfg, "x")
		shards, err1 := strconv.Atoi(a)
		io, err2 := strconv.Atoi(b)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("bad config %q (want SHARDSxIO)", cfg)
		}
		for _, p := range pers {
			seq++
			opts := devtemporal.Options{
				DataDir: fmt.Sprintf("%s/t-%d", tmp, seq), DisableUI: true, Persistence: devtemporal.Persistence(p),
				HistoryShards: int32(shards), ShardIOConcurrency: io,
			}
			if p == "postgres" {
				opts.Postgres = &devtemporal.Postgres{URL: admin, Database: fmt.Sprintf("sweep_%d", seq), VisibilityDatabase: fmt.Sprintf("sweep_%d_vis", seq)}
			}
			s, err := devtemporal.Start(ctx, opts)
			if err != nil {
				return err
			}
			c, err := client.DialContext(ctx, client.Options{HostPort: s.FrontendAddress(), Namespace: s.Namespace(), Logger: devtemporal.SDKLogger(log)})
			if err != nil {
				s.Stop()
				return err
			}
			t0 := time.Now()
			res, err := floor.Run(ctx, c, "sweep", n, rate, d)
			c.Close()
			s.Stop()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				fmt.Printf("  %-8s shards %d io %2d: FAILED %v\n", p, shards, io, err)
				continue
			}
			startRate := float64(n) / res.Start.Sub(t0).Seconds()
			k := key{p, cfg}
			if _, ok := acc[k]; !ok {
				order = append(order, k)
			}
			acc[k] = append(acc[k], res.AcceptedPerSec)
			p99[k] = append(p99[k], ms(res.P99))
			fmt.Printf("  %-8s shards %d io %2d: start+ready %.0f/s; offered %.1f/s accepted %.1f/s (%d/%d, errors %d), p50 %.0fms p99 %.0fms max %.0fms\n",
				p, shards, io, startRate, res.Offered, res.AcceptedPerSec, res.Accepted, res.Sent, res.SignalErrors, ms(res.P50), ms(res.P99), ms(res.Max))
		}
	}
	first := strings.Split(configs, ",")[0]
	for _, k := range order {
		base := key{k.p, first}
		if len(acc[base]) == 0 {
			continue
		}
		for _, f := range []struct {
			name, unit string
			m          map[key][]float64
		}{{"accepted", "/s", acc}, {"p99", "ms", p99}} {
			v, b := mean(f.m[k]), mean(f.m[base])
			fmt.Printf("bench: shards-%s-%s-%s-%d %.1f %s (baseline shards-%s-%s-%s-%d %.1f %s, ratio %.2f)\n",
				k.p, k.cfg, f.name, n, v, f.unit, k.p, first, f.name, n, b, f.unit, v/b)
		}
	}
	return nil
}

func mean(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
