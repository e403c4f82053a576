//! The outbox relay and the scheduled jobs, with the clock and the sink in the test's hands,
//! plus the real Redis stream and HTTP webhook sinks.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paynotify::config::Secret;
use paynotify::jobs::purge;
use paynotify::notice::{AnomalyReason, Outcome};
use paynotify::relay::sink::{Event, Published, Sink, SinkError};
use paynotify::relay::sinks::{HttpSink, RedisStreamSink};
use paynotify::relay::{LEASE_SECS, Relay};
use paynotify::text::hex;
use paynotify::time::{Clock, Timestamp};
use tokio::sync::Notify;

use crate::support::helpers::{Backend, TestApp, spawn_app, spawn_app_with};
use crate::support::test_channel::TestNotification;

/// Records what it is given; fails the first `fail_first` deliveries; may block.
#[derive(Default)]
struct TestSink {
    delivered: Mutex<Vec<Event>>,
    fail_first: AtomicUsize,
    gate: Option<Arc<Notify>>,
}

impl TestSink {
    fn failing(n: usize) -> Self {
        Self {
            fail_first: AtomicUsize::new(n),
            ..Self::default()
        }
    }
    fn ids(&self) -> Vec<i64> {
        self.delivered
            .lock()
            .expect("lock")
            .iter()
            .map(|e| e.id)
            .collect()
    }
}

impl Sink for TestSink {
    fn name(&self) -> &'static str {
        "test"
    }
    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            if let Some(gate) = &self.gate {
                gate.notified().await;
            }
            events
                .iter()
                .map(|e| {
                    let failing = self
                        .fail_first
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if failing {
                        return Err(SinkError::Refused("sink down".to_owned()));
                    }
                    self.delivered.lock().expect("lock").push(e.clone());
                    Ok(())
                })
                .collect()
        })
    }
}

pub(crate) fn relay(app: &TestApp, sink: Arc<dyn Sink>, max_attempts: u32) -> Relay {
    Relay::new(
        app.store.clone(),
        sink,
        app.clock.clone(),
        app.metrics.clone(),
        100,
        max_attempts,
    )
}

/// One tick of a fresh relay on `sink`.
async fn tick_once(
    app: &TestApp,
    sink: Arc<dyn Sink>,
    max_attempts: u32,
) -> paynotify::relay::TickReport {
    relay(app, sink, max_attempts).tick().await.expect("tick")
}

