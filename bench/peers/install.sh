#!/usr/bin/env bash
# Installs the peer sandboxes of corral's benchmarks into bench/peers/node_modules
# (never globally) with `npm ci` from package-lock.json.
#
# Idempotent: when node_modules was installed from this very lock file by this
# Node.js, it returns at once. isolated-vm has no prebuilt binary that can be
# fetched here, so it compiles from source against Node's own headers (a few
# minutes on 2 cores); if that fails, the rest is installed without it and the
# harness reports isolated-vm as unavailable.
#
# Environment:
#   PEERS_SKIP_IVM=1   do not build isolated-vm (e.g. in CI, to save minutes)
#   PEERS_FORCE=1      reinstall even when the tree is current
set -euo pipefail

here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
cd "$here"

die() { echo "bench/peers/install.sh: $*" >&2; exit 1; }
say() { echo "bench/peers: $*" >&2; }

command -v node >/dev/null 2>&1 || die "node is not installed: Node.js 20 or newer is needed (apt-get install nodejs)"
command -v npm >/dev/null 2>&1 || die "npm is not installed, so the peers cannot be installed: it comes with Node.js (apt-get install npm)"

node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "Node.js $(node --version) is too old: 20 or newer is needed"

skip_ivm="${PEERS_SKIP_IVM:-0}"
stamp_file="node_modules/.corral-peers-stamp"
ivm_file="node_modules/.corral-peers-ivm" # ok | failed | skipped
want_stamp="$(node -p 'process.version') $(sha256sum package-lock.json | cut -c1-16)"

loads() { node -e "require('$1')" >/dev/null 2>&1; }

if [ "${PEERS_FORCE:-0}" != 1 ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want_stamp" ] \
   && loads quickjs-emscripten; then
  ivm_status="$(cat "$ivm_file" 2>/dev/null || echo missing)"
  if { [ "$ivm_status" = ok ] && loads isolated-vm; } || [ "$ivm_status" = failed ] \
     || { [ "$ivm_status" = skipped ] && [ "$skip_ivm" = 1 ]; }; then
    say "peers already installed (node $want_stamp; isolated-vm: $ivm_status)"
    exit 0
  fi
fi

# Point node-gyp at Node's own headers, so that it does not try to download them.
if [ -z "${npm_config_nodedir:-}" ]; then
  node_prefix="$(node -p 'require("path").resolve(process.execPath, "..", "..")')"
  for d in "$node_prefix" /usr /usr/local; do
    if [ -f "$d/include/node/node.h" ] && [ -f "$d/include/node/common.gypi" ]; then
      export npm_config_nodedir="$d"
      break
    fi
  done
fi
[ -n "${npm_config_nodedir:-}" ] || say "warning: Node's headers (include/node/node.h) not found; node-gyp may try to download them"
# isolated-vm's install script first asks prebuild-install for a binary from
# GitHub, which cannot be reached here: build from source straight away.
export npm_config_build_from_source=true
export JOBS="${JOBS:-2}"

npm_ci() { npm ci --no-audit --no-fund --loglevel=error "$@" >&2; }

rm -f "$stamp_file" "$ivm_file"
if [ "$skip_ivm" = 1 ]; then
  say "npm ci --ignore-scripts (isolated-vm not built: PEERS_SKIP_IVM=1)"
  npm_ci --ignore-scripts || die "npm ci failed (see above)"
  ivm_status=skipped
else
  say "npm ci (nodedir=${npm_config_nodedir:-unset}); compiling isolated-vm takes a few minutes"
  if npm_ci && loads isolated-vm; then
    ivm_status=ok
  else
    say "warning: isolated-vm did not build or load; installing the other peers without it"
    npm_ci --ignore-scripts || die "npm ci failed (see above)"
    ivm_status=failed
  fi
fi

loads quickjs-emscripten || die "quickjs-emscripten does not load after npm ci"
echo "$ivm_status" > "$ivm_file"
echo "$want_stamp" > "$stamp_file"
say "installed (isolated-vm: $ivm_status)"
