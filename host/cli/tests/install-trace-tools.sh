#!/usr/bin/env bash
# Installs the OTLP receiver the tracing test (host/cli/tests/slow/serve_tracing.rs) exports to and
# reads spans back from: Arize Phoenix from PyPI, the trace store an operator would run, into a
# Python virtual environment at target/trace-tools/ at the repository root. Quick and silent
# when the pinned version is already there.
set -euo pipefail

phoenix="20.26.1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
venv="$root/target/trace-tools"

if [ -x "$venv/bin/phoenix" ] \
  && "$venv/bin/python" -m pip show arize-phoenix 2>/dev/null | grep -qx "Version: $phoenix"; then
  exit 0
fi
command -v python3 >/dev/null || { echo "error: python3 is needed for the trace tools" >&2; exit 1; }
if ! python3 -m venv "$venv" 2>/dev/null; then
  # Debian's python3 keeps venv (and ensurepip) in a package of its own.
  if command -v apt-get >/dev/null; then
    source "$root/scripts/lib.sh"
    apt_install python3-venv
    python3 -m venv "$venv"
  else
    echo "error: python3 cannot create a virtual environment (install python3-venv)" >&2
    exit 1
  fi
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "arize-phoenix==$phoenix" \
  || { echo "error: could not install arize-phoenix from PyPI into $venv" >&2; exit 1; }
"$venv/bin/python" -m pip show arize-phoenix | grep '^Version'