fn sql_time(t: Timestamp) -> String {
    t.as_datetime().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// `n` pending messages due now, written straight into the outbox.
async fn pending(app: &TestApp, n: usize) {
    pending_tagged(app, "k", n).await;
}

/// `n` pending messages due now, their `biz_key`s `{tag}0`, `{tag}1`, …
pub(crate) async fn pending_tagged(app: &TestApp, tag: &str, n: usize) {
    let now = sql_time(app.clock.now());
    let rows: Vec<String> = (0..n)
        .map(|i| format!("('TEST', '{tag}{i}', '{{\"n\":{i}}}', 0, 0, '{now}', '{now}')"))
        .collect();
    app.db
        .execute(&format!(
            "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) VALUES {}",
            rows.join(", ")
        ))
        .await;
}

/// The due messages `owner` claims now, under a lease of `LEASE_SECS`.
async fn claim(app: &TestApp, owner: &str) -> Vec<paynotify::store::relay::Claimed> {
    let now = app.clock.now();
    app.store
        .claim_messages(owner, now, now.plus_seconds(LEASE_SECS), 100)
        .await
        .expect("claim")
}

/// A one-worker HTTP server on a local port, serving what `configure` mounts; its port and
/// handle.
fn hook_server(
    configure: impl Fn(&mut actix_web::web::ServiceConfig) + Send + Clone + 'static,
) -> (u16, actix_web::dev::ServerHandle) {
    let server =
        actix_web::HttpServer::new(move || actix_web::App::new().configure(configure.clone()))
            .workers(1)
            .disable_signals()
            .bind("127.0.0.1:0")
            .expect("bind");
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    (port, handle)
}

async fn message(app: &TestApp, biz_key: &str) -> paynotify::store::outbox::StoredMessage {
    app.store
        .messages(None, 1000)
        .await
        .expect("messages")
        .into_iter()
        .find(|m| m.biz_key == biz_key)
        .expect("message exists")
}

crate::on_every_backend!(
    publishes_each_pending_message_once,
    a_sink_failure_backs_off_with_growing_delays_and_recovers,
    max_attempts_park_a_message_dead_with_the_reason,
    redrive_makes_a_dead_message_pending_and_it_is_delivered,
    a_crash_after_publish_before_mark_republishes_after_the_lease_expires,
    the_job_never_overlaps_itself,
    a_late_mark_by_a_relay_whose_lease_expired_changes_nothing,
    shutdown_gives_back_the_leases_it_holds,
    rows_published_but_not_marked_are_marked_by_the_next_tick_not_published_again,
    the_next_batch_is_claimed_during_a_publish_and_published_after_it,
    a_batch_claimed_ahead_is_given_back_when_a_delivery_fails,
    a_batch_claimed_ahead_is_given_back_at_shutdown,
    expiry_closes_only_unpaid_orders_past_their_deadline,
    retention_keeps_callbacks_anomalies_pending_dead_and_recent_rows,
);

async fn publishes_each_pending_message_once(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 250).await;
    let sink = Arc::new(TestSink::default());
    let report = tick_once(&app, sink.clone(), 16).await;
    assert_eq!(
        report.published, 250,
        "a backlog drains in one tick, batch after batch"
    );
    let ids: BTreeSet<i64> = sink.ids().into_iter().collect();
    assert_eq!(ids.len(), 250);
    assert_eq!(
        app.db
            .count("local_message WHERE status = 1 AND sent_at IS NOT NULL AND locked_by IS NULL")
            .await,
        250
    );
    // Nothing is due any more: the next tick publishes nothing.
    assert_eq!(tick_once(&app, sink.clone(), 16).await.published, 0);
    assert_eq!(sink.ids().len(), 250);
    let e = &sink.delivered.lock().expect("lock")[0];
    assert_eq!(
        (e.topic.as_str(), e.payload["n"].as_i64()),
        ("TEST", Some(0))
    );
    assert!(e.created_at.starts_with("2026-11-30T08:00:00"));
}

async fn a_sink_failure_backs_off_with_growing_delays_and_recovers(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 1).await;
    let sink = Arc::new(TestSink::failing(4));
    let relay = relay(&app, sink.clone(), 16);
    let mut delays = Vec::new();
    for attempt in 1..=4 {
        let before = app.clock.now();
        let report = relay.tick().await.expect("tick");
        assert_eq!(report.failed, 1, "attempt {attempt}");
        let m = message(&app, "k0").await;
        assert_eq!((m.status, m.attempts), (0, attempt));
        assert_eq!(m.last_error.as_deref(), Some("sink down"));
        let delay = (m.next_attempt_at.as_datetime() - before.as_datetime()).as_seconds_f64();
        delays.push(delay);
        // Not due yet: nothing happens a moment before the retry time.
        assert_eq!(relay.tick().await.expect("tick").failed, 0);
        app.clock.set(m.next_attempt_at.as_datetime());
    }
    // 2^attempts seconds, ±25 %: 1, 2, 4, 8.
    for (i, delay) in delays.iter().enumerate() {
        let base = f64::from(1u32 << i);
        assert!(
            (base * 0.74..=base * 1.26).contains(delay),
            "delay {i}: {delay} s ({delays:?})"
        );
    }
    assert_eq!(relay.tick().await.expect("tick").published, 1, "recovered");
    assert_eq!(message(&app, "k0").await.status, 1);
}

async fn max_attempts_park_a_message_dead_with_the_reason(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 1).await;
    let relay = relay(&app, Arc::new(TestSink::failing(usize::MAX)), 3);
    for _ in 0..3 {
        relay.tick().await.expect("tick");
        app.clock.advance(3600);
    }
    let m = message(&app, "k0").await;
    assert_eq!((m.status, m.attempts), (2, 3));
    assert_eq!(m.last_error.as_deref(), Some("sink down"));
    app.clock.advance(3600);
    assert_eq!(
        relay.tick().await.expect("tick").failed,
        0,
        "dead messages are not retried"
    );
    relay.refresh_gauges().await.expect("gauges");
    assert_eq!(app.metrics.relay_dead.get(), 1);
}

