//! The Redis gate against the real Redis on 127.0.0.1:6379 (a key prefix per test): faster
//! duplicates, and exactly once whatever Redis does — down, cut mid-storm, flushed, or holding
//! a marker whose owner died.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::support::helpers::{
    Backend, Storm, TestApp, metric, readiness, released_together, spawn_app_with,
};
use crate::support::test_channel::{TestNotification, deliver};

const REDIS: &str = "redis://127.0.0.1:6379";
/// What a notice's key holds while a request applies it (its final answer after).
const MARKER: &str = "applying";
static PREFIX: AtomicU32 = AtomicU32::new(0);

fn prefix() -> String {
    format!(
        "pn-test:{}:{}:",
        std::process::id(),
        PREFIX.fetch_add(1, Ordering::Relaxed)
    )
}

/// The gate with a 1 s Redis timeout: a call timed out is a bypass to the ledger (correct,
/// but not from the cache), and on a two-core machine running the whole suite at a load
/// average of 10 a 50 ms timeout made the counts these tests assert come out short. The
/// timeout's own behaviour is tested with a Redis that is unreachable or cut, which fails
/// at once, not with a clock.
async fn app_with_redis(backend: Backend, url: &str, prefix: &str) -> TestApp {
    app_with_redis_timeout(backend, url, prefix, 1000).await
}

async fn app_with_redis_timeout(
    backend: Backend,
    url: &str,
    prefix: &str,
    timeout_ms: u64,
) -> TestApp {
    gate_app(backend, url, prefix, move |s| {
        s.redis.timeout_ms = timeout_ms
    })
    .await
}

/// The gate with nothing kept in memory (`redis.recent_answers = 0`): every repeat asks
/// Redis, for the tests of what Redis itself does (a flush, a cut, a planted answer).
async fn app_with_redis_only(backend: Backend, url: &str, prefix: &str) -> TestApp {
    gate_app(backend, url, prefix, |s| s.redis.recent_answers = 0).await
}

/// The gate on `url` under `prefix` (1 s timeout, markers of 2 s), then `tweak`.
async fn gate_app(
    backend: Backend,
    url: &str,
    prefix: &str,
    tweak: impl FnOnce(&mut paynotify::config::Settings),
) -> TestApp {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    spawn_app_with(backend, move |s| {
        s.redis.url = paynotify::config::Secret::new(url);
        s.redis.key_prefix = prefix;
        s.redis.timeout_ms = 1000;
        s.redis.marker_ttl_ms = 2000;
        tweak(s);
    })
    .await
}

/// Repeats answered from this instance's memory, without Redis.
fn from_memory(app: &TestApp) -> u64 {
    metric(app, "paynotify_gate_total", &["hit_local"])
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(REDIS)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must run on 127.0.0.1:6379 (bash tests/run.sh starts it)")
}

/// Deletes every key of one test: what FLUSHALL does to it, without touching other tests.
pub(crate) async fn flush(prefix: &str) {
    let mut c = redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await
        .expect("keys");
    for key in keys {
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut c)
            .await
            .expect("del");
    }
}

fn cached(app: &TestApp) -> u64 {
    metric(
        app,
        "paynotify_notifications_total",
        &["wechat", "duplicate_cached"],
    )
}

/// Duplicates the ledger answered (the gate did not).
fn from_ledger(app: &TestApp) -> u64 {
    metric(
        app,
        "paynotify_notifications_total",
        &["wechat", "duplicate"],
    )
}

/// Delivers every notice at once (released together by a barrier); their statuses, in order.
async fn at_once(app: &Arc<TestApp>, notices: Vec<TestNotification>) -> Vec<StatusCode> {
    released_together(notices.len(), |i| {
        let (app, n) = (app.clone(), notices[i].clone());
        async move { deliver(&app, &n).await.0 }
    })
    .await
}

crate::on_every_backend!(fifty_concurrent_deliveries_one_transition_duplicates_from_the_cache);

