#!/usr/bin/env bash
# conformance-client.sh SERVER_URL — the client the MCP conformance suite runs for each client
# scenario (issue 14 item 9). It maps the scenario to mcpsync's own commands, nothing else:
#   - auth/client-credentials-*: `mcpsync source check --oauth client_credentials` with the
#     client ID and the secret (by reference, in an environment variable) or the private key
#     (private_key_jwt, in a file of mode 0600) of MCP_CONFORMANCE_CONTEXT;
#   - every other scenario: `mcpsync source login --url URL --oauth authorization_code ...`
#     (this script plays the browser: it opens each URL login prints with curl, and the
#     suite's authorization server redirects at once to login's loopback listener), then
#     `mcpsync source check` with the token file login wrote, as a worker would connect.
# The exit status is that of the last mcpsync command. MCPSYNC_BIN names the mcpsync binary
# (scripts/conformance.sh builds it).
set -uo pipefail

url=${1:?usage: conformance-client.sh SERVER_URL}
scenario=${MCP_CONFORMANCE_SCENARIO:-}
context=${MCP_CONFORMANCE_CONTEXT:-}
[ -n "$context" ] || context='{}'
mcpsync=${MCPSYNC_BIN:-mcpsync}
# Each mcpsync command is bounded below the suite's 30 s per scenario; a hung one gets
# SIGQUIT, so that its goroutines are dumped on stderr (kept in the scenario's log).
run() { timeout -s QUIT -k 2 20 "$mcpsync" "$@"; }

field() { jq -r --arg k "$1" '.[$k] // empty' <<<"$context"; }
client_id=$(field client_id)
client_secret=$(field client_secret)
private_key=$(field private_key_pem)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

flags=(--url "$url" --timeout 20s)
if [ -n "$client_secret" ]; then
	# Secrets only by reference: mcpsync reads the variable, the command line names it.
	export MCPSYNC_CONFORMANCE_CLIENT_SECRET="$client_secret"
fi
if [ -n "$private_key" ]; then
	umask 077
	printf '%s\n' "$private_key" >"$work/client-key.pem"
fi

case "$scenario" in
auth/client-credentials-*)
	flags+=(--oauth client_credentials --oauth-client-id "$client_id")
	[ -n "$client_secret" ] && flags+=(--oauth-client-secret-env MCPSYNC_CONFORMANCE_CLIENT_SECRET)
	[ -n "$private_key" ] && flags+=(--oauth-client-key-file "$work/client-key.pem")
	run source check "${flags[@]}"
	exit
	;;
esac

flags+=(--oauth authorization_code --oauth-token-file "$work/tokens.json"
	--oauth-client-metadata-url https://conformance-test.local/client-metadata.json)
[ -n "$client_id" ] && flags+=(--oauth-client-id "$client_id")
[ -n "$client_secret" ] && flags+=(--oauth-client-secret-env MCPSYNC_CONFORMANCE_CLIENT_SECRET)

# source login prints each authorization URL on a line of its own and waits for the redirect.
run source login "${flags[@]}" >"$work/login.out" 2>"$work/login.err" &
login=$!
opened=0
while :; do
	mapfile -t urls < <(grep -E '^https?://' "$work/login.out" 2>/dev/null)
	while [ "$opened" -lt "${#urls[@]}" ]; do
		curl -s -o /dev/null -L --max-time 10 "${urls[$opened]}" || true
		opened=$((opened + 1))
	done
	kill -0 "$login" 2>/dev/null || break
	sleep 0.05
done
wait "$login"
status=$?
cat "$work/login.out"
cat "$work/login.err" >&2
[ "$status" -eq 0 ] || exit "$status"

run source check "${flags[@]}"