async fn redrive_makes_a_dead_message_pending_and_it_is_delivered(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 1).await;
    tick_once(&app, Arc::new(TestSink::failing(1)), 1).await;
    let dead = message(&app, "k0").await;
    assert_eq!(dead.status, 2);
    let admin = |path: String| {
        app.client
            .post(app.url(&path))
            .bearer_auth(&app.api_token)
            .send()
    };
    let listed: serde_json::Value = app
        .client
        .get(app.url("/admin/messages?status=dead"))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    assert_eq!(
        admin(format!("/admin/messages/{}/redrive", dead.id))
            .await
            .expect("redrive")
            .status(),
        200
    );
    let again = message(&app, "k0").await;
    assert_eq!((again.status, again.attempts), (0, 0));
    assert_eq!(
        admin(format!("/admin/messages/{}/redrive", dead.id))
            .await
            .expect("redrive")
            .status(),
        409
    );
    assert_eq!(
        admin("/admin/messages/999999/redrive".into())
            .await
            .expect("redrive")
            .status(),
        404
    );
    let sink = Arc::new(TestSink::default());
    assert_eq!(tick_once(&app, sink.clone(), 1).await.published, 1);
    assert_eq!(sink.ids(), [dead.id]);
}

async fn a_crash_after_publish_before_mark_republishes_after_the_lease_expires(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 3).await;
    // A relay that claimed and published, then died before marking.
    let claimed = claim(&app, "crashed-instance").await;
    assert_eq!(claimed.len(), 3);
    let sink = Arc::new(TestSink::default());
    let relay = relay(&app, sink.clone(), 16);
    assert_eq!(
        relay.tick().await.expect("tick").published,
        0,
        "the lease is live"
    );
    app.clock.advance(LEASE_SECS + 1);
    assert_eq!(
        relay.tick().await.expect("tick").published,
        3,
        "at least once, never zero"
    );
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 3);
}

async fn a_late_mark_by_a_relay_whose_lease_expired_changes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 2).await;
    let slow = claim(&app, "slow").await;
    let ids: Vec<i64> = slow.iter().map(|c| c.id).collect();
    let since = slow.iter().map(|c| c.created_at).min().expect("claimed");
    app.clock.advance(LEASE_SECS + 1);
    let later = app.clock.now();
    let next = claim(&app, "next").await;
    assert_eq!(next.len(), 2, "the expired lease made the rows claimable");
    // The slow relay finishes its publish and marks: the rows are no longer its own.
    assert_eq!(
        app.store
            .mark_sent("slow", &ids, since, later)
            .await
            .expect("mark"),
        0
    );
    app.store
        .mark_failed("slow", ids[0], "late failure", 16, later)
        .await
        .expect("mark failed");
    assert_eq!(
        app.db
            .count("local_message WHERE status = 0 AND attempts = 0 AND locked_by = 'next'")
            .await,
        2
    );
    assert_eq!(
        app.store
            .mark_sent("next", &ids, since, later)
            .await
            .expect("mark"),
        2
    );
}

/// A relay whose sink blocks until `gate` is notified, with a tick already inside the sink
/// holding the leases of all `n` pending messages.
struct BlockedTick {
    relay: Arc<Relay>,
    sink: Arc<TestSink>,
    gate: Arc<Notify>,
    tick:
        tokio::task::JoinHandle<Result<paynotify::relay::TickReport, paynotify::store::StoreError>>,
}

async fn blocked_tick(app: &TestApp, n: i64) -> BlockedTick {
    let gate = Arc::new(Notify::new());
    let sink = Arc::new(TestSink {
        gate: Some(gate.clone()),
        ..TestSink::default()
    });
    let relay = Arc::new(relay(app, sink.clone(), 16));
    let tick = tokio::spawn({
        let relay = relay.clone();
        async move { relay.tick().await }
    });
    for _ in 0..200 {
        if app
            .db
            .count("local_message WHERE locked_by IS NOT NULL")
            .await
            == n
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.db
            .count("local_message WHERE locked_by IS NOT NULL")
            .await,
        n,
        "the tick is inside the sink"
    );
    BlockedTick {
        relay,
        sink,
        gate,
        tick,
    }
}