async fn fifty_concurrent_deliveries_one_transition_duplicates_from_the_cache(backend: Backend) {
    let prefix = prefix();
    // A Redis call timed out is a bypass to the ledger (correct, but not from the cache): on a
    // two-core machine running the whole suite, 50 ms is too tight for the count below.
    let app = Arc::new(app_with_redis_timeout(backend, REDIS, &prefix, 1000).await);
    app.create_order("G-50", 19900).await;
    let n = TestNotification::paid("G-50", "T-50", 19900);
    let statuses = at_once(&app, vec![n.clone(); 50]).await;
    let busy = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::NO_CONTENT || *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.db.count("pay_callback").await, 1);
    let from_cache = cached(&app);
    let ledger = from_ledger(&app);
    assert_eq!(from_cache + ledger + busy as u64, 49, "{statuses:?}");
    assert!(
        from_cache >= 25,
        "most duplicates answered from the cache: {from_cache} of 49"
    );
    // A later repeat is answered from the cache, byte for byte like the first answer.
    assert_eq!(
        deliver(&app, &n).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    assert_eq!(cached(&app), from_cache + 1);
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_answered_together_are_cached_in_shared_round_trips() {
    const N: usize = 100;
    let prefix = prefix();
    // 1 s: a round trip timed out is a bypass, and the counts below would not add up.
    let app = Arc::new(app_with_redis_timeout(Backend::Postgres, REDIS, &prefix, 1000).await);
    let notice = |i: usize| TestNotification::paid(&format!("G-T{i}"), &format!("T-{i}"), 100);
    for i in 0..N {
        app.create_order(&format!("G-T{i}"), 100).await;
    }
    let statuses = at_once(&app, (0..N).map(notice).collect()).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::NO_CONTENT),
        "{statuses:?}"
    );
    assert_eq!(app.messages("ORDER_PAID").await, N as i64);
    // Each notice made two calls (before the ledger; after its answer, to cache it and give
    // its marker back) …
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.metrics.gate_calls.get() < 2 * N as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (calls, trips) = (
        app.metrics.gate_calls.get(),
        app.metrics.gate_round_trips.get(),
    );
    assert_eq!(calls, 2 * N as u64);
    // … one round trip each before the ledger, and the calls after it several to a round
    // trip (one each without the shared pipelines: `after` would be N).
    let after = trips.saturating_sub(N as u64);
    assert!(
        after * 2 <= N as u64,
        "{trips} round trips for {calls} calls"
    );
    // Every answer was cached: each repeat comes from the cache, none from the ledger.
    for i in 0..N {
        assert_eq!(deliver(&app, &notice(i)).await.0, StatusCode::NO_CONTENT);
    }
    assert_eq!(cached(&app), N as u64);
    assert_eq!(from_ledger(&app), 0);
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_from_the_start_changes_only_speed() {
    let app = Arc::new(app_with_redis(Backend::Postgres, "redis://127.0.0.1:1", &prefix()).await);
    app.create_order("G-DOWN", 100).await;
    let n = TestNotification::paid("G-DOWN", "T", 100);
    let statuses = at_once(&app, vec![n.clone(); 20]).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::NO_CONTENT),
        "{statuses:?}"
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    let bypassed = ["bypass_error", "bypass_timeout", "bypass_breaker_open"]
        .iter()
        .map(|r| metric(&app, "paynotify_gate_total", &[r]))
        .sum::<u64>();
    assert!(
        bypassed >= 20,
        "every delivery bypassed the gate: {bypassed}"
    );
    let (status, body) = readiness(&app).await;
    assert_eq!(status, 200, "Redis down never makes the service unready");
    assert_eq!(
        (body["database"].as_str(), body["redis"].as_str()),
        (Some("up"), Some("down"))
    );
}

