# Stands in for the official `rust:<version>-bookworm` image on machines where no image registry
# answers (scripts/docker-env.sh makes it only there, and says so). The same layout as the
# official image: rustup's toolchain in /usr/local/rustup and /usr/local/cargo, on PATH, from
# rustup's own distribution server. Slimmer than the official image, whose base carries a whole
# C build environment: docker/Dockerfile needs a C compiler and the libc headers only.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG RUST_VERSION
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUST_VERSION=${RUST_VERSION}
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && url=https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init \
 && curl -fsSL -o /tmp/rustup-init "$url" \
 && echo "$(curl -fsSL "$url.sha256" | cut -d' ' -f1)  /tmp/rustup-init" | sha256sum --check --quiet \
 && chmod +x /tmp/rustup-init \
 && /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain "$RUST_VERSION" \
 && rm /tmp/rustup-init \
 && chmod -R a+w "$RUSTUP_HOME" "$CARGO_HOME" \
 && rustc --version
