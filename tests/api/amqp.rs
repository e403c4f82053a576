//! The RabbitMQ sink against the real broker on 127.0.0.1:5672 (guest/guest). Every test
//! works in a vhost of its own (created with rabbitmqctl, deleted at the end), so closing
//! "the broker's connections" closes only the test's own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use paynotify::config::{Secret, SinkKind};
use paynotify::relay::Relay;
use paynotify::relay::sink::Sink;
use paynotify::relay::sinks::AmqpSink;
use paynotify::time::Clock;

use crate::support::helpers::{Backend, TestApp, readiness, spawn_app, spawn_app_with_jobs};

static VHOST: AtomicU32 = AtomicU32::new(0);
const EXCHANGE: &str = "paynotify.events";

fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("rabbitmqctl must be installed (RabbitMQ on 127.0.0.1:5672)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A vhost of the test's own, with guest's permissions; deleted (queues and all) on drop.
struct Vhost {
    name: String,
}

impl Vhost {
    fn create() -> Self {
        let name = format!(
            "pn-test-{}-{}",
            std::process::id(),
            VHOST.fetch_add(1, Ordering::Relaxed)
        );
        rabbitmqctl(&["add_vhost", &name]);
        rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]);
        Self { name }
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", self.name)
    }

    /// What a broker restart does to this vhost's clients: every connection closed.
    fn close_connections(&self) {
        rabbitmqctl(&[
            "close_all_connections",
            "--vhost",
            &self.name,
            "test: broker connection lost",
        ]);
    }

    /// A consumer's channel, with the sink's exchange declared as the sink declares it.
    async fn channel(&self) -> (Connection, Channel) {
        let connection = Connection::connect(&self.url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on 127.0.0.1:5672");
        let channel = connection.create_channel().await.expect("channel");
        channel
            .exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("exchange");
        (connection, channel)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["-q", "delete_vhost", &self.name])
            .output();
    }
}

/// A durable queue bound to the exchange by `routing_key`.
async fn bound_queue(channel: &Channel, queue: &str, routing_key: &str, arguments: FieldTable) {
    declared_queue(channel, queue, routing_key, true, arguments).await;
}

/// A queue bound by `routing_key`; a durable one acks persistent messages only once they are
/// on disk, so its confirms come later and more of them coalesce than a transient one's.
async fn declared_queue(
    channel: &Channel,
    queue: &str,
    routing_key: &str,
    durable: bool,
    arguments: FieldTable,
) {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .expect("queue");
    channel
        .queue_bind(
            queue.into(),
            EXCHANGE.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
}

/// One message as a consumer sees it.
#[derive(Debug)]
struct Received {
    routing_key: String,
    message_id: Option<String>,
    content_type: Option<String>,
    delivery_mode: Option<u8>,
    headers: BTreeMap<String, String>,
    body: serde_json::Value,
}

fn header(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// Takes every message now in `queue` (at most `limit`).
async fn drain(channel: &Channel, queue: &str, limit: usize) -> Vec<Received> {
    let mut received = Vec::new();
    while received.len() < limit {
        let got = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        let Some(message) = got else { break };
        let d = message.delivery;
        let p = &d.properties;
        received.push(Received {
            routing_key: d.routing_key.as_str().to_owned(),
            message_id: p.message_id().as_ref().map(|s| s.as_str().to_owned()),
            content_type: p.content_type().as_ref().map(|s| s.as_str().to_owned()),
            delivery_mode: *p.delivery_mode(),
            headers: p
                .headers()
                .as_ref()
                .map(|h| {
                    h.inner()
                        .iter()
                        .map(|(k, v)| (k.as_str().to_owned(), header(v)))
                        .collect()
                })
                .unwrap_or_default(),
            body: serde_json::from_slice(&d.data).expect("JSON body"),
        });
    }
    received
}

/// Pending outbox rows due now: `(topic, biz_key)` each.
async fn pending(app: &TestApp, rows: &[(&str, String)]) {
    let now = app
        .clock
        .now()
        .as_datetime()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    let values: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, (topic, key))| {
            format!("('{topic}', '{key}', '{{\"n\":{i}}}', 0, 0, '{now}', '{now}')")
        })
        .collect();
    for chunk in values.chunks(500) {
        app.db
            .execute(&format!(
                "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) VALUES {}",
                chunk.join(", ")
            ))
            .await;
    }
}