async fn shutdown_gives_back_the_leases_it_holds(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 2).await;
    let blocked = blocked_tick(&app, 2).await;
    // The sink hangs past the drain timeout: the leases are released for other instances.
    blocked.relay.shutdown(Duration::from_millis(200)).await;
    assert_eq!(
        app.db
            .count("local_message WHERE locked_by IS NULL AND status = 0")
            .await,
        2
    );
    blocked.gate.notify_one();
    let _ = blocked.tick.await;
    // Its late mark changed nothing: both are still pending for the next relay.
    assert_eq!(app.db.count("local_message WHERE status = 0").await, 2);
    assert_eq!(
        blocked.sink.ids().len(),
        2,
        "published once already: at least once"
    );
}

/// Makes marking a message sent fail (the statement is refused), as a database that went away
/// between a batch's publish and its mark does.
async fn refuse_marking_sent(db: &crate::support::helpers::TestDb) {
    use crate::support::helpers::TestDb;
    db.execute(match db {
        TestDb::Postgres { .. } => {
            "CREATE OR REPLACE FUNCTION refuse_sent() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
             CREATE TRIGGER refuse_sent AFTER UPDATE ON local_message FOR EACH ROW \
             WHEN (NEW.status = 1) EXECUTE FUNCTION refuse_sent();"
        }
        TestDb::Mysql { .. } => {
            "CREATE TRIGGER refuse_sent BEFORE UPDATE ON local_message FOR EACH ROW \
             BEGIN IF NEW.status = 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; \
             END IF; END"
        }
        TestDb::Sqlite { .. } => {
            "CREATE TRIGGER refuse_sent BEFORE UPDATE ON local_message WHEN NEW.status = 1 \
             BEGIN SELECT RAISE(ABORT, 'refused'); END;"
        }
    })
    .await;
}

/// The database fails under a tick after its batch went out and before it was marked (a
/// failover): the next tick marks those rows sent at once, without publishing them again and
/// without leaving them leased for the rest of [`paynotify::relay::LEASE_SECS`].
async fn rows_published_but_not_marked_are_marked_by_the_next_tick_not_published_again(
    backend: Backend,
) {
    use crate::support::helpers::TestDb;
    let app = spawn_app(backend).await;
    pending(&app, 2).await;
    let blocked = blocked_tick(&app, 2).await;
    refuse_marking_sent(&app.db).await;
    blocked.gate.notify_one();
    let first = blocked.tick.await.expect("the tick ran");
    assert!(first.is_err(), "the mark was refused: {first:?}");
    assert_eq!(app.db.count("local_message WHERE status = 0").await, 2);
    app.db
        .execute(match &*app.db {
            TestDb::Postgres { .. } => "DROP TRIGGER refuse_sent ON local_message",
            _ => "DROP TRIGGER refuse_sent",
        })
        .await;
    // A publish in the next tick would find the sink open (and be counted below).
    blocked.gate.notify_one();
    let next = blocked.relay.tick().await.expect("the next tick");
    assert_eq!(next.published, 2, "marked by the next tick");
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 2);
    assert_eq!(
        blocked.sink.ids().len(),
        2,
        "published once: the next tick only marked them"
    );
}

/// A relay of batches of 2 whose sink blocks until notified, with a tick started on it.
fn gated_tick_of_twos(app: &TestApp) -> BlockedTick {
    let gate = Arc::new(Notify::new());
    let sink = Arc::new(TestSink {
        gate: Some(gate.clone()),
        ..TestSink::default()
    });
    let relay = Arc::new(Relay::new(
        app.store.clone(),
        sink.clone(),
        app.clock.clone(),
        app.metrics.clone(),
        2,
        16,
    ));
    let tick = tokio::spawn({
        let relay = relay.clone();
        async move { relay.tick().await }
    });
    BlockedTick {
        relay,
        sink,
        gate,
        tick,
    }
}

