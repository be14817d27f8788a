# Build stage: the release binary with the locked dependency set. Cargo.toml names the bench,
# so cargo cannot read the manifest without benches/. CI replays this stage's COPY and RUN lines
# in an empty folder (tools/check-docker-build.sh) to prove these files are enough.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
COPY migrations ./migrations
COPY benches ./benches
# The commit `--version` reports: the build context has no .git (docker build --build-arg
# IDEMRELAY_GIT_COMMIT=$(git rev-parse --short=12 HEAD)).
ARG IDEMRELAY_GIT_COMMIT=unknown
RUN cargo build --release --locked

# Runtime stage: the binary alone, run as an unprivileged user.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/idemrelay --create-home idemrelay
COPY --from=build /src/target/release/idemrelay /usr/local/bin/idemrelay
USER idemrelay
WORKDIR /var/lib/idemrelay
# Containers see clients from the bridge network, not loopback: set IDEMRELAY_ALLOW_NETWORKS
# to the networks that may submit without authentication.
# The admin API listens on all interfaces so the port can be published or scraped; it can
# requeue and cancel mail, so set IDEMRELAY_ADMIN_TOKEN (health checks need no token), or
# IDEMRELAY_ADMIN=127.0.0.1:8025 to keep it inside the container.
# `docker stop` waits 10 s before SIGKILL: sessions inside a message get 8 s to finish. Raise
# both together (IDEMRELAY_SHUTDOWN_GRACE, and `docker stop --time` or compose's
# stop_grace_period a few seconds longer), as contrib/compose.yaml does.
ENV IDEMRELAY_LISTEN=0.0.0.0:2525 \
    IDEMRELAY_ADMIN=0.0.0.0:8025 \
    IDEMRELAY_SHUTDOWN_GRACE=8s \
    IDEMRELAY_STORE=sqlite:///var/lib/idemrelay/idemrelay.db
VOLUME ["/var/lib/idemrelay"]
EXPOSE 2525 587 465 8025
# No curl in this image: the binary probes its own /healthz (it reads IDEMRELAY_ADMIN and
# reaches a wildcard address over loopback).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["idemrelay", "healthcheck", "--timeout", "3s"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["idemrelay"]
CMD ["serve"]