fn sink(vhost: &Vhost) -> Arc<AmqpSink> {
    Arc::new(AmqpSink::new(&vhost.url(), EXCHANGE, Duration::from_secs(5)).expect("sink"))
}

fn relay(app: &TestApp, sink: Arc<dyn Sink>, batch: u32) -> Relay {
    Relay::new(
        app.store.clone(),
        sink,
        app.clock.clone(),
        app.metrics.clone(),
        batch,
        16,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_arrives_with_its_headers_and_properties_and_is_marked_sent() {
    let vhost = Vhost::create();
    let (_consumer, channel) = vhost.channel().await;
    bound_queue(&channel, "all", "#", FieldTable::default()).await;
    let app = spawn_app(Backend::Sqlite).await;
    let rows: Vec<_> = (0..5).map(|i| ("ORDER_PAID", format!("P-{i}"))).collect();
    pending(&app, &rows).await;

    let report = relay(&app, sink(&vhost), 100).tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (5, 0), "{report:?}");
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 5);

    let received = drain(&channel, "all", 100).await;
    assert_eq!(received.len(), 5, "{received:?}");
    let stored = app.store.messages(None, 100).await.expect("messages");
    for (i, r) in received.iter().enumerate() {
        let key = format!("P-{i}");
        let row = stored
            .iter()
            .find(|m| m.biz_key == key)
            .expect("row exists");
        assert_eq!(r.routing_key, "ORDER_PAID");
        assert_eq!(r.message_id.as_deref(), Some(&*format!("ORDER_PAID:{key}")));
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        assert_eq!(r.delivery_mode, Some(2), "persistent");
        let expected: BTreeMap<String, String> = [
            ("biz_key".to_owned(), key.clone()),
            ("outbox_id".to_owned(), row.id.to_string()),
            ("topic".to_owned(), "ORDER_PAID".to_owned()),
        ]
        .into();
        assert_eq!(r.headers, expected);
        // The body is the event exactly as the http sink posts it.
        assert_eq!(r.body["id"], row.id);
        assert_eq!(r.body["topic"], "ORDER_PAID");
        assert_eq!(r.body["biz_key"], key);
        assert_eq!(r.body["payload"], serde_json::json!({ "n": i }));
        assert!(r.body["created_at"].as_str().is_some(), "{:?}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_bound_by_routing_key_gets_only_its_topic() {
    let vhost = Vhost::create();
    let (_consumer, channel) = vhost.channel().await;
    bound_queue(&channel, "paid", "ORDER_PAID", FieldTable::default()).await;
    bound_queue(
        &channel,
        "refunded",
        "ORDER_REFUNDED",
        FieldTable::default(),
    )
    .await;
    let app = spawn_app(Backend::Sqlite).await;
    let rows: Vec<_> = (0..6)
        .map(|i| {
            let topic = if i % 2 == 0 {
                "ORDER_PAID"
            } else {
                "ORDER_REFUNDED"
            };
            (topic, format!("K-{i}"))
        })
        .collect();
    pending(&app, &rows).await;

    let report = relay(&app, sink(&vhost), 100).tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (6, 0), "{report:?}");
    let paid = drain(&channel, "paid", 100).await;
    let refunded = drain(&channel, "refunded", 100).await;
    let keys = |r: &[Received]| {
        r.iter()
            .map(|m| m.body["biz_key"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&paid), ["K-0", "K-2", "K-4"]);
    assert_eq!(keys(&refunded), ["K-1", "K-3", "K-5"]);
    assert!(paid.iter().all(|m| m.routing_key == "ORDER_PAID"));
    assert!(refunded.iter().all(|m| m.routing_key == "ORDER_REFUNDED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_event_is_returned_and_stays_pending_until_a_queue_is_bound() {
    let vhost = Vhost::create();
    let (_consumer, channel) = vhost.channel().await;
    let app = spawn_app(Backend::Sqlite).await;
    pending(&app, &[("ORDER_PAID", "U-1".to_owned())]).await;
    let sink = sink(&vhost);

    // No queue bound: mandatory, so the broker returns it; the row stays pending.
    let report = relay(&app, sink.clone(), 100).tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (0, 1), "{report:?}");
    let row = &app.store.messages(None, 10).await.expect("messages")[0];
    assert_eq!((row.status, row.attempts), (0, 1), "{row:?}");
    let error = row.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("returned") && error.contains("312"),
        "{error}"
    );

    // Bound now: the retry after the backoff delivers it.
    bound_queue(&channel, "late", "ORDER_PAID", FieldTable::default()).await;
    app.clock.advance(3600);
    let report = relay(&app, sink, 100).tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (1, 0), "{report:?}");
    let received = drain(&channel, "late", 10).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body["biz_key"], "U-1");
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 1);
}

