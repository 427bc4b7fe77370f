#!/usr/bin/env bash
# Installs the API contract tools that `corral serve`'s contract test runs
# (host/cli/tests/slow/serve_contract.rs) into a Python virtual environment at target/python-tools/ at
# the repository root, from PyPI: schemathesis (the property-based API tester, driven only by the
# OpenAPI document) and openapi-spec-validator (validates the document as OpenAPI 3.1). Quick and
# silent when the pinned versions are already there.
set -euo pipefail

schemathesis="4.32.5"
validator="0.9.0"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
venv="$root/target/python-tools"

installed() {
  "$venv/bin/python" -m pip show "$1" 2>/dev/null | grep -qx "Version: $2"
}
if [ -x "$venv/bin/python" ] && installed schemathesis "$schemathesis" \
  && installed openapi-spec-validator "$validator"; then
  exit 0
fi
command -v python3 >/dev/null || { echo "error: python3 is needed for the API contract tools" >&2; exit 1; }
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
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "schemathesis==$schemathesis" "openapi-spec-validator==$validator" \
  || { echo "error: could not install schemathesis and openapi-spec-validator from PyPI into $venv" >&2; exit 1; }
"$venv/bin/schemathesis" --version