/// A TCP proxy to Redis that the test can cut (dropping every connection and refusing new
/// ones) and restore.
struct Proxy {
    port: u16,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (cut, watching) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *watching.borrow() {
                    continue;
                }
                let mut watching = watching.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = TcpStream::connect("127.0.0.1:6379").await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream) => {}
                        _ = watching.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { port, cut }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_mid_storm_stays_exactly_once_and_recovers() {
    let prefix = prefix();
    let proxy = Proxy::start().await;
    // Nothing kept in memory: the storm's repeats and the recovery below must ask Redis.
    let app = Arc::new(
        app_with_redis_only(
            Backend::Postgres,
            &format!("redis://127.0.0.1:{}", proxy.port),
            &prefix,
        )
        .await,
    );
    let orders: Vec<String> = (0..6).map(|i| format!("G-CUT-{i}")).collect();
    for no in &orders {
        app.create_order(no, 100).await;
    }
    let storm = Storm::start(&app, &orders, None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.cut.send_replace(true);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.cut.send_replace(false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let statuses = storm.stop().await;
    crate::support::helpers::assert_storm_answers(&statuses);
    assert_eq!(
        app.messages("ORDER_PAID").await,
        6,
        "one transition per order"
    );
    assert_eq!(app.db.count("pay_callback").await, 6);
    let bypassed: u64 = ["bypass_error", "bypass_timeout", "bypass_breaker_open"]
        .iter()
        .map(|r| metric(&app, "paynotify_gate_total", &[r]))
        .sum();
    assert!(bypassed > 0, "the cut was felt");

    // Recovery: once the breaker lets a probe through, duplicates come from the cache again.
    let before = cached(&app);
    let deadline = Instant::now() + Duration::from_secs(15);
    while cached(&app) == before {
        assert!(Instant::now() < deadline, "the gate never recovered");
        assert_eq!(
            deliver(&app, &TestNotification::paid("G-CUT-0", "T-G-CUT-0", 100))
                .await
                .0,
            StatusCode::NO_CONTENT
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_flush_the_next_duplicate_goes_to_the_ledger_and_is_still_a_duplicate() {
    let prefix = prefix();
    let app = app_with_redis_only(Backend::Sqlite, REDIS, &prefix).await;
    app.create_order("G-F", 100).await;
    let n = TestNotification::paid("G-F", "T", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(cached(&app), 1);
    flush(&prefix).await;
    assert_eq!(
        deliver(&app, &n).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    assert_eq!(from_ledger(&app), 1);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(from_memory(&app), 0, "recent_answers = 0 keeps nothing");
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_whose_holder_died_blocks_only_until_it_expires() {
    let prefix = prefix();
    // Our own markers live 60 s here, so "given back" below is the release, never the TTL.
    let app = gate_app(Backend::Sqlite, REDIS, &prefix, |s| {
        s.redis.marker_ttl_ms = 60_000;
    })
    .await;
    app.create_order("G-M", 100).await;
    let mut c = redis().await;
    // The notice's one key holds the marker while a request applies it, then its answer.
    let marker = format!("{prefix}{{G-M}}:pay:wechat");
    // A holder that died: its marker held for 5 s, ample for one delivery on a loaded machine.
    let _: () = redis::cmd("SET")
        .arg(&marker)
        .arg(MARKER)
        .arg("PX")
        .arg(5000)
        .query_async(&mut c)
        .await
        .expect("set");
    let n = TestNotification::paid("G-M", "T", 100);
    assert_eq!(
        deliver(&app, &n).await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "held: retry later"
    );
    assert_eq!(app.status_of("G-M").await, "WAIT_PAY");
    // Once it has expired (watched, not slept on), the next delivery goes through.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held: Option<String> = redis::cmd("GET")
            .arg(&marker)
            .query_async(&mut c)
            .await
            .expect("get");
        if held.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead holder's marker never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.status_of("G-M").await, "PAID");
    // Our own marker is given back once the provider has its answer (replaced by the answer,
    // cached for `redis.result_ttl_secs`): long before its 60 s TTL would remove it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left: Option<String> = Some(MARKER.to_owned());
    while left.as_deref() == Some(MARKER) && Instant::now() < deadline {
        left = redis::cmd("GET")
            .arg(&marker)
            .query_async(&mut c)
            .await
            .expect("get");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        left.as_deref()
            .is_some_and(|v| v != MARKER && v.contains(':')),
        "our own marker was released for the answer: {left:?}"
    );
    let ttl: i64 = redis::cmd("TTL")
        .arg(&marker)
        .query_async(&mut c)
        .await
        .expect("ttl");
    assert!(
        ttl > 60,
        "cached for the retry window, not the marker's: {ttl} s"
    );
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_answer_never_turns_a_conflict_into_a_success() {
    let prefix = prefix();
    // What Redis holds is on trial here, so nothing is answered from memory.
    let app = app_with_redis_only(Backend::Sqlite, REDIS, &prefix).await;
    app.create_order("G-C", 100).await;
    assert_eq!(
        deliver(&app, &TestNotification::paid("G-C", "T-1", 100))
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    // The same payment with another amount: the ledger's 409.
    let (status, _) = deliver(&app, &TestNotification::paid("G-C", "T-1", 99)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(app.get_order("G-C").await["transaction_id"], "T-1");
    // Even with the other content's digest planted under the key, the ledger decides.
    let mut c = redis().await;
    let key = format!("{prefix}{{G-C}}:pay:wechat");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("0".repeat(64))
        .query_async(&mut c)
        .await
        .expect("set");
    assert_eq!(
        deliver(&app, &TestNotification::paid("G-C", "T-1", 100))
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(from_ledger(&app), 1);
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_replays_are_identical_with_the_gate() {
    let prefix = prefix();
    let app = app_with_redis(Backend::Sqlite, REDIS, &prefix).await;
    let post = |amount: i64| {
        app.client
            .post(app.url("/orders"))
            .bearer_auth(&app.api_token)
            .header("Idempotency-Key", "gate-key")
            .json(&serde_json::json!({ "order_no": "G-O", "amount_fen": amount }))
            .send()
    };
    let first = post(100).await.expect("post");
    let (status, body) = (first.status(), first.text().await.expect("body"));
    assert_eq!(status, 201);
    for _ in 0..2 {
        let again = post(100).await.expect("post");
        assert_eq!(
            (again.status(), again.text().await.expect("body")),
            (status, body.clone())
        );
    }
    assert_eq!(post(101).await.expect("post").status(), 422);
    // The answer now comes from Redis: even with the database rows gone, the same bytes.
    app.db.execute("DELETE FROM idempotency_key").await;
    app.db.execute("DELETE FROM orders").await;
    let cached = post(100).await.expect("post");
    assert_eq!(
        (cached.status(), cached.text().await.expect("body")),
        (status, body)
    );
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_are_not_final_are_never_cached() {
    let prefix = prefix();
    let app = app_with_redis(Backend::Sqlite, REDIS, &prefix).await;
    let n = TestNotification::paid("G-LATE", "T", 100);
    // Unknown order: 404, and the order created afterwards is then really paid.
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NOT_FOUND);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NOT_FOUND);
    app.create_order("G-LATE", 100).await;
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.status_of("G-LATE").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    flush(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_go_through_the_gate_by_their_own_key() {
    let prefix = prefix();
    let app = app_with_redis(Backend::Sqlite, REDIS, &prefix).await;
    app.create_order("G-R", 1000).await;
    assert_eq!(
        deliver(&app, &TestNotification::paid("G-R", "T", 1000))
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    let refund = |no: &str, fen: i64| {
        let mut n = TestNotification::paid("G-R", "T", 1000);
        n.kind = "refunded".into();
        // A refund number with the characters that structure keys.
        n.refund = Some((no.to_owned(), format!("RID-{no}"), fen));
        n
    };
    let before = cached(&app);
    assert_eq!(
        deliver(&app, &refund("R:1}", 300)).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        deliver(&app, &refund("R:1}", 300)).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(cached(&app), before + 1, "the repeat came from the cache");
    assert_eq!(
        deliver(&app, &refund("R:1}:marker", 700)).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.refund_state("G-R").await, ("REFUNDED".into(), 1000));
    // Same refund key, other content: the ledger's 409, never the cached success.
    assert_eq!(
        deliver(&app, &refund("R:1}", 301)).await.0,
        StatusCode::CONFLICT
    );
    flush(&prefix).await;
}

/// A repeat this instance answered lately is answered from memory: no Redis round trip, so
/// even with Redis cut off it needs neither Redis nor the database. Other content under the
/// same key, and a notice this instance never answered, still go to the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_this_instance_answered_needs_neither_redis_nor_the_database() {
    let prefix = prefix();
    let proxy = Proxy::start().await;
    let app = app_with_redis(
        Backend::Sqlite,
        &format!("redis://127.0.0.1:{}", proxy.port),
        &prefix,
    )
    .await;
    app.create_order("G-MEM", 100).await;
    app.create_order("G-MEM-2", 100).await;
    let n = TestNotification::paid("G-MEM", "T-MEM", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    // Its answer cached and marker given back: two calls.
    gate_calls_reach(&app, 2).await;
    assert_eq!(app.metrics.gate_calls.get(), 2);

    assert_eq!(
        deliver(&app, &n).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    assert_eq!(from_memory(&app), 1);
    assert_eq!(cached(&app), 1);
    assert_eq!(
        app.metrics.gate_calls.get(),
        2,
        "no Redis call for the repeat"
    );

    proxy.cut.send_replace(true);
    for _ in 0..3 {
        assert_eq!(
            deliver(&app, &n).await,
            (StatusCode::NO_CONTENT, String::new())
        );
    }
    assert_eq!(from_memory(&app), 4);
    assert_eq!(
        from_ledger(&app),
        0,
        "none of the repeats reached the ledger"
    );
    // The same key with other content: the ledger's 409, never the remembered success.
    assert_eq!(
        deliver(&app, &TestNotification::paid("G-MEM", "T-MEM", 99))
            .await
            .0,
        StatusCode::CONFLICT
    );
    // An order this instance never answered: bypassed to the ledger, and paid.
    assert_eq!(
        deliver(&app, &TestNotification::paid("G-MEM-2", "T-MEM-2", 100))
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.status_of("G-MEM-2").await, "PAID");
    assert_eq!(from_memory(&app), 4);
    assert_eq!(app.messages("ORDER_PAID").await, 2);
    assert_eq!(app.db.count("pay_callback").await, 2);
    proxy.cut.send_replace(false);
    flush(&prefix).await;
}

/// What an instance remembers lives no longer than the answer it cached in Redis
/// (`redis.result_ttl_secs`): after it, a repeat goes to Redis, then to the ledger, which
/// still answers it as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_answer_expires_with_the_redis_one() {
    let prefix = prefix();
    let app = gate_app(Backend::Sqlite, REDIS, &prefix, |s| {
        s.redis.result_ttl_secs = 1;
    })
    .await;
    app.create_order("G-TTL", 100).await;
    let n = TestNotification::paid("G-TTL", "T", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(from_memory(&app), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        deliver(&app, &n).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    assert_eq!(from_memory(&app), 1, "forgotten after the TTL");
    assert_eq!(from_ledger(&app), 1);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    flush(&prefix).await;
}

/// What one connection sent to Redis.
type Sent = Arc<std::sync::Mutex<Vec<u8>>>;

/// A TCP proxy to Redis that keeps what its clients sent, to count the gate's commands.
struct Recorder {
    port: u16,
    sent: Arc<std::sync::Mutex<Vec<Sent>>>,
}

impl Recorder {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent: Arc<std::sync::Mutex<Vec<Sent>>> = Arc::default();
        let connections = sent.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let bytes: Sent = Arc::default();
                connections.lock().expect("lock").push(bytes.clone());
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect("127.0.0.1:6379").await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = inbound.into_split();
                    let (mut from_redis, mut to_redis) = upstream.into_split();
                    let back = tokio::spawn(async move {
                        tokio::io::copy(&mut from_redis, &mut to_client).await
                    });
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                        bytes.lock().expect("lock").extend_from_slice(&buf[..n]);
                        if to_redis.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    back.abort();
                });
            }
        });
        Self { port, sent }
    }

    /// Every command sent so far, by name and first argument, in order per connection.
    fn commands(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for bytes in self.sent.lock().expect("lock").iter() {
            let bytes = bytes.lock().expect("lock").clone();
            let mut at = 0;
            // A line up to \r\n from `at`: its text, and where the next one starts.
            let line = |at: usize| {
                let end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
                Some((
                    String::from_utf8_lossy(&bytes[at..end]).into_owned(),
                    end + 2,
                ))
            };
            while at < bytes.len() {
                let Some((head, next)) = line(at) else { break };
                let count: usize = head[1..].parse().expect("*<count>");
                at = next;
                let mut words = Vec::new();
                for _ in 0..count {
                    let (len, next) = line(at).expect("$<len>");
                    let len: usize = len[1..].parse().expect("length");
                    words.push(String::from_utf8_lossy(&bytes[next..next + len]).into_owned());
                    at = next + len + 2;
                }
                let mut words = words.into_iter();
                let name = words.next().unwrap_or_default().to_uppercase();
                out.push((name, words.next().unwrap_or_default()));
            }
        }
        out
    }

    /// The commands sent so far on the keys under `prefix`.
    fn on_keys(&self, prefix: &str) -> Vec<(String, String)> {
        self.commands()
            .into_iter()
            .filter(|(_, key)| key.starts_with(prefix))
            .collect()
    }
}

/// A first delivery costs Redis two commands on one key (the marker taken and the answer
/// read in one, then the answer in place of the marker), and a repeat from Redis one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_delivery_is_two_commands_on_one_key_and_a_repeat_one() {
    let prefix = prefix();
    let recorder = Recorder::start().await;
    let app = app_with_redis_only(
        Backend::Sqlite,
        &format!("redis://127.0.0.1:{}", recorder.port),
        &prefix,
    )
    .await;
    app.create_order("G-CMD", 100).await;
    let n = TestNotification::paid("G-CMD", "T-CMD", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    gate_calls_reach(&app, 2).await;
    let key = format!("{prefix}{{G-CMD}}:pay:wechat");
    let deadline = Instant::now() + Duration::from_secs(10);
    while recorder.on_keys(&prefix).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        recorder.on_keys(&prefix),
        [
            ("SET".to_owned(), key.clone()),
            ("SET".to_owned(), key.clone())
        ],
        "a first delivery"
    );
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(cached(&app), 1);
    assert_eq!(
        recorder.on_keys(&prefix).len(),
        3,
        "a repeat from Redis: {:?}",
        recorder.on_keys(&prefix)
    );
    flush(&prefix).await;
}

/// The same notification delivered to two instances sharing Redis at once: one applies it,
/// the twins on both instances find its marker and wait for its answer (or, if it is too
/// slow, are told to retry); few of them, if any, reach the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twins_on_two_instances_one_applies_the_others_get_its_answer() {
    let prefix = prefix();
    let first = Arc::new(app_with_redis_only(Backend::Postgres, REDIS, &prefix).await);
    let p = prefix.clone();
    let second = Arc::new(
        first
            .spawn_beside(move |s| {
                s.redis.url = paynotify::config::Secret::new(REDIS.to_owned());
                s.redis.key_prefix = p;
                s.redis.timeout_ms = 1000;
                s.redis.marker_ttl_ms = 2000;
                s.redis.recent_answers = 0;
            })
            .await,
    );
    first.create_order("G-TWIN", 100).await;
    let n = TestNotification::paid("G-TWIN", "T-TWIN", 100);
    let apps = [first.clone(), second.clone()];
    let statuses = released_together(40, |i| {
        let (app, n) = (apps[i % 2].clone(), n.clone());
        async move { deliver(&app, &n).await.0 }
    })
    .await;
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::NO_CONTENT || *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_eq!(first.messages("ORDER_PAID").await, 1);
    assert_eq!(first.db.count("pay_callback").await, 1);
    let applied =
        |app: &TestApp| metric(app, "paynotify_notifications_total", &["wechat", "applied"]);
    assert_eq!(applied(&first) + applied(&second), 1);
    let busy = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count() as u64;
    let from_cache = cached(&first) + cached(&second);
    let ledger = from_ledger(&first) + from_ledger(&second);
    assert_eq!(from_cache + ledger + busy, 39, "{statuses:?}");
    assert!(
        from_cache >= 20,
        "most twins answered from the cache: {from_cache} of 39 ({ledger} from the ledger)"
    );
    // The instance that did not apply it answered twins from the other's answer.
    let other = if applied(&first) == 1 {
        &second
    } else {
        &first
    };
    assert!(cached(other) >= 1, "{statuses:?}");
    flush(&prefix).await;
}

/// A request on another instance holds the key (its marker): a twin waits and takes the
/// holder's answer when it comes; a conflicting notice for the same order that waits the same
/// way is never answered with it, but by the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_waits_for_the_holders_answer_and_a_conflict_never_takes_it() {
    let prefix = prefix();
    let app = Arc::new(app_with_redis_only(Backend::Sqlite, REDIS, &prefix).await);
    app.create_order("G-HOLD", 100).await;
    let n = TestNotification::paid("G-HOLD", "T-HOLD", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    let key = format!("{prefix}{{G-HOLD}}:pay:wechat");
    let mut c = redis().await;
    let get = |mut c: redis::aio::MultiplexedConnection, key: String| async move {
        redis::cmd("GET")
            .arg(&key)
            .query_async::<Option<String>>(&mut c)
            .await
            .expect("get")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match get(c.clone(), key.clone()).await {
            Some(v) if v != MARKER => break v,
            _ => assert!(Instant::now() < deadline, "the answer was never cached"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let hold = |mut c: redis::aio::MultiplexedConnection, key: String| async move {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(MARKER)
            .arg("PX")
            .arg(5000)
            .query_async(&mut c)
            .await
            .expect("set");
    };
    let finish = |c: redis::aio::MultiplexedConnection, key: String, answer: String| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut c = c;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&answer)
            .arg("EX")
            .arg(60)
            .query_async(&mut c)
            .await
            .expect("set");
    };
    let waited = |app: &TestApp| {
        metric(app, "paynotify_gate_total", &["hit"])
            + metric(app, "paynotify_gate_total", &["hit_after_wait"])
    };
    let before = waited(&app);

    hold(c.clone(), key.clone()).await;
    let holder = tokio::spawn(finish(c.clone(), key.clone(), answer.clone()));
    assert_eq!(
        deliver(&app, &n).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    holder.await.expect("holder");
    assert_eq!(
        waited(&app),
        before + 1,
        "answered with the holder's answer"
    );
    assert_eq!(from_ledger(&app), 0);

    // The same order, other content, while the holder applies: the ledger's 409.
    hold(c.clone(), key.clone()).await;
    let holder = tokio::spawn(finish(c.clone(), key.clone(), answer.clone()));
    let conflict = TestNotification::paid("G-HOLD", "T-HOLD", 99);
    assert_eq!(deliver(&app, &conflict).await.0, StatusCode::CONFLICT);
    holder.await.expect("holder");
    assert_eq!(waited(&app), before + 1);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // And the holder's answer is still there for the real repeats.
    assert_eq!(get(c.clone(), key.clone()).await, Some(answer));
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("del");
    flush(&prefix).await;
}

/// Waits (10 s at most) until the gate has made `calls` calls.
async fn gate_calls_reach(app: &TestApp, calls: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.metrics.gate_calls.get() < calls && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
