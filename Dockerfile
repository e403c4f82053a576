FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin paynotify

FROM debian:bookworm-slim
RUN useradd --system --home /app paynotify && mkdir -p /app/data && chown paynotify /app/data
WORKDIR /app
COPY --from=build /src/target/release/paynotify /usr/local/bin/paynotify
COPY config ./config
USER paynotify
EXPOSE 8080
ENTRYPOINT ["paynotify"]
CMD ["serve"]
