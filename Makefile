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

## bench: every benchmark, one after another (goal: under 20 minutes), each printing its figures
## as `bench: <name> <value> <unit> (baseline <name> <value> <unit>, ratio <r>)` lines, then
## `bench: bench-time-<bench> <s> s` per benchmark and `bench: bench-total <s> s`:
## Throughput (issue 16): on the embedded default `make run` starts (its Temporal persistence
## and dynamic config, mcpsync-worker as its own process, a fsync'd ledger), 1,000
## subscriptions at 150 mutations/s: accepted/s and p50/p99 next to the floor (the simplest
## entity workflow at the same rate on the same server), a raw go-sdk read loop, history events
## and workflow tasks per update, and the saturation point (p99 <= 1 s). With TEMPORAL_ADDRESS
## set it runs against that cluster. THROUGHPUTFLAGS passes flags (see -help).
## Read amplification (R27): the gate's storm section, 100 duplicate notifications per change.
## Revocation latency (R29): p50/p99 from `mcpsync revoke` to every derived index's
## invalidation delivered to its outbox consumer, over 1,000 subscriptions and 10 indexes, with
## the raw outbox insert-to-delivery baseline. BENCHFLAGS passes flags (see -help).
## Discovery: an A/B double scan of 100,000 resources against one raw go-sdk listing of the
## same server over the same transport, and their ratio. SCANBENCHFLAGS passes flags.
## Ledger: acceptResourceVersion with 8 writers (allocate+accept pairs, accepts only) against
## `pgbench -N` on the same cluster, and their ratio (goal >= 0.6); the server is
## $MCPSYNC_BENCH_DATABASE_URL, else a private cluster. LEDGERBENCHFLAGS passes flags.
## Prune: `mcpsync prune` over a simulated day of 1,000 subscriptions. PRUNEBENCHFLAGS.
## Persistence (issue 16): the embedded server's persistence options with the floor workload.
## PERSISTBENCHFLAGS passes flags.
## Scale (issue 16): 10,000 live subscriptions on one worker on the `make run` processes: time
## to ACTIVE, RSS, re-read storm. SCALEBENCHFLAGS passes flags.
## A benchmark that fails does not stop the others; the target fails at the end naming it.
## Gateway (issue 15): agent reads and notifications through the MCP gateway against the CLI
## and raw go-sdk baselines. GATEWAYBENCHFLAGS passes flags.
## bench-quick: the same benchmarks at small sizes (goal: under 3 minutes); the *FLAGS above
## still apply and override the small sizes.
BENCH_STEP = echo "== bench $(1)"; s=$$(date +%s); $(2) || failed="$$failed $(1)"; echo "bench: bench-time-$(1) $$(( $$(date +%s) - s )) s"
BENCH_END  = echo "bench: bench-total $$(( $$(date +%s) - t0 )) s"; [ -z "$$failed" ] || { echo "bench: FAILED:$$failed" >&2; exit 1; }
bench: build-run
	@t0=$$(date +%s); failed=; \
	$(call BENCH_STEP,throughput,$(GO) run ./bench/throughput -worker-bin $(BIN)/mcpsync-worker $(THROUGHPUTFLAGS)); \
	$(call BENCH_STEP,storm,$(GO) run ./cmd/mcpsync-gate --only storm); \
	$(call BENCH_STEP,revoke,$(GO) run ./bench/revoke $(BENCHFLAGS)); \
	$(call BENCH_STEP,scan,$(GO) run ./bench/scan $(SCANBENCHFLAGS)); \
	$(call BENCH_STEP,ledger,$(GO) run ./bench/ledger $(LEDGERBENCHFLAGS)); \
	$(call BENCH_STEP,prune,$(GO) run ./bench/prune $(PRUNEBENCHFLAGS)); \
	$(call BENCH_STEP,persistence,$(GO) run ./bench/persistence $(PERSISTBENCHFLAGS)); \
	$(call BENCH_STEP,scale,$(GO) run ./bench/scale -bin $(BIN) $(SCALEBENCHFLAGS)); \
	$(call BENCH_STEP,gateway,$(GO) run ./bench/gateway $(GATEWAYBENCHFLAGS)); \
	$(BENCH_END)

bench-quick: build-run
	@t0=$$(date +%s); failed=; \
	$(call BENCH_STEP,throughput,$(GO) run ./bench/throughput -worker-bin $(BIN)/mcpsync-worker -subscriptions 50 -rate 20 -duration 5s -step 3s -steps 1 -sample 20 -baseline 1s $(THROUGHPUTFLAGS)); \
	$(call BENCH_STEP,storm,$(GO) run ./cmd/mcpsync-gate --only storm --storm-resources 10); \
	$(call BENCH_STEP,revoke,$(GO) run ./bench/revoke -subscriptions 100 -principals 10 -indexes 3 -probes 20 $(BENCHFLAGS)); \
	$(call BENCH_STEP,scan,$(GO) run ./bench/scan -resources 5000 -runs 1 $(SCANBENCHFLAGS)); \
	$(call BENCH_STEP,ledger,$(GO) run ./bench/ledger -duration 3s -rounds 1 -warmup 1s -scale 1 $(LEDGERBENCHFLAGS)); \
	$(call BENCH_STEP,prune,$(GO) run ./bench/prune -subscriptions 100 -sources 2 -hours 3 $(PRUNEBENCHFLAGS)); \
	$(call BENCH_STEP,persistence,$(GO) run ./bench/persistence -workflows 50 -rate 20 -duration 3s $(PERSISTBENCHFLAGS)); \
	$(call BENCH_STEP,scale,$(GO) run ./bench/scale -bin $(BIN) -n 200 -probe 3s $(SCALEBENCHFLAGS)); \
	$(call BENCH_STEP,gateway,$(GO) run ./bench/gateway -agents 2 -duration 2s -updates 5 $(GATEWAYBENCHFLAGS)); \
	$(BENCH_END)

## deps: install missing PostgreSQL binaries and interop npm packages
deps:
	@scripts/deps.sh

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
