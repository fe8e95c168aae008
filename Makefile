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

## deps: install missing PostgreSQL binaries and interop npm packages
deps:
	@scripts/deps.sh

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
