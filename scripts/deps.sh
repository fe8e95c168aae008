#!/usr/bin/env bash
# Installs what the tests and `make run` need and this machine lacks: PostgreSQL's binaries
# (Debian's postgresql package) and the npm packages of the interop tests. Run as root on a
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
