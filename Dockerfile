# Build stage: the release binary with the locked dependency set.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN cargo build --release --locked

# Runtime stage: the binary alone, run as an unprivileged user.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/idemrelay --create-home idemrelay
COPY --from=build /src/target/release/idemrelay /usr/local/bin/idemrelay
USER idemrelay
WORKDIR /var/lib/idemrelay
# Containers see clients from the bridge network, not loopback: set IDEMRELAY_ALLOW_NETWORKS
# to the networks that may submit without authentication.
ENV IDEMRELAY_LISTEN=0.0.0.0:2525 \
    IDEMRELAY_STORE=sqlite:///var/lib/idemrelay/idemrelay.db
VOLUME ["/var/lib/idemrelay"]
EXPOSE 2525 587 465
STOPSIGNAL SIGTERM
ENTRYPOINT ["idemrelay"]
CMD ["serve"]