/// Waits until exactly `n` rows are leased.
async fn leased(app: &TestApp, n: i64) {
    let mut now = 0;
    for _ in 0..300 {
        now = app
            .db
            .count("local_message WHERE locked_by IS NOT NULL")
            .await;
        if now == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{now} rows leased, want {n}");
}

async fn the_next_batch_is_claimed_during_a_publish_and_published_after_it(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 6).await;
    let blocked = gated_tick_of_twos(&app);
    // The first batch is inside the sink and the second is already claimed …
    leased(&app, 4).await;
    // … but not published: nothing goes out before the batch ahead of it is confirmed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(blocked.sink.ids().is_empty());
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 0);
    let release = tokio::spawn({
        let gate = blocked.gate.clone();
        async move {
            for _ in 0..500 {
                gate.notify_one();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let report = blocked.tick.await.expect("task").expect("tick");
    release.abort();
    assert_eq!((report.published, report.failed), (6, 0));
    let ids = blocked.sink.ids();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids, sorted, "published once each, in the order claimed");
    assert_eq!(ids.len(), 6);
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 6);
}

async fn a_batch_claimed_ahead_is_given_back_when_a_delivery_fails(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 6).await;
    let sink = Arc::new(TestSink::failing(1));
    let relay = Relay::new(
        app.store.clone(),
        sink.clone(),
        app.clock.clone(),
        app.metrics.clone(),
        2,
        16,
    );
    let report = relay.tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (1, 1));
    // The failing sink is not asked again in this tick; the batch claimed ahead is not
    // published, keeps its attempts, and is claimable at once.
    assert_eq!(sink.ids().len(), 1);
    assert_eq!(
        app.db
            .count("local_message WHERE status = 0 AND attempts = 0 AND locked_by IS NULL")
            .await,
        4
    );
    // The next tick delivers them (the failed one backs off).
    let report = relay.tick().await.expect("tick");
    assert_eq!((report.published, report.failed), (4, 0));
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 5);
}

