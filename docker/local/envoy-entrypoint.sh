#!/usr/bin/env sh
# What the official Envoy image's entrypoint does, for docker/local/envoy.Dockerfile: arguments
# that start with '-' are Envoy's; $loglevel sets --log-level; Envoy runs as the `envoy` user
# (uid ENVOY_UID, gid ENVOY_GID when given) unless ENVOY_UID is 0 or the container is not root.
set -e
if [ "${1#-}" != "$1" ]; then
  set -- envoy "$@"
fi
if [ "$1" = envoy ] && [ -n "${loglevel:-}" ]; then
  set -- "$@" --log-level "$loglevel"
fi
if [ "${ENVOY_UID:-}" != 0 ] && [ "$(id -u)" = 0 ]; then
  [ -z "${ENVOY_UID:-}" ] || usermod -u "$ENVOY_UID" envoy
  [ -z "${ENVOY_GID:-}" ] || groupmod -g "$ENVOY_GID" envoy
  # Envoy logs to the container's stdout and stderr, which belong to root.
  chown envoy:envoy /dev/stdout /dev/stderr
  exec setpriv --reuid=envoy --regid=envoy --init-groups "$@"
fi
exec "$@"
