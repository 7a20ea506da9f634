#!/usr/bin/env bash
# `make demo`: the local skewed control plane — two 1.33-era and one 1.36-era stand-in apiserver,
# Envoy with the skewgate filter in front — and the kubectl commands that show the skew handled.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${SKEWGATE_DEMO_OUT:-out/demo}
harness=target/debug/skewgate-harness
kubectl=.venv/bin/kubectl
mkdir -p "$out"
ready="$out/ready.json"
rm -f "$ready"

started=$(date +%s.%N)
"$harness" cluster --apiserver a=1.33 --apiserver b=1.33 --apiserver c=1.36 --out "$out" >"$ready" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
trap 'exit 0' INT TERM

for _ in $(seq 1 600); do
  [ -s "$ready" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "demo: the cluster failed to start" >&2; exit 1; }
  sleep 0.1
done
[ -s "$ready" ] || { echo "demo: the cluster was not ready within 60 s" >&2; exit 1; }
elapsed=$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
kubeconfig=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kubeconfig"])' "$ready")

cat <<MSG

skewgate demo ready in ${elapsed}s: $(cat "$ready")

  export KUBECONFIG=$kubeconfig
  alias kubectl=$PWD/$kubectl

A GVR only the 1.36-era apiserver c serves, and one only the 1.33-era a and b serve (the
x-skewgate-served-by response header says who answered):
  kubectl get resourceclaims.v1.resource.k8s.io -A -v=8 2>&1 | grep -i served-by
  kubectl get deviceclasses.v1alpha3.resource.k8s.io -v=8 2>&1 | grep -i served-by

Discovery merged from both eras (v1 from c, v1alpha3 from a and b):
  kubectl api-resources --api-group=resource.k8s.io

Shared state and a watch through Envoy:
  kubectl create configmap demo --from-literal=k=v
  kubectl get configmaps -w &
  kubectl patch configmap demo -p '{"data":{"k":"v2"}}'

Routing decisions, offline: target/debug/skewgate explain --table $out/table.json GET /apis/resource.k8s.io/v1/resourceclaims
Ctrl-C stops the cluster.
MSG
wait "$pid"