async fn a_batch_claimed_ahead_is_given_back_at_shutdown(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 6).await;
    let blocked = gated_tick_of_twos(&app);
    leased(&app, 4).await;
    let shutdown = tokio::spawn({
        let relay = blocked.relay.clone();
        async move { relay.shutdown(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    blocked.gate.notify_one();
    let report = blocked.tick.await.expect("task").expect("tick");
    shutdown.await.expect("shutdown");
    // The batch in flight finished; the one claimed ahead went back unpublished.
    assert_eq!((report.published, report.failed), (2, 0));
    assert_eq!(blocked.sink.ids().len(), 2);
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 2);
    assert_eq!(
        app.db
            .count("local_message WHERE status = 0 AND attempts = 0 AND locked_by IS NULL")
            .await,
        4
    );
}

async fn the_job_never_overlaps_itself(backend: Backend) {
    let app = spawn_app(backend).await;
    pending(&app, 1).await;
    let blocked = blocked_tick(&app, 1).await;
    let second = blocked.relay.tick().await.expect("tick");
    assert!(second.skipped, "{second:?}");
    blocked.gate.notify_one();
    let first = blocked.tick.await.expect("task").expect("tick");
    assert_eq!((first.published, first.skipped), (1, false));
    assert_eq!(blocked.sink.ids().len(), 1);
}

async fn expiry_closes_only_unpaid_orders_past_their_deadline(backend: Backend) {
    let app = spawn_app(backend).await;
    let create = |no: &'static str, secs: u64| {
        let app = &app;
        async move {
            let r = app
                .client
                .post(app.url("/orders"))
                .bearer_auth(&app.api_token)
                .json(&serde_json::json!({ "order_no": no, "amount_fen": 100, "expire_after_secs": secs }))
                .send()
                .await
                .expect("create");
            assert_eq!(r.status(), 201);
        }
    };
    create("E-DUE", 60).await;
    create("E-PAID", 60).await;
    create("E-LATER", 3600).await;
    let paid = TestNotification::paid("E-PAID", "T-E", 100).to_notice();
    assert_eq!(app.apply(&paid).await, Outcome::Applied);
    app.clock.advance(59);
    assert_eq!(app.expire_now().await, 0);
    app.clock.advance(2);
    assert_eq!(app.expire_now().await, 1);
    assert_eq!(app.status_of("E-DUE").await, "CLOSED");
    assert_eq!(app.status_of("E-PAID").await, "PAID");
    assert_eq!(app.status_of("E-LATER").await, "WAIT_PAY");
    assert_eq!(app.messages("ORDER_CLOSED").await, 1);
    // The payment that arrives after the close is money to act on, not a paid order.
    let late = TestNotification::paid("E-DUE", "T-LATE", 100).to_notice();
    assert_eq!(
        app.apply(&late).await,
        Outcome::Anomaly(AnomalyReason::PaidAfterClose)
    );
    assert_eq!(app.status_of("E-DUE").await, "CLOSED");
}

async fn retention_keeps_callbacks_anomalies_pending_dead_and_recent_rows(backend: Backend) {
    let app = spawn_app(backend).await;
    // Old rows: a paid order's callback, a sent, a pending and a dead message, a key.
    app.create_and_apply(&TestNotification::paid("RT-OLD", "T-OLD", 100).to_notice())
        .await;
    let mut partial = TestNotification::paid("RT-OLD", "T-OLD", 100);
    partial.kind = "refunded".into();
    partial.refund = Some(("R-OLD".into(), "RID-OLD".into(), 10));
    assert_eq!(app.apply(&partial.to_notice()).await, Outcome::Applied);
    app.create_order("RT-UNPAID", 100).await;
    app.apply(&TestNotification::paid("RT-UNPAID", "T-SHORT", 1).to_notice())
        .await;
    pending(&app, 3).await;
    let r = relay(&app, Arc::new(TestSink::failing(1)), 1);
    r.tick().await.expect("tick");
    // k1: pending, retrying far in the future.
    app.db
        .execute(
            "UPDATE local_message SET status = 0, sent_at = NULL, \
             next_attempt_at = '2099-01-01T00:00:00.000000Z' WHERE biz_key = 'k1'",
        )
        .await;
    app.client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .header("Idempotency-Key", "old-key")
        .json(&serde_json::json!({ "order_no": "RT-KEY", "amount_fen": 1 }))
        .send()
        .await
        .expect("create");
    let before = app.db.count("local_message").await;

    // Eight days later: new rows inside the window.
    app.clock.advance(8 * 86_400);
    app.create_and_apply(&TestNotification::paid("RT-NEW", "T-NEW", 100).to_notice())
        .await;
    tick_once(&app, Arc::new(TestSink::default()), 16).await;

    let done = purge(&app.store, app.clock.as_ref(), 7, 7)
        .await
        .expect("purge");
    if backend == Backend::Sqlite {
        // Four old sent messages (the anomaly's among them), one idempotency key.
        assert_eq!(done.rows, 5, "{done:?}");
    } else {
        // The old day's partition held pending and dead messages besides the sent ones: it
        // stays. PostgreSQL rebuilds it with those alone (the idempotency key goes by
        // statement); MySQL keeps it and its sent rows go by statement too. The migration's
        // partition (empty) goes whole; the new row, written before its day had a partition,
        // moved out of the future partition into its day.
        if backend == Backend::Postgres {
            assert_eq!(done.rows, 1, "{done:?}");
            assert_eq!(
                done.outbox.compacted,
                ["local_message_20261130"],
                "{done:?}"
            );
        } else {
            assert_eq!(done.rows, 5, "{done:?}");
            assert_eq!(done.outbox.kept, ["local_message_20261130"], "{done:?}");
        }
        assert_eq!(
            done.outbox.dropped,
            ["local_message_before_20261129"],
            "{done:?}"
        );
        assert!(
            done.outbox
                .created
                .contains(&"local_message_20261208".to_string()),
            "{done:?}"
        );
        // A partition's rows: its own table on PostgreSQL, PARTITION (…) on MySQL.
        let partition = |name: &str| match backend {
            Backend::Mysql => format!("local_message PARTITION ({name})"),
            _ => name.to_string(),
        };
        assert_eq!(
            app.db.count(&partition("local_message_future")).await,
            0,
            "every row is in its day"
        );
        assert_eq!(app.db.count(&partition("local_message_20261208")).await, 1);
        assert_eq!(
            app.db.count(&partition("local_message_20261130")).await,
            2,
            "the old day keeps its pending and its dead message"
        );
    }
    assert_eq!(
        app.db
            .count("refund_callback WHERE out_refund_no = 'R-OLD'")
            .await,
        1,
        "refund rows live as long as their order"
    );
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no = 'RT-OLD'")
            .await,
        1,
        "payment rows live as long as their order, however old"
    );
    assert_eq!(
        app.db
            .count("local_message WHERE topic = 'PAYMENT_ANOMALY'")
            .await,
        0,
        "a sent anomaly message goes with the other sent messages"
    );
    assert_eq!(
        app.db
            .count("payment_anomaly WHERE order_no = 'RT-UNPAID'")
            .await,
        1,
        "the anomaly stays: it is what makes its repeats duplicates"
    );
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no = 'RT-UNPAID'")
            .await,
        1,
        "order undecided"
    );
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no = 'RT-NEW'")
            .await,
        1,
        "inside the window"
    );
    assert_eq!(
        app.db.count("local_message WHERE status = 2").await,
        1,
        "dead stays"
    );
    assert_eq!(
        app.db.count("local_message WHERE biz_key = 'k1'").await,
        1,
        "pending stays"
    );
    assert!(
        app.db.count("local_message WHERE biz_key = 'RT-NEW'").await == 1,
        "recent sent stays"
    );
    assert_eq!(
        app.db.count("local_message WHERE biz_key = 'k2'").await,
        0,
        "old sent goes"
    );
    assert_eq!(
        app.db.count("local_message").await,
        before - 4 + 1,
        "four old sent gone, one new"
    );
    assert_eq!(app.db.count("idempotency_key").await, 0);
    assert_eq!(app.db.count("orders").await, 4, "orders are never purged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_postgres_deliver_every_message_none_lost() {
    two_relays_deliver_every_message_none_lost(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_mysql_deliver_every_message_none_lost() {
    two_relays_deliver_every_message_none_lost(Backend::Mysql).await;
}

/// Two relays with pools of their own claim side by side (`SKIP LOCKED`); SQLite has one
/// writer and needs no such test.
async fn two_relays_deliver_every_message_none_lost(backend: Backend) {
    let app = spawn_app(backend).await;
    let rows: Vec<String> = (1..=3000)
        .map(|g| {
            format!(
                "('TEST', 'k{g}', '{{}}', 0, 0, '2026-11-30T08:00:00Z', '2026-11-30T08:00:00Z')"
            )
        })
        .collect();
    app.db
        .execute(&format!(
            "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) \
             VALUES {}",
            rows.join(", ")
        ))
        .await;
    let settings = crate::support::helpers::test_settings(app.db.url());
    let second_pool = paynotify::store::Store::connect(&settings.database).expect("second pool");
    let (sink_a, sink_b) = (Arc::new(TestSink::default()), Arc::new(TestSink::default()));
    let relay_a = Relay::new(
        app.store.clone(),
        sink_a.clone(),
        app.clock.clone(),
        app.metrics.clone(),
        50,
        16,
    );
    let relay_b = Relay::new(
        second_pool,
        sink_b.clone(),
        app.clock.clone(),
        app.metrics.clone(),
        50,
        16,
    );
    let (a, b) = tokio::join!(relay_a.tick(), relay_b.tick());
    let (a, b) = (a.expect("tick a"), b.expect("tick b"));
    assert_eq!(a.published + b.published, 3000, "{a:?} {b:?}");
    assert!(
        a.published > 0 && b.published > 0,
        "both relays took part: {a:?} {b:?}"
    );
    let all: BTreeSet<i64> = sink_a.ids().into_iter().chain(sink_b.ids()).collect();
    assert_eq!(all.len(), 3000, "every message delivered");
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_stream_sink_adds_every_event_with_its_fields() {
    let app = spawn_app(Backend::Sqlite).await;
    pending(&app, 5).await;
    let stream = format!(
        "paynotify:test:{}:{}",
        std::process::id(),
        app.clock.now().unix_seconds()
    );
    let sink = RedisStreamSink::connect("redis://127.0.0.1:6379", &stream, Duration::from_secs(2))
        .await
        .expect("Redis must run on 127.0.0.1:6379 (bash tests/run.sh starts it)");
    assert_eq!(tick_once(&app, Arc::new(sink), 16).await.published, 5);
    let entries = crate::support::helpers::stream_entries("redis://127.0.0.1:6379", &stream).await;
    let mut conn = crate::support::helpers::redis_connection("redis://127.0.0.1:6379")
        .await
        .expect("conn");
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .expect("del");
    assert_eq!(entries.len(), 5);
    let fields: Vec<&str> = entries[0].1.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(fields, ["id", "topic", "biz_key", "payload", "created_at"]);
    let keys: Vec<&str> = entries.iter().map(|(_, f)| f[2].1.as_str()).collect();
    assert_eq!(keys, ["k0", "k1", "k2", "k3", "k4"]);
    assert_eq!(entries[3].1[3].1, r#"{"n":3}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_sink_signs_each_event_and_retries_until_accepted() {
    use actix_web::{HttpRequest, HttpResponse, web};

    struct Receiver {
        refuse_first: AtomicUsize,
        accepted: Mutex<Vec<(String, serde_json::Value)>>,
    }
    async fn receive(
        req: HttpRequest,
        body: web::Bytes,
        state: web::Data<Receiver>,
    ) -> HttpResponse {
        let header = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let signature = header("Paynotify-Signature");
        let (t, v1) = signature
            .split_once(",v1=")
            .map(|(t, v)| (t.trim_start_matches("t=").to_owned(), v.to_owned()))
            .unwrap_or_default();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"webhook-secret");
        let mut signed = format!("{t}.").into_bytes();
        signed.extend_from_slice(&body);
        if hex(ring::hmac::sign(&key, &signed).as_ref()) != v1 {
            return HttpResponse::Unauthorized().finish();
        }
        if state
            .refuse_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return HttpResponse::ServiceUnavailable().finish();
        }
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        state
            .accepted
            .lock()
            .expect("lock")
            .push((header("Idempotency-Key"), event));
        HttpResponse::NoContent().finish()
    }

    let receiver = web::Data::new(Receiver {
        refuse_first: AtomicUsize::new(2),
        accepted: Mutex::new(Vec::new()),
    });
    let data = receiver.clone();
    let (port, handle) = hook_server(move |cfg| {
        cfg.app_data(data.clone())
            .route("/hook", web::post().to(receive));
    });

    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    pending(&app, 1).await;
    let sink = HttpSink::new(
        &format!("http://127.0.0.1:{port}/hook"),
        &Secret::new("webhook-secret"),
        &paynotify::providers::client_settings(&paynotify::config::Settings::default()),
    )
    .expect("sink");
    let relay = relay(&app, Arc::new(sink), 16);
    let mut published = 0;
    for _ in 0..5 {
        published += relay.tick().await.expect("tick").published;
        app.clock.advance(3600);
    }
    handle.stop(false).await;
    assert_eq!(published, 1);
    let accepted = receiver.accepted.lock().expect("lock").clone();
    assert_eq!(accepted.len(), 1, "refused twice, then accepted once");
    assert_eq!(accepted[0].0, "TEST:k0");
    assert_eq!(accepted[0].1["biz_key"], "k0");
    assert_eq!(accepted[0].1["payload"]["n"], 0);
    assert_eq!(message(&app, "k0").await.attempts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_sink_delivers_over_https_trusting_the_configured_ca() {
    use actix_web::{HttpResponse, web};

    let received = web::Data::new(AtomicUsize::new(0));
    let data = received.clone();
    let (port, handle) = hook_server(move |cfg| {
        cfg.app_data(data.clone()).route(
            "/hook",
            web::post().to(|n: web::Data<AtomicUsize>| async move {
                n.fetch_add(1, Ordering::SeqCst);
                HttpResponse::NoContent().finish()
            }),
        );
    });
    let front = crate::support::provider::TlsFront::start(port).await;
    let url = format!("https://127.0.0.1:{}/hook", front.port);

    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    pending(&app, 1).await;
    let mut settings = paynotify::config::Settings::default();
    // Without the test CA the handshake fails: nothing is delivered, the row stays pending.
    let untrusting = HttpSink::new(
        &url,
        &Secret::new("webhook-secret"),
        &paynotify::providers::client_settings(&settings),
    )
    .expect("sink");
    let published = tick_once(&app, Arc::new(untrusting), 16).await.published;
    assert_eq!(published, 0);
    assert_eq!(received.load(Ordering::SeqCst), 0);

    settings.provider_api.ca_file = Some(front.ca_file.clone());
    let sink = HttpSink::new(
        &url,
        &Secret::new("webhook-secret"),
        &paynotify::providers::client_settings(&settings),
    )
    .expect("sink");
    app.clock.advance(3600);
    let published = tick_once(&app, Arc::new(sink), 16).await.published;
    handle.stop(false).await;
    assert_eq!(published, 1);
    assert_eq!(received.load(Ordering::SeqCst), 1);
}
