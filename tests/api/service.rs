//! The service under hostile or unusual conditions: made-up methods and paths, slow bodies,
//! a sink that is down at start-up, a relay interval under one second.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with_jobs};
use crate::test_channel::{TestNotification, deliver};

crate::on_both_backends!(a_relay_interval_under_one_second_delivers_every_message);

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
    let response = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics");
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
                let method = match i % 5 {
                    0 => reqwest::Method::GET,
                    1 => reqwest::Method::from_bytes(noise.word(6).to_lowercase().as_bytes())
                        .expect("method"),
                    _ => reqwest::Method::from_bytes(noise.word(3 + i % 9).as_bytes())
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

/// Creates `order_no` and pays it through the notify path.
async fn paid_order(app: &TestApp, order_no: &str) {
    app.create_order(order_no, 100).await;
    let (status, body) = deliver(
        app,
        &TestNotification::paid(order_no, &format!("T-{order_no}"), 100),
    )
    .await;
    assert_eq!(status, 204, "{order_no}: {body}");
}

/// Polls `check` every 50 ms for at most `limit`; true once it held.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check().await
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
            paid_order(&app, &format!("IV-{wave}-{i}")).await;
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
