#!/usr/bin/env bash
# `make e2e`: the summary table of the end-to-end scenarios, from the rows each test wrote
# (skewgate_harness::scenario, e2e/tests/e2e/: id, scenario, result, requests, failures, wall time, figures).
set -euo pipefail
dir=${1:?usage: e2e-summary.sh DIR [SECONDS]}
total=${2:-}
echo
echo "skewgate end-to-end summary"
printf '%-3s %-22s %-6s %9s %9s %8s  %s\n' "#" "scenario" "result" "requests" "failures" "wall" "figures"
rows=0
for row in "$dir"/*.tsv; do
  [ -e "$row" ] || continue
  rows=$((rows + 1))
  IFS=$'\t' read -r id title verdict requests failures wall figures <"$row"
  printf '%-3s %-22s %-6s %9s %9s %8s  %s\n' "$id" "$title" "$verdict" "$requests" "$failures" "$wall" "$figures"
done
[ "$rows" -gt 0 ] || echo "(no scenario finished: see the test output above)"
[ -z "$total" ] || echo "total wall time: ${total}s"