/// Issue #25 (2): lapin hands a return to whichever confirm completes next, and completes a
/// multiple-ack in hash-map order, so a return must not be trusted to name its own publish.
/// Rounds of interleaved topics, one of them unbound, in batches large enough that the
/// broker's acks coalesce; after each round the rows marked sent are exactly the ones the
/// queue received, and every unroutable row is pending with its `NO_ROUTE`.
async fn only_the_bound_topic_is_marked_sent_and_the_returned_ones_retry(durable: bool) {
    const ROUNDS: usize = 8;
    const PER_TOPIC: usize = 200;
    let vhost = Vhost::create();
    let (_consumer, channel) = vhost.channel().await;
    declared_queue(
        &channel,
        "paid",
        "ORDER_PAID",
        durable,
        FieldTable::default(),
    )
    .await;
    let app = spawn_app(Backend::Postgres).await;
    let relay = relay(&app, sink(&vhost), 1000);
    let mut received: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..ROUNDS {
        let rows: Vec<_> = (0..PER_TOPIC)
            .flat_map(|i| {
                [
                    ("ORDER_CLOSED", format!("C-{round}-{i}")),
                    ("ORDER_PAID", format!("P-{round}-{i}")),
                ]
            })
            .collect();
        pending(&app, &rows).await;
        // Until nothing is due: a tick with failures stops after its batch.
        loop {
            let report = relay.tick().await.expect("tick");
            if report.published + report.failed == 0 {
                break;
            }
        }
        for m in drain(&channel, "paid", usize::MAX).await {
            assert_eq!(m.routing_key, "ORDER_PAID", "{m:?}");
            let key = m.body["biz_key"].as_str().unwrap_or_default().to_owned();
            *received.entry(key).or_default() += 1;
        }
        let stored = app.store.messages(None, 10_000).await.expect("messages");
        let sent: BTreeSet<&str> = stored
            .iter()
            .filter(|m| m.status == 1)
            .map(|m| m.biz_key.as_str())
            .collect();
        let got: BTreeSet<&str> = received.keys().map(String::as_str).collect();
        let sent_not_received: Vec<_> = sent.difference(&got).collect();
        let received_not_sent: Vec<_> = got.difference(&sent).collect();
        assert!(
            sent_not_received.is_empty() && received_not_sent.is_empty(),
            "round {round} (durable {durable}): marked sent but never received \
             {sent_not_received:?}; received but not marked sent {received_not_sent:?}"
        );
        for m in stored.iter().filter(|m| m.topic == "ORDER_CLOSED") {
            let born: usize = m
                .biz_key
                .split('-')
                .nth(1)
                .and_then(|r| r.parse().ok())
                .expect("round");
            let error = m.last_error.clone().unwrap_or_default();
            assert_eq!(m.status, 0, "{} stays pending: {m:?}", m.biz_key);
            assert_eq!(
                m.attempts as usize,
                round - born + 1,
                "{} is retried every round: {m:?}",
                m.biz_key
            );
            assert!(
                error.contains("returned") && error.contains("312") && error.contains("NO_ROUTE"),
                "{}: {error}",
                m.biz_key
            );
        }
        // Every backoff (at most 12.5 minutes) has run out for the next round.
        app.clock.advance(3600);
    }
    assert_eq!(
        received.len(),
        ROUNDS * PER_TOPIC,
        "every ORDER_PAID arrived"
    );
    let repeated: Vec<_> = received.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "delivered again: {repeated:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_events_are_paired_by_id_with_a_transient_queue() {
    only_the_bound_topic_is_marked_sent_and_the_returned_ones_retry(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_events_are_paired_by_id_with_a_durable_queue() {
    only_the_bound_topic_is_marked_sent_and_the_returned_ones_retry(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_event_stays_pending() {
    let vhost = Vhost::create();
    let (_consumer, channel) = vhost.channel().await;
    // A queue that holds one message and nacks publishes beyond it.
    let mut arguments = FieldTable::default();
    arguments
        .insert(ShortString::from("x-max-length"), AMQPValue::LongInt(1))
        .insert(
            ShortString::from("x-overflow"),
            AMQPValue::LongString("reject-publish".into()),
        );
    bound_queue(&channel, "full", "#", arguments).await;
    let app = spawn_app(Backend::Sqlite).await;
    let rows: Vec<_> = (0..3).map(|i| ("ORDER_PAID", format!("N-{i}"))).collect();
    pending(&app, &rows).await;

    let report = relay(&app, sink(&vhost), 100).tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (1, 2), "{report:?}");
    let stored = app.store.messages(None, 10).await.expect("messages");
    let status = |key: &str| {
        let m = stored.iter().find(|m| m.biz_key == key).expect("row");
        (m.status, m.last_error.clone().unwrap_or_default())
    };
    assert_eq!(status("N-0").0, 1, "the acked one is sent");
    for key in ["N-1", "N-2"] {
        let (s, error) = status(key);
        assert_eq!(s, 0, "{key} stays pending");
        assert!(error.contains("nack"), "{key}: {error}");
    }
    let received = drain(&channel, "full", 10).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body["biz_key"], "N-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_lost_mid_drain_lose_nothing_and_the_sink_reconnects() {
    // Enough backlog that the drain outlasts several closes (rabbitmqctl takes about a
    // second to act).
    const ROWS: usize = 12_000;
    let vhost = Vhost::create();
    {
        let (consumer, channel) = vhost.channel().await;
        bound_queue(&channel, "all", "#", FieldTable::default()).await;
        let _ = consumer.close(200, "set up".into()).await;
    }
    let app = spawn_app(Backend::Postgres).await;
    let sink = sink(&vhost);
    // Small batches keep a batch in flight most of the time, so a close lands mid-batch.
    let relay = Arc::new(relay(&app, sink.clone(), 20));
    // A round is a backlog of ROWS drained while the vhost's connections are closed, until a
    // delivery has failed because of it (a close between two batches only makes the next one
    // reconnect). A round whose closes all fell between batches proves nothing: another
    // round, with a backlog of its own, up to 3.
    let (mut published, mut failed, mut closes, mut rounds) = (0, 0, 0, 0);
    while failed == 0 && rounds < 3 {
        let rows: Vec<_> = (0..ROWS)
            .map(|i| ("ORDER_PAID", format!("L-{rounds}-{i}")))
            .collect();
        pending(&app, &rows).await;
        rounds += 1;
        let drained = {
            let (relay, clock) = (relay.clone(), app.clock.clone());
            tokio::spawn(async move {
                let (mut published, mut failed) = (0, 0);
                let started = Instant::now();
                while published < ROWS && started.elapsed() < Duration::from_secs(180) {
                    let report = relay.tick().await.expect("tick");
                    published += report.published;
                    failed += report.failed;
                    if report.failed > 0 {
                        // The backoff runs out at once on the test's clock.
                        clock.advance(3600);
                    }
                }
                (published, failed)
            })
        };
        while !drained.is_finished() && app.metrics.relay_failed.get() == 0 && closes < 20 * rounds
        {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let v = vhost.name.clone();
            tokio::task::spawn_blocking(move || {
                rabbitmqctl(&[
                    "close_all_connections",
                    "--vhost",
                    &v,
                    "test: broker connection lost",
                ])
            })
            .await
            .expect("close");
            closes += 1;
        }
        let (round_published, round_failed) = drained.await.expect("drain");
        assert_eq!(
            round_published, ROWS,
            "round {rounds}: every row marked sent ({round_failed} failures)"
        );
        published += round_published;
        failed += round_failed;
    }
    assert!(
        failed > 0,
        "a connection was lost with a batch in flight ({closes} closes in {rounds} rounds)"
    );
    let total = ROWS * rounds;
    assert_eq!(published, total);
    assert_eq!(
        app.db.count("local_message WHERE status = 1").await,
        total as i64
    );

    // Every biz_key arrived at least once (a lost confirm may repeat one).
    let (_consumer, channel) = vhost.channel().await;
    let received = drain(&channel, "all", total * 2).await;
    let keys: BTreeSet<String> = received
        .iter()
        .map(|m| m.body["biz_key"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(keys.len(), total, "{} messages received", received.len());
    assert!(received.len() >= total);
    assert!(sink.is_up().await, "reconnected");
    vhost.close_connections();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_at_start_up_does_not_stop_serving_and_readyz_reports_the_sink() {
    // Nothing listens on port 1: the sink is down, the service serves.
    let app = spawn_app_with_jobs(Backend::Sqlite, |s| {
        s.relay.sink = SinkKind::Amqp;
        s.relay.amqp_url = Secret::new("amqp://guest:guest@127.0.0.1:1/%2f");
        s.relay.interval_ms = 200;
    })
    .await;
    app.create_order("AM-1", 100).await;
    let (status, body) = readiness(&app).await;
    assert_eq!(status, 200, "a sink that is down never makes it unready");
    assert_eq!(body["sink"], "down", "{body}");

    let vhost = Vhost::create();
    let up = spawn_app_with_jobs(Backend::Sqlite, |s| {
        s.relay.sink = SinkKind::Amqp;
        s.relay.amqp_url = Secret::new(vhost.url());
    })
    .await;
    let (_, body) = readiness(&up).await;
    assert_eq!(body["sink"], "up", "{body}");
}

#[test]
fn amqp_settings_mistakes_are_named() {
    for (url, exchange, key) in [
        ("", "paynotify.events", "relay.amqp_url"),
        ("amqps://h/%2f", "paynotify.events", "relay.amqp_url"),
        ("not a url", "paynotify.events", "relay.amqp_url"),
        ("amqp://127.0.0.1/%2f", "", "relay.amqp_exchange"),
    ] {
        let mut settings = crate::support::helpers::test_settings("sqlite://x.db");
        settings.relay.sink = SinkKind::Amqp;
        settings.relay.amqp_url = Secret::new(url);
        settings.relay.amqp_exchange = exchange.to_owned();
        let err = settings.validate().expect_err(url).to_string();
        assert!(err.contains(key), "{url} {exchange}: {err}");
        assert!(!err.contains("guest:"), "no password shown: {err}");
    }
}
