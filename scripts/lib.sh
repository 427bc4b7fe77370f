# Shared helpers for corral's scripts. Sourced, not run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

# Each step is stamped with the script's elapsed time, so a slow phase shows in CI's log.
say() { printf '\033[1m==> %s\033[0m  [%dm%02ds]\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)) >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Runs a command as root: directly when we are root, through sudo when it works without a
# password, otherwise fails with the command the user should run.
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@";
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@";
  else die "this needs root: $*  (run it yourself, then rerun this script)"; fi
}

# Installs Debian packages that are missing (by package name).
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
  say "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The guest builds in its own cargo target folder: a wasm32 build there does not wait for the
# lock on the host's folder, so scripts/test can build the guest and the host at once.
GUEST_TARGET_DIR="$CARGO_TARGET_DIR/guest-cargo"

# Installs what building the guest needs (the wasm target, Debian's clang and wasi-libc) and
# patches QuickJS; prints the WASI SDK stand-in's path.
prepare_guest_build() {
  "$ROOT/scripts/setup-guest-toolchain"
  "$ROOT/scripts/patch-quickjs" >/dev/null
}

# Builds the guest's core module ($GUEST_TARGET_DIR/wasm32-wasip1/release/corral_guest.wasm)
# with the SDK at $1 (from prepare_guest_build).
build_guest_core_with() {
  say "building the guest core module"
  # cargo must run inside guest/ so guest/.cargo/config.toml (target, stack size) applies.
  (cd "$ROOT/guest" && WASI_SDK="$1" CARGO_TARGET_DIR="$GUEST_TARGET_DIR" cargo build --release --locked --quiet)
}

build_guest_core() {
  local sdk
  sdk=$(prepare_guest_build)
  build_guest_core_with "$sdk"
}

# Pre-initializes the core module and wraps it as a component at $1, with an already built
# corral-guest-build.
componentize_guest() {
  say "pre-initializing and componentizing"
  "$CARGO_TARGET_DIR/release/corral-guest-build" build \
    --core "$GUEST_TARGET_DIR/wasm32-wasip1/release/corral_guest.wasm" --out "$1"
}

# Points the host build at target/guest/embedded.wasm, starting as a copy of the prebuilt guest.
# scripts/run and scripts/test embed the guest from this one path (copied only when its content
# changes) and build the whole workspace, so the guest never makes either rebuild. The host's
# dev-dependencies must not turn on features the binaries' dependencies leave off: scripts/test
# builds every target and scripts/run only the binaries, and one extra feature on a crate low in
# the tree (an unused `tracing-subscriber` with default features once enabled `log/std`) gives
# wasmtime and everything above it a second build. check_feature_sets (run by scripts/test's
# lint) compares the two builds' unit graphs.
stage_embedded_guest() {
  EMBEDDED_GUEST="$CARGO_TARGET_DIR/guest/embedded.wasm"
  mkdir -p "$(dirname "$EMBEDDED_GUEST")"
  cmp -s "$ROOT/guest/dist/corral-guest.wasm" "$EMBEDDED_GUEST" \
    || cp "$ROOT/guest/dist/corral-guest.wasm" "$EMBEDDED_GUEST"
  export CORRAL_GUEST_WASM="$EMBEDDED_GUEST"
}

# Fails when a dependency of the binaries would be built with other features by scripts/test's
# all-targets build than by scripts/run's bins-only one (see stage_embedded_guest). Cargo prints
# its unit graph only on the nightly channel; RUSTC_BOOTSTRAP=1 lets stable cargo do it.
check_feature_sets() {
  local graphs="$CARGO_TARGET_DIR/test-logs"
  mkdir -p "$graphs"
  for targets in bins all-targets; do
    RUSTC_BOOTSTRAP=1 cargo build --release --locked --workspace "--$targets" \
      --unit-graph -Z unstable-options > "$graphs/units-$targets.json"
  done
  node - "$graphs/units-bins.json" "$graphs/units-all-targets.json" <<'JS'
const fs = require("fs");
const features = (path) => {
  const units = new Map();
  for (const u of JSON.parse(fs.readFileSync(path, "utf8")).units) {
    // The profile's opt-level tells a crate built for a build script or proc macro (opt-level 0
    // under build-override) from the same crate built into a test (opt-level 3): two units.
    const key = `${u.pkg_id} ${u.target.name} ${u.mode} ${u.platform ?? ""} O${u.profile.opt_level}`;
    units.set(key, [...(units.get(key) ?? []), u.features.join(",")].sort());
  }
  return units;
};
const [bins, all] = process.argv.slice(2).map(features);
const differ = [...bins].filter(([k, v]) => all.has(k) && String(all.get(k)) !== String(v));
for (const [k, v] of differ) console.error(`${k}\n  binaries: ${v.join(" | ")}\n  tests:    ${all.get(k).join(" | ")}`);
if (differ.length) {
  console.error("a dev-dependency enables features the binaries' build leaves off: scripts/run would rebuild them");
  process.exit(1);
}
JS
}
