//! The service under hostile or unusual conditions: made-up methods and paths, slow bodies,
//! a sink that is down at start-up, a relay interval under one second.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paynotify::config::{Secret, SinkKind};
use paynotify::store::outbox::StoredMessage;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::helpers::{
    Backend, TestApp, eventually, free_port, readiness, redis_answers, spawn_app, spawn_app_with,
    spawn_app_with_jobs,
};
use crate::support::test_channel::paid_order;

crate::on_every_backend!(
    a_relay_interval_under_one_second_delivers_every_message,
    redis_down_at_start_up_keeps_the_outbox_and_delivers_once_it_answers,
    the_stream_goes_to_relay_redis_url_and_survives_a_flush_of_the_gate,
);

/// A small xorshift generator: reproducible "random" methods and paths without a crate.
struct Noise(AtomicU64);

impl Noise {
    fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed | 1))
    }
    fn next(&self) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        x
    }
    /// `len` upper-case letters: a valid HTTP method token nobody uses.
    fn word(&self, len: usize) -> String {
        (0..len)
            .map(|_| char::from(b'A' + (self.next() % 26) as u8))
            .collect()
    }
}

async fn metrics_text(app: &TestApp) -> String {
    let response = app.get_without_token("/metrics").await;
    assert_eq!(response.status(), 200);
    response.text().await.expect("metrics text")
}

/// Every series of a Prometheus text answer: the name and labels, without the value.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_owned())
        .collect()
}

