# mcpsync — see README.md. `make run` is the main job on the embedded default; `make test` runs
# the test suite (installing PostgreSQL and the interop npm packages when missing).
SHELL := /bin/bash
GO    ?= go
BIN   := bin
CMDS  := mcpsync:./starter mcpsync-worker:./worker mcpsync-dev:./devserver mcpsync-demo-server:./demoserver

.PHONY: all build run test bench gate fmt vet deps clean

all: build

## build: compile every command into bin/
build:
	@mkdir -p $(BIN)
	@for c in $(CMDS); do \
		name=$${c%%:*}; pkg=$${c#*:}; \
		$(GO) build -o $(BIN)/$$name $$pkg || exit 1; \
	done
	@echo "build: $(BIN)/: $$(cd $(BIN) && ls | tr '\n' ' ')"

## run: embedded Temporal + Web UI + private PostgreSQL, the worker, and a demo subscription
run: build
	@scripts/deps.sh
	@scripts/run.sh

## test: the whole test suite with a go test summary
test:
	@scripts/test.sh

## bench: revocation latency (issue 7): p50/p99 from `mcpsync revoke` to every derived index's
## invalidation delivered to its outbox consumer, over 1,000 subscriptions and 10 indexes, with
## the raw outbox insert-to-delivery baseline. BENCHFLAGS passes flags (see -help).
## Discovery (issue 6): an A/B double scan of 100,000 resources against one raw go-sdk listing
## of the same server over the same transport, and their ratio. SCANBENCHFLAGS passes flags.
## Ledger (issue 3): acceptResourceVersion with 8 writers (allocate+accept pairs, accepts only)
## against `pgbench -N` on the same cluster, and their ratio (goal >= 0.6); the server is
## $MCPSYNC_BENCH_DATABASE_URL, else a private cluster. LEDGERBENCHFLAGS passes flags.
bench:
	$(GO) run ./internal/consumers/cmd/revokebench $(BENCHFLAGS)
	$(GO) run ./bench/scan $(SCANBENCHFLAGS)
	$(GO) run ./internal/shuffle/cmd/ledgerbench $(LEDGERBENCHFLAGS)

## deps: install missing PostgreSQL binaries and interop npm packages
deps:
	@scripts/deps.sh

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
