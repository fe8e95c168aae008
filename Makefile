# mcpsync — see README.md. `make run` is the main job on the embedded default; `make test` runs
# the test suite (installing PostgreSQL and the interop npm packages when missing).
SHELL := /bin/bash
GO    ?= go
BIN   := bin
RUNCMDS := mcpsync:./starter mcpsync-worker:./worker mcpsync-dev:./cmd/mcpsync-dev mcpsync-demo-server:./cmd/mcpsync-demo-server
CMDS    := $(RUNCMDS) mcpsync-gate:./cmd/mcpsync-gate
SHUFFLES ?= 100000

.PHONY: all build build-run run test bench bench-quick gate fmt vet deps clean conformance

all: build

## build: compile every command into bin/
build:
	@$(MAKE) --no-print-directory compile COMPILE="$(CMDS)"

## build-run: compile what `make run` needs
build-run:
	@$(MAKE) --no-print-directory compile COMPILE="$(RUNCMDS)"

compile:
	@mkdir -p $(BIN)
	@for c in $(COMPILE); do \
		name=$${c%%:*}; pkg=$${c#*:}; \
		$(GO) build -o $(BIN)/$$name $$pkg || exit 1; \
	done
	@echo "build: $(BIN)/: $$(cd $(BIN) && ls | tr '\n' ' ')"

## run: embedded Temporal + Web UI + private PostgreSQL, the worker, and a demo subscription
run: build-run
	@scripts/deps.sh
	@scripts/run.sh

## gate: the release gate (R24-R29): 100,000 shuffled interleavings, discovery chaos, a
## duplicate-notification storm, convergence with 20 % of notifications dropped, revocation
## latency and the R24 invariants; prints the release table, exits non-zero on any failure.
gate: build
	@scripts/deps.sh
	@$(BIN)/mcpsync gate --shuffles $(SHUFFLES) $(GATEFLAGS)

## test: the whole test suite with a go test summary
test:
	@scripts/test.sh

## conformance: the official MCP conformance suite's client auth/* scenarios (npm
## @modelcontextprotocol/conformance 0.1.16 with Node 22, installed in testdata/conformance when
## missing) against mcpsync source login/check; prints scenario -> pass/FAIL (issue 14 item 9)
conformance:
	@scripts/conformance.sh

## bench: every benchmark, one after another, in under 20 minutes on a quiet 2-core machine,
## each printing its figures as `bench: <name> <value> <unit> (baseline <name> <value> <unit>,
## ratio <r>)` lines, then `bench: bench-time-<bench> <s> s (baseline bench-budget-<bench> ...)`
## per benchmark and `bench: bench-total <s> s (baseline bench-goal 1200 s, ...)`. Each step
## has a time budget (BENCH_BUDGET_<step>, seconds), a guard above the step's usual time (the
## total, not the budgets' sum, is held to the 20 minutes): a step still running at its budget
## is interrupted (SIGINT, killed 20 s later) and counts as failed,
## so `make bench` never hangs; throughput and scale are given a -budget a little shorter and
## stop in time by themselves, printing what they measured.
## Build: the commands `make run` uses (`make build-run`, which scale runs as processes) and
## one binary with every benchmark as a subcommand, bin/bench/mcpsync-bench (`go run ./bench
## NAME -flags` runs one), are compiled first, timed against the build budget and never
## interrupted: no step's time includes compiling, the embedded Temporal server is linked
## into the benchmarks once, and bench-total is the whole wall time, build included.
## Machine: what this machine charges for the primitives the stack's costs are made of (one
## core's SHA-256 rate, a kernel entry, a loopback TCP round trip, an 8 KiB write + fdatasync),
## so that runs on different machines can be compared.
## Throughput (issue 16): on the embedded default `make run` starts (its Temporal persistence
## and dynamic config, mcpsync-worker as its own process, a fsync'd ledger), 1,000
## subscriptions at 150 mutations/s: accepted/s and p50/p99 next to the floor (the simplest
## entity workflow at the same rate on the same server), a raw go-sdk read loop, history events
## and workflow tasks per update, the saturation point (p99 <= 1 s), the highest rate tried
## inside the latency goal (p99 <= 250 ms; up to two steps further down when none was, then one
## between it and the next rate tried above it), and
## the same workload on the in-memory Temporal test server beside it (memory-* figures,
## labelled). With TEMPORAL_ADDRESS set it runs against that cluster. THROUGHPUTFLAGS passes
## flags (see -help):
## THROUGHPUTFLAGS=-floor-update also runs the floor with each update a Temporal workflow update
## instead of a signal (floor-update-* beside the floor's figures; ≈ 45 s more).
## Read amplification (R27): the gate's storm section, 100 duplicate notifications per change.
## Revocation latency (R29): p50/p99 from `mcpsync revoke` to every derived index's
## invalidation delivered to its outbox consumer, over 1,000 subscriptions and 10 indexes, with
## the raw outbox insert-to-delivery baseline. BENCHFLAGS passes flags (see -help).
## Discovery: an A/B double scan of 100,000 resources against one raw go-sdk listing of the
## same server over the same transport, and their ratio: the median of up to nine runs of a
## changed set alternating with nine of an unchanged one (as many as the budget holds), each
## run's ratio and their spread. SCANBENCHFLAGS passes flags.
## Ledger: acceptResourceVersion with 8 writers (allocate+accept pairs, accepts only) against
## `pgbench -N` on the same cluster, and their ratio (goal >= 0.6); the server is
## $MCPSYNC_BENCH_DATABASE_URL, else a private cluster. LEDGERBENCHFLAGS passes flags.
## Prune: `mcpsync prune` over a simulated day of 200 subscriptions. PRUNEBENCHFLAGS.
## Persistence (issue 16): the embedded server's persistence options with the floor workload
## (300 workflows at 150 signals/s here, so that the step fits its budget on 2 cores;
## `bin/bench/mcpsync-bench persistence` alone runs 1,000). PERSISTBENCHFLAGS passes flags.
## Scale (issue 16): 10,000 live subscriptions on one worker on the `make run` processes: time
## to ACTIVE (or, at its budget, how many were ACTIVE and the rate) next to the floor (3,000 of
## the cheapest entity workflow started the same way on a fresh mcpsync-dev of their own: a
## start rate that falls as the server fills, so a generous baseline for 10,000, and one that
## fits the budget),
## RSS, the sticky workflow cache they need, re-read storm. SCALEBENCHFLAGS passes flags.
## Gateway (issue 15): agent reads and notifications through the MCP gateway against the CLI
## and raw go-sdk baselines. GATEWAYBENCHFLAGS passes flags.
## Outside (issue 16): what a user of `make run` sees, measured from outside as the issue first
## measured it: the `make run` processes, 100 subscriptions on a stdio server whose resources
## change at 10 and 30 per second, each change's latency to its line in `mcpsync watch --json`
## next to its latency to acceptance in the ledger; then 30/s again with 100 idle
## subscriptions and the demo source added. OUTSIDEBENCHFLAGS passes flags.
## A benchmark that fails does not stop the others; the target fails at the end naming it.
## bench-quick: the same benchmarks at small sizes (goal: under 3 minutes; its budgets,
## BENCH_QUICK_BUDGET_<step>, are only a guard against a hang), without the two parts that
## each start a server of their own for a baseline: the throughput benchmark's in-memory
## variant and the scale benchmark's start-phase floor (`make bench` has both); the *FLAGS
## above still apply and override the small sizes (SCALEBENCHFLAGS=-floor=200 brings the
## floor back).
BENCH_GOAL                   ?= 1200
BENCH_BUDGET_build           ?= 70
BENCH_BUDGET_machine         ?= 20
BENCH_BUDGET_throughput      ?= 260
BENCH_BUDGET_storm           ?= 50
BENCH_BUDGET_revoke          ?= 110
BENCH_BUDGET_scan            ?= 60
BENCH_BUDGET_ledger          ?= 50
BENCH_BUDGET_prune           ?= 85
BENCH_BUDGET_persistence     ?= 150
BENCH_BUDGET_scale           ?= 540
BENCH_BUDGET_gateway         ?= 55
BENCH_BUDGET_outside         ?= 110
BENCH_QUICK_GOAL             ?= 180
BENCH_QUICK_BUDGET_build     ?= 45
BENCH_QUICK_BUDGET_machine   ?= 10
BENCH_QUICK_BUDGET_throughput ?= 120
BENCH_QUICK_BUDGET_storm     ?= 60
BENCH_QUICK_BUDGET_revoke    ?= 40
BENCH_QUICK_BUDGET_scan      ?= 30
BENCH_QUICK_BUDGET_ledger    ?= 40
BENCH_QUICK_BUDGET_prune     ?= 30
BENCH_QUICK_BUDGET_persistence ?= 60
BENCH_QUICK_BUDGET_scale     ?= 90
BENCH_QUICK_BUDGET_gateway   ?= 45
BENCH_QUICK_BUDGET_outside   ?= 45
BB := $(BIN)/bench
# BENCH_STEP name,budget-seconds,command: runs command under `timeout` (SIGINT at the budget,
# SIGKILL 20 s later; --foreground keeps Ctrl-C working) and prints its wall time next to the
# budget. BENCH_END prints the total next to the goal and fails naming the failed steps.
BENCH_STEP = echo "== bench $(1) (budget $(2) s)"; s=$$(date +%s); \
	timeout --foreground -s INT -k 20 $(2) $(3); rc=$$?; el=$$(( $$(date +%s) - s )); \
	if [ $$rc = 124 ] || [ $$rc = 137 ]; then failed="$$failed $(1)(stopped-at-budget)"; elif [ $$rc != 0 ]; then failed="$$failed $(1)"; fi; \
	echo "bench: bench-time-$(1) $$el s (baseline bench-budget-$(1) $(2) s, ratio $$(awk -v a=$$el -v b=$(2) 'BEGIN { printf "%.2f", a / b }'))"
# BENCH_BUILD_STEP budget: compiles the bench commands, timed against its budget but never
# interrupted (a slow build is reported, not cut short).
BENCH_BUILD_STEP = echo "== bench build (budget $(1) s)"; s=$$(date +%s); \
	$(BENCH_BUILD) || { echo "bench: FAILED: build" >&2; exit 1; }; el=$$(( $$(date +%s) - s )); \
	echo "bench: bench-time-build $$el s (baseline bench-budget-build $(1) s, ratio $$(awk -v a=$$el -v b=$(1) 'BEGIN { printf "%.2f", a / b }'))"
BENCH_END  = el=$$(( $$(date +%s) - t0 )); \
	echo "bench: bench-total $$el s (baseline bench-goal $(1) s, ratio $$(awk -v a=$$el -v b=$(1) 'BEGIN { printf "%.2f", a / b }'))"; \
	[ -z "$$failed" ] || { echo "bench: FAILED:$$failed" >&2; exit 1; }
BENCH_BUILD = $(MAKE) --no-print-directory build-run && $(GO) build -o $(BB)/mcpsync-bench ./bench

bench:
	@t0=$$(date +%s); failed=; \
	$(call BENCH_BUILD_STEP,$(BENCH_BUDGET_build)); \
	$(call BENCH_STEP,machine,$(BENCH_BUDGET_machine),$(BB)/mcpsync-bench machine); \
	$(call BENCH_STEP,throughput,$(BENCH_BUDGET_throughput),$(BB)/mcpsync-bench throughput -worker-bin $(BIN)/mcpsync-worker -duration 20s -step 10s -steps 3 -memory 20s -budget $$(( $(BENCH_BUDGET_throughput) - 30 ))s $(THROUGHPUTFLAGS)); \
	$(call BENCH_STEP,storm,$(BENCH_BUDGET_storm),$(BB)/mcpsync-bench gate --only storm); \
	$(call BENCH_STEP,revoke,$(BENCH_BUDGET_revoke),$(BB)/mcpsync-bench revoke $(BENCHFLAGS)); \
	$(call BENCH_STEP,scan,$(BENCH_BUDGET_scan),$(BB)/mcpsync-bench scan -runs 9 -budget $$(( $(BENCH_BUDGET_scan) - 12 ))s $(SCANBENCHFLAGS)); \
	$(call BENCH_STEP,ledger,$(BENCH_BUDGET_ledger),$(BB)/mcpsync-bench ledger -duration 9s -rounds 3 $(LEDGERBENCHFLAGS)); \
	$(call BENCH_STEP,prune,$(BENCH_BUDGET_prune),$(BB)/mcpsync-bench prune -subscriptions 200 $(PRUNEBENCHFLAGS)); \
	$(call BENCH_STEP,persistence,$(BENCH_BUDGET_persistence),$(BB)/mcpsync-bench persistence -duration 10s -drain 20s -workflows 300 $(PERSISTBENCHFLAGS)); \
	$(call BENCH_STEP,scale,$(BENCH_BUDGET_scale),$(BB)/mcpsync-bench scale -bin $(BIN) -n 10000 -floor 3000 -probe 15s -budget $$(( $(BENCH_BUDGET_scale) - 25 ))s $(SCALEBENCHFLAGS)); \
	$(call BENCH_STEP,gateway,$(BENCH_BUDGET_gateway),$(BB)/mcpsync-bench gateway -duration 5s $(GATEWAYBENCHFLAGS)); \
	$(call BENCH_STEP,outside,$(BENCH_BUDGET_outside),$(BB)/mcpsync-bench outside -bin $(BIN) -duration 15s -drain 10s $(OUTSIDEBENCHFLAGS)); \
	$(call BENCH_END,$(BENCH_GOAL))

bench-quick:
	@t0=$$(date +%s); failed=; \
	$(call BENCH_BUILD_STEP,$(BENCH_QUICK_BUDGET_build)); \
	$(call BENCH_STEP,machine,$(BENCH_QUICK_BUDGET_machine),$(BB)/mcpsync-bench machine -duration 200ms); \
	$(call BENCH_STEP,throughput,$(BENCH_QUICK_BUDGET_throughput),$(BB)/mcpsync-bench throughput -worker-bin $(BIN)/mcpsync-worker -subscriptions 50 -rate 20 -duration 3s -step 2s -steps 1 -sample 20 -baseline 1s -memory 0s -idle 1s -budget $$(( $(BENCH_QUICK_BUDGET_throughput) - 20 ))s $(THROUGHPUTFLAGS)); \
	$(call BENCH_STEP,storm,$(BENCH_QUICK_BUDGET_storm),$(BB)/mcpsync-bench gate --only storm --storm-resources 10 --storm-rounds 3); \
	$(call BENCH_STEP,revoke,$(BENCH_QUICK_BUDGET_revoke),$(BB)/mcpsync-bench revoke -subscriptions 100 -principals 10 -indexes 3 -probes 20 $(BENCHFLAGS)); \
	$(call BENCH_STEP,scan,$(BENCH_QUICK_BUDGET_scan),$(BB)/mcpsync-bench scan -resources 5000 -runs 1 $(SCANBENCHFLAGS)); \
	$(call BENCH_STEP,ledger,$(BENCH_QUICK_BUDGET_ledger),$(BB)/mcpsync-bench ledger -duration 2s -rounds 1 -warmup 500ms -scale 1 $(LEDGERBENCHFLAGS)); \
	$(call BENCH_STEP,prune,$(BENCH_QUICK_BUDGET_prune),$(BB)/mcpsync-bench prune -subscriptions 100 -sources 2 -hours 3 $(PRUNEBENCHFLAGS)); \
	$(call BENCH_STEP,persistence,$(BENCH_QUICK_BUDGET_persistence),$(BB)/mcpsync-bench persistence -workflows 50 -rate 20 -duration 1s $(PERSISTBENCHFLAGS)); \
	$(call BENCH_STEP,scale,$(BENCH_QUICK_BUDGET_scale),$(BB)/mcpsync-bench scale -bin $(BIN) -n 200 -floor 0 -probe 2s -budget $$(( $(BENCH_QUICK_BUDGET_scale) - 20 ))s $(SCALEBENCHFLAGS)); \
	$(call BENCH_STEP,gateway,$(BENCH_QUICK_BUDGET_gateway),$(BB)/mcpsync-bench gateway -agents 2 -duration 1s -updates 5 $(GATEWAYBENCHFLAGS)); \
	$(call BENCH_STEP,outside,$(BENCH_QUICK_BUDGET_outside),$(BB)/mcpsync-bench outside -bin $(BIN) -subscriptions 10 -rates 10 -duration 2s -drain 3s -loaded=false $(OUTSIDEBENCHFLAGS)); \
	$(call BENCH_END,$(BENCH_QUICK_GOAL))

## deps: install missing PostgreSQL binaries and interop npm packages
deps:
	@scripts/deps.sh

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