/// `count` requests with made-up methods (and a few standard ones) on made-up paths (and a
/// few real ones), four connections at a time.
async fn hostile_requests(app: &TestApp, noise: &Arc<Noise>, count: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let (client, base, noise) = (app.client.clone(), app.address.clone(), noise.clone());
        tasks.spawn(async move {
            for i in (worker..count).step_by(4) {
                // Made-up methods start with X, so a random word is never by chance a
                // standard method (`PUT`), which is a bounded label value of its own.
                let method = match i % 5 {
                    0 => reqwest::Method::GET,
                    1 => reqwest::Method::from_bytes(
                        format!("x{}", noise.word(6).to_lowercase()).as_bytes(),
                    )
                    .expect("method"),
                    _ => reqwest::Method::from_bytes(
                        format!("X{}", noise.word(2 + i % 9)).as_bytes(),
                    )
                    .expect("method"),
                };
                let path = match i % 4 {
                    0 => format!("/orders/{}", noise.word(8)),
                    1 => "/notify/alipay".to_owned(),
                    _ => format!("/{}/{}", noise.word(5), noise.next()),
                };
                let response = client
                    .request(method, format!("{base}{path}"))
                    .send()
                    .await
                    .expect("request");
                assert!(response.status().as_u16() >= 400, "{path}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("request task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_and_paths_do_not_add_metric_series() {
    let app = spawn_app(Backend::Sqlite).await;
    let noise = Arc::new(Noise::new(0x9e37_79b9_7f4a_7c15));
    // One of each kind first, so every bounded label value already exists.
    hostile_requests(&app, &noise, 40).await;
    let before = metrics_text(&app).await;
    hostile_requests(&app, &noise, 4000).await;
    let after = metrics_text(&app).await;
    assert_eq!(
        series(&before),
        series(&after),
        "4,000 more requests with made-up methods and paths added series"
    );
    // Only counts changed: a few more digits, never a series per method or path.
    assert!(
        after.len() < before.len() + 1024,
        "/metrics grew from {} to {} bytes",
        before.len(),
        after.len()
    );
    assert!(
        after.contains(r#"route="unmatched""#) && after.contains(r#"method="other""#),
        "the catch-all label values are used"
    );
}

fn wall_clock_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

async fn a_relay_interval_under_one_second_delivers_every_message(backend: Backend) {
    let app = spawn_app_with_jobs(backend, |s| s.relay.interval_ms = 200).await;
    let started = wall_clock_seconds();
    // The first ticks run with nothing to send: every message arrives after them, in two
    // waves with a pause between.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for wave in 0..2 {
        for i in 0..30 {
            paid_order(&app, &format!("IV-{wave}-{i}"), 100).await;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let all_sent = eventually(Duration::from_secs(15), || async {
        app.db
            .count("local_message WHERE topic = 'ORDER_PAID' AND status = 1")
            .await
            == 60
    })
    .await;
    assert!(
        all_sent,
        "sent {} of 60 within 15 s at relay.interval_ms = 200",
        app.db
            .count("local_message WHERE topic = 'ORDER_PAID' AND status = 1")
            .await
    );
    assert_eq!(app.db.count("local_message WHERE status <> 1").await, 0);
    let heartbeat = app.metrics.relay_last_success_timestamp_seconds.get();
    assert!(
        heartbeat >= started,
        "the last successful tick ({heartbeat}) is after the start ({started})"
    );
    assert!(
        metrics_text(&app)
            .await
            .contains("paynotify_relay_last_success_timestamp_seconds "),
        "the heartbeat is exported"
    );
}

/// A `redis-server` of the test's own on `port`, stopped when dropped.
struct OwnRedis(std::process::Child);

impl OwnRedis {
    async fn start(port: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed (bash tests/run.sh uses it too)");
        let own = Self(child);
        let up = redis_answers(&format!("redis://127.0.0.1:{port}")).await;
        assert!(up, "own redis-server on port {port} did not answer");
        own
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn paid_message(app: &TestApp, order_no: &str) -> StoredMessage {
    app.outbox("ORDER_PAID")
        .await
        .into_iter()
        .find(|m| m.biz_key == order_no)
        .expect("the ORDER_PAID message exists")
}

async fn redis_down_at_start_up_keeps_the_outbox_and_delivers_once_it_answers(backend: Backend) {
    let port = free_port();
    let stream = format!("paynotify:test:down:{}:{port}", std::process::id());
    let app = spawn_app_with_jobs(backend, |s| {
        s.redis.url = Secret::new(format!("redis://127.0.0.1:{port}"));
        s.relay.sink = SinkKind::RedisStream;
        s.relay.redis_stream = stream.clone();
        s.relay.interval_ms = 200;
    })
    .await;

    // The notify endpoints are up and the payment is stored with its message.
    paid_order(&app, "RD-1", 100).await;
    assert_eq!(app.status_of("RD-1").await, "PAID");
    let tried = eventually(Duration::from_secs(10), || async {
        paid_message(&app, "RD-1").await.attempts >= 1
    })
    .await;
    let first = paid_message(&app, "RD-1").await;
    assert!(tried, "the relay tried to deliver: {first:?}");
    assert_eq!(first.status, 0, "kept pending: {first:?}");
    let error = first.last_error.clone().unwrap_or_default();
    assert!(error.contains("redis"), "{error}");
    let (status, body) = readiness(&app).await;
    assert_eq!(
        status, 200,
        "a sink that is down does not make the service unready"
    );
    assert_eq!(body["sink"], "down", "{body}");
    assert_eq!(body["database"], "up", "{body}");

    // The backoff runs out: another attempt, still pending.
    app.clock.advance(3600);
    let retried = eventually(Duration::from_secs(10), || async {
        paid_message(&app, "RD-1").await.attempts >= 2
    })
    .await;
    let second = paid_message(&app, "RD-1").await;
    assert!(retried, "retried with backoff: {second:?}");
    assert_eq!(second.status, 0, "{second:?}");

    // Redis comes up: the next due attempt delivers it.
    let _redis = OwnRedis::start(port).await;
    app.clock.advance(3600);
    let sent = eventually(Duration::from_secs(15), || async {
        paid_message(&app, "RD-1").await.status == 1
    })
    .await;
    assert!(
        sent,
        "delivered once Redis answers: {:?}",
        paid_message(&app, "RD-1").await
    );
    let entries =
        crate::support::helpers::stream_entries(&format!("redis://127.0.0.1:{port}"), &stream)
            .await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0]
            .1
            .contains(&("biz_key".to_owned(), "RD-1".to_owned())),
        "{entries:?}"
    );
    let (_, body) = readiness(&app).await;
    assert_eq!(body["sink"], "up", "{body}");
}

/// The gate on one Redis, the event stream on another (`relay.redis_url`): flushing the
/// gate's Redis, as one may do with a cache, leaves every published event in place.
async fn the_stream_goes_to_relay_redis_url_and_survives_a_flush_of_the_gate(backend: Backend) {
    let gate_port = free_port();
    let stream_port = free_port();
    let _gate_redis = OwnRedis::start(gate_port).await;
    let _stream_redis = OwnRedis::start(stream_port).await;
    let gate_url = format!("redis://127.0.0.1:{gate_port}");
    let stream_url = format!("redis://127.0.0.1:{stream_port}");
    let stream = "paynotify:events".to_owned();
    let app = spawn_app_with_jobs(backend, |s| {
        s.redis.url = Secret::new(gate_url.clone());
        s.relay.sink = SinkKind::RedisStream;
        s.relay.redis_stream = stream.clone();
        s.relay.redis_url = Secret::new(stream_url.clone());
        s.relay.interval_ms = 200;
    })
    .await;

    paid_order(&app, "RS-1", 100).await;
    let sent = eventually(Duration::from_secs(10), || async {
        paid_message(&app, "RS-1").await.status == 1
    })
    .await;
    assert!(sent, "relayed: {:?}", paid_message(&app, "RS-1").await);
    assert!(
        crate::support::helpers::stream_entries(&gate_url, &stream)
            .await
            .is_empty(),
        "nothing is published into the gate's Redis"
    );

    let mut gate = crate::support::helpers::redis_connection(&gate_url)
        .await
        .expect("gate redis answers");
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut gate)
        .await
        .expect("FLUSHALL");
    let entries = crate::support::helpers::stream_entries(&stream_url, &stream).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0]
            .1
            .contains(&("biz_key".to_owned(), "RS-1".to_owned())),
        "{entries:?}"
    );
}

/// Opens a connection to `port` and sends the head of a `POST path` announcing a
/// 60,000-byte body, then only its first bytes.
async fn start_slow_body(port: u16, path: &str, content_type: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n\
         Authorization: Bearer {}\r\nContent-Length: 60000\r\n\r\n{{\"order",
        crate::support::helpers::API_TOKEN
    );
    stream.write_all(head.as_bytes()).await.expect("send head");
    stream
}

/// Everything the server sends until it closes the connection (at most `limit`).
async fn read_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<String> {
    let mut answer = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut answer))
        .await
        .ok()
        .map(|_| String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_answered_408_within_the_deadline() {
    let app = spawn_app_with(Backend::Sqlite, |s| s.server.body_timeout_ms = 500).await;
    let port: u16 = app
        .address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    for (path, content_type, shape) in [
        ("/notify/wechat/pay", "application/json", r#""code":"FAIL""#),
        (
            "/notify/wechat/refund",
            "application/json",
            r#""code":"FAIL""#,
        ),
        (
            "/notify/alipay",
            "application/x-www-form-urlencoded",
            "\r\n\r\nfail",
        ),
        ("/orders", "application/json", r#""error":"#),
    ] {
        let started = Instant::now();
        let mut stream = start_slow_body(port, path, content_type).await;
        let answer = read_until_closed(&mut stream, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| {
                panic!("{path}: no answer (or the connection stayed open) after 5 s")
            });
        let took = started.elapsed();
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            answer.contains(shape),
            "{path}: not in the route's shape: {answer}"
        );
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(3),
            "{path}: answered after {took:?} with a 500 ms deadline"
        );
    }
    // Counted as what it is, not as a malformed request.
    for channel in ["wechat", "alipay"] {
        assert!(
            crate::support::helpers::metric(
                &app,
                "paynotify_notify_rejections_total",
                &[channel, "body_timeout"]
            ) >= 1,
            "{channel}"
        );
    }
    // A body that arrives in time is read as before.
    app.create_order("BD-1", 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_do_not_hold_a_graceful_shutdown() {
    use paynotify::startup::{Application, Options};

    paynotify::telemetry::init_for_tests();
    let db = crate::support::helpers::TestDb::create(Backend::Sqlite).await;
    let mut settings = crate::support::helpers::test_settings(db.url());
    settings.server.body_timeout_ms = 500;
    let app = Application::build(&settings, Options::default())
        .await
        .expect("application builds");
    let (port, handle) = (app.port(), app.handle());
    let server = tokio::spawn(app.run_until_stopped());
    let mut slow = Vec::new();
    for path in ["/notify/wechat/pay", "/notify/alipay", "/orders"] {
        slow.push(start_slow_body(port, path, "application/json").await);
    }
    // The server must hold the three requests before it is told to stop (a connection still
    // in the listen backlog is refused at the stop, never answered): a request sent after them
    // is answered only once the acceptor has passed them on, and the workers then read their
    // heads well inside the 500 ms deadline.
    let health = reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
        .await
        .expect("the server answers while the slow bodies trickle");
    assert!(health.status().is_success(), "{}", health.status());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let started = Instant::now();
    handle.stop(true).await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(
        stopped.is_ok(),
        "three slow bodies held the graceful shutdown for more than 10 s"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown took {:?} with a 500 ms body deadline",
        started.elapsed()
    );
    for mut stream in slow {
        let answer = read_until_closed(&mut stream, Duration::from_secs(1))
            .await
            .unwrap_or_default();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_url_it_cannot_use_stops_start_up_naming_the_key() {
    use paynotify::startup::{Application, Options};

    paynotify::telemetry::init_for_tests();
    let db = crate::support::helpers::TestDb::create(Backend::Sqlite).await;
    let mut settings = crate::support::helpers::test_settings(db.url());
    settings.relay.sink = SinkKind::Http;
    settings.relay.http_url = "ftp://hooks.example/paynotify".into();
    settings.relay.http_secret = Secret::new("s");
    settings.validate().expect("passes the static checks");
    let Err(err) = Application::build(&settings, Options::default()).await else {
        panic!("a URL that is neither http:// nor https:// must stop start-up");
    };
    assert!(err.to_string().contains("relay.http_url"), "{err}");
}
