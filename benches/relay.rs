//! Relay throughput on PostgreSQL: 100,000 pending outbox rows drained by one relay (claim
//! with lease, publish, mark sent), messages per second, into a Redis stream (pipelined XADD)
//! and into RabbitMQ (persistent messages to a durable queue, pipelined publisher confirms).
//!
//! `cargo bench --bench relay` (PostgreSQL at $PAYNOTIFY_BENCH_PG_URL, default
//! postgres://postgres@127.0.0.1:5432/postgres; Redis at 127.0.0.1:6379; RabbitMQ at
//! $PAYNOTIFY_BENCH_AMQP_URL, default amqp://guest:guest@127.0.0.1:5672/%2f, where the bench
//! declares an exchange and a queue of its own and deletes them at the end).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use lapin::options::{
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::metrics::Metrics;
use paynotify::relay::Relay;
use paynotify::relay::sink::Sink;
use paynotify::relay::sinks::AmqpSink;
use paynotify::relay::sinks::RedisStreamSink;
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
    let amqp_url = std::env::var("PAYNOTIFY_BENCH_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let names = format!("paynotify.bench.{}", std::process::id());
    // The consumer side: a durable queue bound to every topic, so nothing is returned.
    let amqp = lapin::Connection::connect(&amqp_url, lapin::ConnectionProperties::default())
        .await
        .expect("RabbitMQ");
    let channel = amqp.create_channel().await.expect("channel");
    channel
        .exchange_declare(
            names.as_str().into(),
            lapin::ExchangeKind::Topic,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("exchange");
    channel
        .queue_declare(
            names.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("queue");
    channel
        .queue_bind(
            names.as_str().into(),
            names.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");

    for (name, batch) in [
        ("the Redis stream", 100u32),
        ("the Redis stream", 500),
        ("RabbitMQ (confirms)", 100),
        ("RabbitMQ (confirms)", 500),
    ] {
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
        let sink: Arc<dyn Sink> = if name.starts_with("RabbitMQ") {
            channel
                .queue_purge(names.as_str().into(), QueuePurgeOptions::default())
                .await
                .expect("purge");
            Arc::new(AmqpSink::new(&amqp_url, &names, Duration::from_secs(5)).expect("amqp"))
        } else {
            Arc::new(
                RedisStreamSink::connect("redis://127.0.0.1:6379", &stream, Duration::from_secs(5))
                    .await
                    .expect("Redis"),
            )
        };
        let relay = Relay::new(
            store.clone(),
            sink,
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
            "relay.batch_size = {batch:>3}: {published} messages to {name} in {elapsed:.2} s = {:.0} messages/s",
            published as f64 / elapsed
        );
    }
    let queued = channel
        .queue_delete(names.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("queue delete");
    println!("RabbitMQ queue held {queued} messages of the last run");
    channel
        .exchange_delete(names.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .expect("exchange delete");
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
