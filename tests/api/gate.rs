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

pub(crate) const REDIS: &str = "redis://127.0.0.1:6379";
/// What a notice's key holds while a request applies it (its final answer after).
pub(crate) const MARKER: &str = "applying";
static PREFIX: AtomicU32 = AtomicU32::new(0);

pub(crate) fn prefix() -> String {
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
pub(crate) async fn app_with_redis(backend: Backend, url: &str, prefix: &str) -> TestApp {
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
pub(crate) async fn app_with_redis_only(backend: Backend, url: &str, prefix: &str) -> TestApp {
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

pub(crate) async fn redis() -> redis::aio::MultiplexedConnection {
    crate::support::helpers::redis_connection(REDIS)
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

pub(crate) fn cached(app: &TestApp) -> u64 {
    metric(
        app,
        "paynotify_notifications_total",
        &["wechat", "duplicate_cached"],
    )
}

/// Duplicates the ledger answered (the gate did not).
pub(crate) fn from_ledger(app: &TestApp) -> u64 {
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

/// Waits (10 s at most) until the gate has made `calls` calls.
pub(crate) async fn gate_calls_reach(app: &TestApp, calls: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.metrics.gate_calls.get() < calls && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
