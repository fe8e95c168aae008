# mcpsync — see README.md. `make run` is the main job on the embedded default; `make test` runs
# the test suite (installing PostgreSQL and the interop npm packages when missing).
SHELL := /bin/bash
GO    ?= go
BIN   := bin
RUNCMDS := mcpsync:./starter mcpsync-worker:./worker mcpsync-dev:./cmd/mcpsync-dev mcpsync-demo-server:./cmd/mcpsync-demo-server
CMDS    := $(RUNCMDS) mcpsync-gate:./cmd/mcpsync-gate
SHUFFLES ?= 100000

.PHONY: all build build-run run test bench gate fmt vet deps clean conformance

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

## bench: the benchmarks, one after another, each printing its own result:
## Throughput: notification → accepted version throughput and p50/p99 latency over 1,000
## subscriptions, next to a raw go-sdk read loop against the same server. THROUGHPUTFLAGS
## passes flags (see -help).
## Read amplification (R27): the gate's storm section, 100 duplicate notifications per change.
## Revocation latency (R29): p50/p99 from `mcpsync revoke` to every derived index's
## invalidation delivered to its outbox consumer, over 1,000 subscriptions and 10 indexes, with
## the raw outbox insert-to-delivery baseline. BENCHFLAGS passes flags (see -help).
## Discovery: an A/B double scan of 100,000 resources against one raw go-sdk listing of the
## same server over the same transport, and their ratio. SCANBENCHFLAGS passes flags.
## Ledger: acceptResourceVersion with 8 writers (allocate+accept pairs, accepts only) against
## `pgbench -N` on the same cluster, and their ratio (goal >= 0.6); the server is
## $MCPSYNC_BENCH_DATABASE_URL, else a private cluster. LEDGERBENCHFLAGS passes flags.
bench:
	$(GO) run ./bench/throughput $(THROUGHPUTFLAGS)
	$(GO) run ./cmd/mcpsync-gate --only storm
	$(GO) run ./bench/revoke $(BENCHFLAGS)
	$(GO) run ./bench/scan $(SCANBENCHFLAGS)
	$(GO) run ./bench/ledger $(LEDGERBENCHFLAGS)

## deps: install missing PostgreSQL binaries and interop npm packages
deps:
	@scripts/deps.sh

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
