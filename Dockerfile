FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, in a layer of their own: built against a dummy main and library, so a
# change to the sources rebuilds only paynotify itself.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && for b in ledger verify relay service; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked --bin paynotify \
    && rm -rf src benches
COPY . .
# The sources are newer than the dummy build's outputs; touch makes sure cargo sees it.
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin paynotify

FROM debian:bookworm-slim
# curl for the health check; ca-certificates: the system roots the provider API clients and
# an https:// relay sink trust.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /app paynotify && mkdir -p /app/data && chown paynotify /app/data
WORKDIR /app
COPY --from=build /src/target/release/paynotify /usr/local/bin/paynotify
COPY config ./config
USER paynotify
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -sf http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["paynotify"]
CMD ["serve"]
