//! Relay throughput on PostgreSQL: 100,000 pending outbox rows drained into a Redis stream
//! by one relay (claim with lease, pipelined XADD, mark sent), messages per second.
//!
//! `cargo bench --bench relay` (PostgreSQL at $PAYNOTIFY_BENCH_PG_URL, default
//! postgres://postgres@127.0.0.1:5432/postgres; Redis at 127.0.0.1:6379).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::metrics::Metrics;
use paynotify::relay::Relay;
use paynotify::relay::sink::RedisStreamSink;
use paynotify::store::Store;
use paynotify::time::SystemClock;

const MESSAGES: usize = 100_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let database = support::BenchDatabase::create("paynotify_relay_bench").await;
    let url = database.url.clone();

    let store = Store::connect(&DatabaseSettings {
        url: Secret::new(url.clone()),
        pool_size: 4,
        ..DatabaseSettings::default()
    })
    .expect("store");
    store.migrate().await.expect("migrate");
    let stream = format!("paynotify:bench:{}", std::process::id());
    for batch in [100u32, 500] {
        let mut db = database.connect().await;
        db.batch_execute(&format!(
            "TRUNCATE local_message; \
             INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) \
             SELECT 'ORDER_PAID', 'B' || g, jsonb_build_object('order_no', 'B' || g, 'channel', 'wechat', \
               'transaction_id', '4200002793' || g, 'amount_fen', 19900, 'currency', 'CNY'), 0, 0, now(), now() \
             FROM generate_series(1, {MESSAGES}) g;"
        ))
        .await
        .expect("seed");
        db.batch_execute("VACUUM ANALYZE local_message")
            .await
            .expect("vacuum");
        let sink =
            RedisStreamSink::connect("redis://127.0.0.1:6379", &stream, Duration::from_secs(5))
                .await
                .expect("Redis");
        let relay = Relay::new(
            store.clone(),
            Arc::new(sink),
            Arc::new(SystemClock),
            Arc::new(Metrics::new()),
            batch,
            16,
        );
        let started = Instant::now();
        let mut published = 0;
        while published < MESSAGES {
            let report = relay.tick().await.expect("tick");
            assert_eq!(report.failed, 0);
            published += report.published;
        }
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "relay.batch_size = {batch:>3}: {published} messages to the Redis stream in {elapsed:.2} s = {:.0} messages/s",
            published as f64 / elapsed
        );
    }
    let client = redis::Client::open("redis://127.0.0.1:6379").expect("client");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .expect("del");
    drop(store);
    database.drop().await;
}
