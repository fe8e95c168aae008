#!/usr/bin/env bash
# `make run`: the embedded default end to end. Starts mcpsync-dev (Temporal + Web UI + private
# PostgreSQL) and mcpsync-worker, registers the demo MCP server as source "demo" (it speaks both
# MCP eras; --protocol auto negotiates 2026-07-28), subscribes to two of its resources, shows
# `mcpsync status` (demo://notes/1 watched: notify; demo://clock/now, which the server leaves out
# of its subscriptions/listen acknowledgement: poll (not acknowledged)) and prints a line per
# accepted version until Ctrl-C; then it stops everything it started. Both services get --parent-pid $$: if this script dies without
# stopping them (SIGKILL, a closed terminal), they stop themselves instead of holding the
# ports 7233, 8233 and 55432 for the next run; a port still held is reported by mcpsync-dev
# with the PID that holds it and how to stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin
data=${MCPSYNC_DATA:-$PWD/.data}
mkdir -p "$data"
dev_pid= worker_pid=

stop() {
  trap - EXIT INT TERM HUP
  echo
  echo "run: stopping"
  [ -n "$worker_pid" ] && kill -TERM "$worker_pid" 2>/dev/null || true
  [ -n "$worker_pid" ] && wait "$worker_pid" 2>/dev/null || true
  [ -n "$dev_pid" ] && kill -TERM "$dev_pid" 2>/dev/null || true
  [ -n "$dev_pid" ] && wait "$dev_pid" 2>/dev/null || true
  echo "run: stopped (data kept in $data; logs: $data/dev.log, $data/worker.log)"
}
trap stop EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP

rm -f "$data/dev.env"
echo "run: starting mcpsync-dev (Temporal, Web UI, PostgreSQL); log: $data/dev.log"
setsid "$bin/mcpsync-dev" --data-dir "$data" --parent-pid $$ >"$data/dev.log" 2>&1 &
dev_pid=$!
for _ in $(seq 1 600); do
  [ -s "$data/dev.env" ] && break
  if ! kill -0 "$dev_pid" 2>/dev/null; then
    wait "$dev_pid" || true
    dev_pid=
    echo "run: mcpsync-dev failed to start:" >&2
    tail -n 20 "$data/dev.log" >&2
    exit 1
  fi
  sleep 0.2
done
[ -s "$data/dev.env" ] || { echo "run: mcpsync-dev did not become ready; see $data/dev.log" >&2; exit 1; }
grep 'ready' "$data/dev.log" | tail -n 1
set -a; . "$data/dev.env"; set +a

echo "run: starting mcpsync-worker; log: $data/worker.log"
setsid "$bin/mcpsync-worker" --parent-pid $$ >"$data/worker.log" 2>&1 &
worker_pid=$!

# --eras both: the demo server speaks 2026-07-28 next to 2025-11-25, and the source's default
# --protocol auto picks the newest both sides speak. It does not watch the computed
# demo://clock/now (--unwatched, its default): that subscription polls every --poll.
demo="$bin/mcpsync-demo-server --interval 3s --eras both"
from=
for _ in $(seq 1 150); do
  if out=$("$bin/mcpsync" source add demo --stdio "$demo" --protocol auto --poll 10s 2>&1); then
    echo "run: $out"
    # A new ledger: show every version from the first one; otherwise only new ones.
    case "$out" in *" added "*) from=--from-start ;; esac
    break
  fi
  case "$out" in
    *"already exists"*) echo "run: source demo already registered with another command; keeping it: $out"; break ;;
  esac
  kill -0 "$worker_pid" 2>/dev/null || { echo "run: mcpsync-worker exited:" >&2; tail -n 20 "$data/worker.log" >&2; exit 1; }
  sleep 0.2
done
for uri in demo://notes/1 demo://clock/now; do
  "$bin/mcpsync" subscribe demo "$uri" --wait 60s
done
echo "run: $bin/mcpsync status demo (the era, and how each subscription refreshes):"
"$bin/mcpsync" status demo || true
echo "run: Temporal UI: ${TEMPORAL_UI:-http://127.0.0.1:8233} (the subscription workflows are listed there)"
[ -n "${MCPSYNC_METRICS_ADDR-127.0.0.1:9464}" ] && echo "run: worker metrics: http://${MCPSYNC_METRICS_ADDR-127.0.0.1:9464}/metrics (Prometheus text)"
gw=$(grep -m1 'gateway serving' "$data/worker.log" | grep -o 'http://[^" ]*/mcp' || true); if [ -n "$gw" ]; then echo "run: MCP gateway for agents: $gw (bearer token: $bin/mcpsync token create PRINCIPAL; README \"Gateway\")"; else echo "run: MCP gateway not served (MCPSYNC_GATEWAY_ADDR; see $data/worker.log)"; fi
echo "run: accepted versions (Ctrl-C to stop):"
"$bin/mcpsync" watch $from &
watch_pid=$!
wait "$watch_pid"
