#!/usr/bin/env bash
# `make test`: the whole test suite against one private PostgreSQL cluster started for the
# run on a free loopback port (stopped afterwards), with a go test summary at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
tmp=$(mktemp -d /tmp/mcpsync-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/testpg" ./cmd/testpg
go build -o "$tmp/testsummary" ./cmd/testsummary
echo "test: go test ./... (${GOTESTFLAGS:-no extra flags}) against a private PostgreSQL cluster"
set +e
"$tmp/testpg" run --dir "$tmp/pg" -- go test -json -count=1 -timeout "${TEST_TIMEOUT:-45m}" ${GOTESTFLAGS:-} ./... | "$tmp/testsummary"
status=("${PIPESTATUS[@]}")
set -e
if [ "${status[0]}" != 0 ] || [ "${status[1]}" != 0 ]; then
  echo "test: FAILED (go test exit ${status[0]}, summary exit ${status[1]})"
  exit 1
fi
echo "test: PASSED"
