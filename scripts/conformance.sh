#!/usr/bin/env bash
# `make conformance`: Kubernetes' own e2e specs (your e2e.test, by path) on the skewed real cluster
# (a and b: kube-apiserver@1.33 with betas on, c: the binary's own version, one etcd, a
# kube-controller-manager through the front door), three ways on the same binaries: straight to
# c, through skewgate, through a plain load balancer. Prints the three columns and every spec that
# passes straight to c but fails through skewgate, and exits 1 if there is one that is not
# declared version-specific below.
set -euo pipefail

: "${E2E_TEST:?E2E_TEST=PATH: a Kubernetes e2e.test binary (go test -c ./test/e2e)}"
: "${KUBE_APISERVER:?KUBE_APISERVER=PATH}"
: "${ETCD:?ETCD=PATH}"
: "${KUBE_CONTROLLER_MANAGER:?KUBE_CONTROLLER_MANAGER=PATH}"
FOCUS=${CONFORMANCE_FOCUS:-'\[sig-api-machinery\] (Watchers|API Streaming|Servers with support for Table transformation|Servers with support for API chunking|server version|Discovery|AggregatedDiscovery|OpenAPIV3|MutatingAdmissionPolicy|ValidatingAdmissionPolicy|health handlers|ResourceQuota.*volume attributes class)'}
# [Slow] specs wait for etcd compaction and the like (10 minutes for one): nothing the edge does.
SKIP=${CONFORMANCE_SKIP:-'\[Slow\]'}
CONTROLLERS=${CONTROLLERS:-'*'}
OUT=${CONFORMANCE_OUT:-target/tmp/conformance}
HARNESS=target/tools/skewgate-harness
for bin in "$E2E_TEST" "$KUBE_APISERVER" "$ETCD" "$KUBE_CONTROLLER_MANAGER" "$HARNESS"; do
  [ -x "$bin" ] || { echo "conformance: $bin: not an executable file" >&2; exit 2; }
done
rm -rf "$OUT" && mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

cluster_pid=
stop_cluster() {
  [ -n "$cluster_pid" ] || return 0
  kill -TERM "$cluster_pid" 2>/dev/null || true
  wait "$cluster_pid" 2>/dev/null || true
  cluster_pid=
}
trap stop_cluster EXIT

# start_cluster NAME [harness flags...]: runs until stop_cluster; waits for its ready line.
start_cluster() {
  local name=$1; shift
  "$HARNESS" cluster --kube-apiserver "$KUBE_APISERVER" --etcd "$ETCD" \
    --kube-controller-manager "$KUBE_CONTROLLER_MANAGER" --controllers "$CONTROLLERS" \
    --apiserver 'a=kube-apiserver@1.33:--runtime-config=api/beta=true' \
    --apiserver 'b=kube-apiserver@1.33:--runtime-config=api/beta=true' \
    --apiserver c=kube-apiserver --out "$OUT/$name" ${CONFORMANCE_CLUSTER_ARGS:-} "$@" >"$OUT/$name.log" 2>&1 &
  cluster_pid=$!
  for _ in $(seq 1 600); do
    if grep -q '^{"admin"' "$OUT/$name.log"; then return 0; fi
    kill -0 "$cluster_pid" 2>/dev/null || { tail -20 "$OUT/$name.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "conformance: cluster $name not ready in 300 s" >&2; exit 1
}

# run COLUMN CLUSTER CONTEXT: the focused specs through that kubeconfig context.
run() {
  local column=$1 cluster=$2 context=$3
  echo "conformance: $column ($context) ..." >&2
  "$E2E_TEST" --kubeconfig="$OUT/$cluster/kubeconfig" --context="$context" --provider=skeleton \
    --num-nodes=1 --allowed-not-ready-nodes=-1 --minStartupPods=-1 --ginkgo.focus="$FOCUS" --ginkgo.skip="$SKIP" \
    --ginkgo.no-color --ginkgo.timeout=60m --ginkgo.json-report="$OUT/$column.json" \
    --report-dir="$OUT/$column" >"$OUT/$column.txt" 2>&1 || true
}

start_cluster skewgate
run straight skewgate direct-c
run skewgate skewgate skewgate-admin
stop_cluster
start_cluster plain --plain-lb
run plain plain skewgate-admin
stop_cluster

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
# Specs that assert one release's behaviour on whichever apiserver answers: in a mixed cluster
# they fail through any load balancer, and say nothing about the edge.
VERSION_SPECIFIC = {
    "[sig-api-machinery] health handlers should contain necessary checks":
        "asserts the checks of the e2e binary's own release on whichever apiserver answers /healthz",
}
def results(column):
    specs = {}
    for suite in json.load(open(f"{out}/{column}.json")):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            name = " ".join((spec.get("ContainerHierarchyTexts") or []) + [spec["LeafNodeText"]])
            if spec["State"] in ("passed", "failed", "panicked", "timedout", "interrupted", "aborted"):
                specs[name] = spec["State"] == "passed"
    return specs
columns = {c: results(c) for c in ("straight", "skewgate", "plain")}
print(f"{'':32} {'passed':>7} {'failed':>7}")
for label, column in (("straight to c (one apiserver)", "straight"), ("skewgate", "skewgate"), ("plain load balancer", "plain")):
    specs = columns[column]
    print(f"{label:32} {sum(specs.values()):>7} {sum(not v for v in specs.values()):>7}")
regressions = sorted(n for n, ok in columns["straight"].items() if ok and not columns["skewgate"].get(n, False))
plain_only = sorted(n for n, ok in columns["plain"].items() if ok and not columns["skewgate"].get(n, False))
undeclared = [n for n in regressions if not any(n.startswith(v) for v in VERSION_SPECIFIC)]
print("\npass straight to c, fail through skewgate:" + ("" if regressions else " none"))
for name in regressions:
    reason = next((r for v, r in VERSION_SPECIFIC.items() if name.startswith(v)), None)
    print(f"  {name}" + (f"  [version-specific: {reason}]" if reason else ""))
print("pass through the plain load balancer, fail through skewgate:" + ("" if plain_only else " none"))
for name in plain_only:
    print(f"  {name}")
print(f"\nreports and logs: {out}")
sys.exit(1 if undeclared else 0)
EOF
