//! The Redis Streams adapter against the machine's Redis (127.0.0.1:6379), every stream the
//! test's own (pid + counter, deleted at the end), published through paynotify's own sink,
//! and exactly-once checked in SQL.

mod support;

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify::relay::sink::{Event as SinkEvent, Sink};
use paynotify::relay::sinks::RedisStreamSink;
use paynotify_consumer::redis_streams::{StreamConsumer, StreamError, StreamSettings};
use paynotify_consumer::{Event, Failure, apply_once, inbox, topics};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamPendingCountReply, StreamRangeReply};
use support::{PgDb, Sqlite, SqliteDb, unique};
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinHandle;

const REDIS: &str = "redis://127.0.0.1:6379";
const DEADLINE: Duration = Duration::from_secs(60);
const INITIAL: i64 = 100_000;
/// The inbox's consumer name (the example's too).
const INBOX: &str = "inventory";

// ---------------------------------------------------------------------------------------
// Redis

/// A stream and its parked stream of the test's own, deleted on drop.
struct Streams {
    stream: String,
    parked: String,
    group: String,
}

impl Streams {
    fn new() -> Self {
        let stream = unique("pnc_stream");
        Self {
            parked: format!("{stream}:parked"),
            stream,
            group: "inventory".to_owned(),
        }
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        if let Ok(mut c) = redis::Client::open(REDIS).and_then(|c| c.get_connection()) {
            let _: redis::RedisResult<()> = redis::cmd("DEL")
                .arg(&self.stream)
                .arg(&self.parked)
                .query(&mut c);
        }
    }
}

async fn redis() -> MultiplexedConnection {
    redis::Client::open(REDIS)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
}

/// `n` events: ORDER_PAID for each, and an ORDER_REFUNDED for every fourth.
fn events(prefix: &str, n: usize) -> Vec<SinkEvent> {
    (0..n)
        .map(|i| {
            let (topic, biz_key) = if i % 4 == 3 {
                (topics::ORDER_REFUNDED, format!("{prefix}-O{i}:R1"))
            } else {
                (topics::ORDER_PAID, format!("{prefix}-O{i}"))
            };
            SinkEvent {
                id: i as i64 + 1,
                topic: topic.to_owned(),
                biz_key,
                payload: serde_json::json!({ "order_no": format!("{prefix}-O{i}"), "amount_fen": 100 }),
                created_at: "2025-01-01T00:00:00Z".to_owned(),
            }
        })
        .collect()
}

fn message_id(e: &SinkEvent) -> String {
    format!("{}:{}", e.topic, e.biz_key)
}

/// `on_hand` after every event applied once.
fn expected_stock(events: &[SinkEvent]) -> i64 {
    let ids: HashMap<String, &str> = events
        .iter()
        .map(|e| (message_id(e), e.topic.as_str()))
        .collect();
    ids.values()
        .map(|t| match *t {
            topics::ORDER_PAID => -1,
            topics::ORDER_REFUNDED => 1,
            _ => 0,
        })
        .sum::<i64>()
        + INITIAL
}

/// Through paynotify's real sink.
async fn publish(stream: &str, events: &[SinkEvent]) {
    let sink = RedisStreamSink::connect(REDIS, stream, Duration::from_secs(10))
        .await
        .expect("sink connects");
    for chunk in events.chunks(100) {
        for outcome in sink.publish(chunk).await {
            outcome.expect("published");
        }
    }
}

/// The group's pending count.
async fn pending(c: &mut MultiplexedConnection, s: &Streams) -> u64 {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(&s.stream)
        .arg(&s.group)
        .query_async(c)
        .await
        .expect("XPENDING");
    match v {
        redis::Value::Array(items) => match items.as_slice() {
            [redis::Value::Int(n), ..] => *n as u64,
            other => panic!("XPENDING summary: {other:?}"),
        },
        other => panic!("XPENDING summary: {other:?}"),
    }
}

/// The entries pending on `consumer`.
async fn pending_of(c: &mut MultiplexedConnection, s: &Streams, consumer: &str) -> Vec<String> {
    let reply: StreamPendingCountReply = c
        .xpending_consumer_count(&s.stream, &s.group, "-", "+", 100_000, consumer)
        .await
        .expect("XPENDING of a consumer");
    reply.ids.into_iter().map(|p| p.id).collect()
}

/// Every entry of the stream delivered to the group and none pending.
async fn drained(c: &mut MultiplexedConnection, s: &Streams) -> bool {
    let last: StreamRangeReply = c
        .xrevrange_count(&s.stream, "+", "-", 1)
        .await
        .expect("XREVRANGE");
    let [last, ..] = last.ids.as_slice() else {
        return false;
    };
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&s.stream)
        .query_async(c)
        .await
        .expect("XINFO GROUPS");
    let redis::Value::Array(groups) = groups else {
        return false;
    };
    for g in groups {
        let fields: HashMap<String, redis::Value> = match redis::from_redis_value(g) {
            Ok(f) => f,
            Err(_) => continue,
        };
        let name: Option<String> = fields
            .get("name")
            .and_then(|v| redis::from_redis_value_ref(v).ok());
        if name.as_deref() != Some(s.group.as_str()) {
            continue;
        }
        let delivered: Option<String> = fields
            .get("last-delivered-id")
            .and_then(|v| redis::from_redis_value_ref(v).ok());
        let pending: Option<u64> = fields
            .get("pending")
            .and_then(|v| redis::from_redis_value_ref(v).ok());
        return delivered.as_deref() == Some(last.id.as_str()) && pending == Some(0);
    }
    false
}

/// The message ids of the given entries.
async fn message_ids_of(c: &mut MultiplexedConnection, s: &Streams, ids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        let range: StreamRangeReply = c.xrange(&s.stream, id, id).await.expect("XRANGE");
        for e in range.ids {
            if let (Some(t), Some(b)) = (e.get::<String>("topic"), e.get::<String>("biz_key")) {
                out.push(format!("{t}:{b}"));
            }
        }
    }
    out
}

async fn parked(c: &mut MultiplexedConnection, s: &Streams) -> StreamRangeReply {
    c.xrange_all(&s.parked).await.expect("XRANGE parked")
}

/// Waits for the condition to hold, at most [`DEADLINE`].
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let start = Instant::now();
        loop {
            if $cond {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{}: not within {DEADLINE:?}",
                $what
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }};
}

// ---------------------------------------------------------------------------------------
// PostgreSQL: the effect table (no unique key), the stock, the inbox

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct OnHand {
    #[diesel(sql_type = BigInt)]
    on_hand: i64,
}

#[derive(diesel::QueryableByName)]
struct Total {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn pg_setup(db: &PgDb) {
    let mut c = db.connect().await;
    inbox::create_table(&mut c).await.expect("inbox table");
    c.batch_execute(&format!(
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, on_hand BIGINT NOT NULL); \
         INSERT INTO stock VALUES ('SKU', {INITIAL}); \
         CREATE TABLE effect (message_id TEXT NOT NULL, delta BIGINT NOT NULL);"
    ))
    .await
    .expect("tables");
}

/// The effect of one event, once, on PostgreSQL.
async fn pg_apply(c: &Mutex<AsyncPgConnection>, event: Event) -> Result<(), Failure> {
    let delta: i64 = match event.topic.as_str() {
        topics::ORDER_PAID => -1,
        topics::ORDER_REFUNDED => 1,
        _ => 0,
    };
    let mid = event.message_id();
    let mut c = c.lock().await;
    apply_once(&mut *c, INBOX, &mid, async |tx| {
        diesel::sql_query("UPDATE stock SET on_hand = on_hand + $1 WHERE sku = 'SKU'")
            .bind::<BigInt, _>(delta)
            .execute(tx)
            .await?;
        diesel::sql_query("INSERT INTO effect (message_id, delta) VALUES ($1, $2)")
            .bind::<Text, _>(mid.clone())
            .bind::<BigInt, _>(delta)
            .execute(tx)
            .await?;
        Ok::<(), diesel::result::Error>(())
    })
    .await?;
    Ok(())
}

async fn effect_counts(c: &mut AsyncPgConnection) -> HashMap<String, i64> {
    diesel::sql_query("SELECT message_id, COUNT(*) AS n FROM effect GROUP BY message_id")
        .load::<Count>(c)
        .await
        .expect("effect counts")
        .into_iter()
        .map(|r| (r.message_id, r.n))
        .collect()
}

/// Every message applied exactly once: one effect row per message id, one inbox row each,
/// the stock arithmetic.
async fn assert_exactly_once_pg(db: &PgDb, events: &[SinkEvent]) {
    let mut c = db.connect().await;
    let expected: HashSet<String> = events.iter().map(message_id).collect();
    let counts = effect_counts(&mut c).await;
    let got: HashSet<String> = counts.keys().cloned().collect();
    assert_eq!(got, expected, "every message applied, nothing else");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    let inbox = diesel::sql_query("SELECT COUNT(*) AS n FROM processed_message")
        .get_result::<Total>(&mut c)
        .await
        .expect("inbox rows");
    assert_eq!(inbox.n as usize, expected.len());
    let stock = diesel::sql_query("SELECT on_hand FROM stock WHERE sku = 'SKU'")
        .get_result::<OnHand>(&mut c)
        .await
        .expect("stock");
    assert_eq!(stock.on_hand, expected_stock(events));
}

/// A consumer running in a task, stopped through its shutdown future.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), StreamError>>,
}

impl Running {
    fn start<H: paynotify_consumer::Handler>(settings: StreamSettings, handler: H) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let consumer = StreamConsumer::new(REDIS, settings).expect("consumer");
        let task = tokio::spawn(async move {
            consumer
                .run(handler, async move {
                    let _ = stopped.await;
                })
                .await
        });
        Self {
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let done = tokio::time::timeout(DEADLINE, &mut self.task)
            .await
            .expect("the consumer stops within the deadline")
            .expect("the consumer task did not panic");
        done.expect("run returns Ok on shutdown");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn settings(s: &Streams, consumer: &str) -> StreamSettings {
    let mut settings = StreamSettings::new(&s.stream, &s.group, consumer);
    // The tests publish before the consumer starts: a new group takes the history.
    settings.start_id = "0".to_owned();
    settings.block = Duration::from_millis(300);
    settings.retry_backoff = Duration::from_millis(50);
    settings.retry_backoff_max = Duration::from_millis(200);
    // Parked as soon as `max_attempts` deliveries failed.
    settings.park_after = Duration::ZERO;
    settings
}

fn pg_handler(
    c: Arc<Mutex<AsyncPgConnection>>,
) -> impl Fn(Event) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Failure>> + Send>>
+ Send
+ Sync
+ 'static {
    move |e: Event| {
        let c = c.clone();
        Box::pin(async move { pg_apply(&c, e).await })
    }
}

// ---------------------------------------------------------------------------------------
// 1. Published twice: applied once each, all acknowledged.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_published_twice_is_applied_once_and_acked() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 120);
    publish(&s.stream, &evs).await;
    publish(&s.stream, &evs).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let running = Running::start(settings(&s, "c1"), pg_handler(conn));
    let mut r = redis().await;
    eventually!("the stream drained", drained(&mut r, &s).await);
    running.stop().await;
    assert_eq!(pending(&mut r, &s).await, 0);
    let len: u64 = r.xlen(&s.stream).await.expect("XLEN");
    assert_eq!(len, 240, "both copies were in the stream");
    assert_exactly_once_pg(&db, &evs).await;
    assert!(parked(&mut r, &s).await.ids.is_empty(), "nothing parked");
}

// ---------------------------------------------------------------------------------------
// 2. The example killed with kill -9 between commit and ack, then restarted.

/// A child process killed (SIGKILL) when dropped.
struct Child {
    child: std::process::Child,
    name: String,
}

impl Child {
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn inventory(db: &SqliteDb, s: &Streams, name: &str, claim_idle_ms: u64) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(db.dir.path().join(format!("{name}.log")))
        .expect("log file");
    let child = Command::new(support::inventory_example())
        .args([
            "--sink",
            "redis",
            "--database",
            &db.path,
            "--stream",
            &s.stream,
        ])
        .args(["--group", &s.group, "--name", name])
        .args(["--initial-stock", &INITIAL.to_string()])
        .args(["--claim-idle-ms", &claim_idle_ms.to_string()])
        .args(["--batch", "32", "--start-id", "0"])
        .stdout(Stdio::from(log.try_clone().expect("log file")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start the example");
    Child {
        child,
        name: name.to_owned(),
    }
}

async fn sqlite_count(c: &mut Sqlite, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Total>(c)
        .await
        .map(|t| t.n)
        .unwrap_or(0)
}

/// Starts `name`, lets it work, kills it with SIGKILL, until the kill lands between a
/// commit and its ack: an entry still pending on `name` whose message id is already in
/// `processed_message`. Each attempt publishes a fresh wave so there is work in hand.
async fn kill_between_commit_and_ack(
    db: &SqliteDb,
    s: &Streams,
    name: &str,
    published: &mut Vec<SinkEvent>,
) {
    let mut r = redis().await;
    for attempt in 0..10 {
        // A prefix of its own: every wave's message ids are new.
        let wave = events(&unique(&format!("{}-{name}", s.stream)), 400);
        publish(&s.stream, &wave).await;
        published.extend(wave);
        let mut check = db.connect().await;
        let before = sqlite_count(&mut check, "SELECT COUNT(*) AS n FROM processed_message").await;
        let child = inventory(db, s, name, 60_000);
        let start = Instant::now();
        loop {
            let now = sqlite_count(&mut check, "SELECT COUNT(*) AS n FROM processed_message").await;
            if now >= before + 40 {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{} applied nothing within {DEADLINE:?} ({now} of {before} + 40); its log:\n{}",
                child.name,
                std::fs::read_to_string(db.dir.path().join(format!("{name}.log")))
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        child.kill9();
        let held = pending_of(&mut r, s, name).await;
        let ids = message_ids_of(&mut r, s, &held).await;
        if ids.is_empty() {
            continue;
        }
        let list = ids
            .iter()
            .map(|m| format!("'{m}'"))
            .collect::<Vec<_>>()
            .join(",");
        let committed = sqlite_count(
            &mut check,
            &format!("SELECT COUNT(*) AS n FROM processed_message WHERE message_id IN ({list})"),
        )
        .await;
        if committed > 0 {
            eprintln!(
                "attempt {attempt}: {name} killed with {} entries pending, {committed} of them committed",
                held.len()
            );
            return;
        }
    }
    panic!("no kill landed between a commit and its ack in 10 attempts");
}

#[derive(diesel::QueryableByName)]
struct SqliteCount {
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_killed_between_commit_and_ack_applies_each_event_once() {
    let s = Streams::new();
    let db = SqliteDb::create();
    let mut r = redis().await;
    let mut published = Vec::new();

    // Killed between commit and ack, then restarted under the same name: it re-reads what
    // it held.
    kill_between_commit_and_ack(&db, &s, "c1", &mut published).await;
    let held = pending_of(&mut r, &s, "c1").await;
    assert!(!held.is_empty());
    let c1 = inventory(&db, &s, "c1", 60_000);
    eventually!("c1 restarted drains the stream", drained(&mut r, &s).await);
    c1.kill9();

    // Killed again; this time a second consumer takes its entries over with XAUTOCLAIM.
    kill_between_commit_and_ack(&db, &s, "c1", &mut published).await;
    assert!(!pending_of(&mut r, &s, "c1").await.is_empty());
    let c2 = inventory(&db, &s, "c2", 300);
    eventually!(
        "c2 drains the stream, c1's entries included",
        drained(&mut r, &s).await
    );
    c2.kill9();
    assert!(pending_of(&mut r, &s, "c1").await.is_empty());
    assert_eq!(pending(&mut r, &s).await, 0);

    let mut c = db.connect().await;
    let counts: HashMap<String, i64> =
        diesel::sql_query("SELECT message_id, COUNT(*) AS n FROM stock_move GROUP BY message_id")
            .load::<SqliteCount>(&mut c)
            .await
            .expect("stock moves")
            .into_iter()
            .map(|r| (r.message_id, r.n))
            .collect();
    let expected: HashSet<String> = published.iter().map(message_id).collect();
    assert_eq!(
        expected.len(),
        published.len(),
        "message ids distinct across waves"
    );
    assert_eq!(
        counts.keys().cloned().collect::<HashSet<_>>(),
        expected,
        "every message moved stock"
    );
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "moved stock more than once: {twice:?}");
    let on_hand = diesel::sql_query("SELECT on_hand FROM stock WHERE sku = 'SKU-1'")
        .get_result::<OnHand>(&mut c)
        .await
        .expect("stock");
    assert_eq!(on_hand.on_hand, expected_stock(&published));
    let inbox = sqlite_count(&mut c, "SELECT COUNT(*) AS n FROM processed_message").await;
    assert_eq!(inbox as usize, expected.len());
}

// ---------------------------------------------------------------------------------------
// 3. The connection cut mid-batch.

async fn client_ids(c: &mut MultiplexedConnection, name: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(c)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("name={name}")))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id=").map(str::to_owned))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_batch_reconnects_and_applies_each_once() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 200);
    publish(&s.stream, &evs).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let mut settings = settings(&s, "c1");
    settings.batch = 50;
    let name = settings.effective_client_name();
    // Slow enough that the kill lands while a batch is in hand.
    let slow = {
        let conn = conn.clone();
        move |e: Event| {
            let conn = conn.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                pg_apply(&conn, e).await
            }
        }
    };
    let running = Running::start(settings, slow);
    let mut r = redis().await;
    let mut check = db.connect().await;
    eventually!(
        "some of the first batch applied",
        effect_counts(&mut check).await.len() >= 10
    );
    let before = client_ids(&mut r, &name).await;
    assert_eq!(before.len(), 1, "one connection named {name}");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&before[0])
        .query_async(&mut r)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    let applied_at_kill = effect_counts(&mut check).await.len();
    assert!(applied_at_kill < evs.len(), "the kill came mid-way");
    eventually!(
        "the stream drained after the cut",
        drained(&mut r, &s).await
    );
    let after = client_ids(&mut r, &name).await;
    assert_eq!(after.len(), 1, "reconnected once");
    assert_ne!(after, before, "a new connection");
    running.stop().await;
    assert_exactly_once_pg(&db, &evs).await;
}

// ---------------------------------------------------------------------------------------
// 4. Two consumers in one group.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_in_one_group_apply_each_event_once_in_total() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 200);
    let mut r = redis().await;
    let mut a = settings(&s, "c1");
    a.batch = 10;
    let mut b = settings(&s, "c2");
    b.batch = 10;
    let c1 = Running::start(a, pg_handler(Arc::new(Mutex::new(db.connect().await))));
    let c2 = Running::start(b, pg_handler(Arc::new(Mutex::new(db.connect().await))));
    // Twice, so copies of one message meet in the two consumers.
    publish(&s.stream, &evs).await;
    publish(&s.stream, &evs).await;
    eventually!("the stream drained", drained(&mut r, &s).await);
    c1.stop().await;
    c2.stop().await;
    assert_eq!(pending(&mut r, &s).await, 0);
    assert_exactly_once_pg(&db, &evs).await;
}

// ---------------------------------------------------------------------------------------
// 5. Failures: transient then success, always failing, malformed entries.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_failing_transiently_k_times_applies_once() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 30);
    publish(&s.stream, &evs).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let calls: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let calls = calls.clone();
        move |e: Event| {
            let conn = conn.clone();
            let n = {
                let mut calls = calls.lock().expect("calls");
                let n = calls.entry(e.message_id()).or_default();
                *n += 1;
                *n
            };
            async move {
                if n <= 2 {
                    return Err(Failure::Transient(format!("try {n}")));
                }
                pg_apply(&conn, e).await
            }
        }
    };
    let mut settings = settings(&s, "c1");
    settings.max_attempts = 5;
    let running = Running::start(settings, handler);
    let mut r = redis().await;
    eventually!("the stream drained", drained(&mut r, &s).await);
    running.stop().await;
    assert_eq!(pending(&mut r, &s).await, 0);
    assert_exactly_once_pg(&db, &evs).await;
    assert!(parked(&mut r, &s).await.ids.is_empty(), "nothing parked");
    let calls = calls.lock().expect("calls");
    assert!(
        calls.values().all(|n| *n == 3),
        "two failures then one success: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_always_fails_parks_after_max_attempts() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 6);
    publish(&s.stream, &evs).await;
    let calls: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let calls = calls.clone();
        move |e: Event| {
            *calls
                .lock()
                .expect("calls")
                .entry(e.message_id())
                .or_default() += 1;
            async move { Err(Failure::Transient("the database is away".to_owned())) }
        }
    };
    let mut settings = settings(&s, "c1");
    settings.max_attempts = 3;
    let running = Running::start(settings, handler);
    let mut r = redis().await;
    eventually!(
        "every entry parked",
        parked(&mut r, &s).await.ids.len() >= evs.len() && drained(&mut r, &s).await
    );
    running.stop().await;
    assert_eq!(
        pending(&mut r, &s).await,
        0,
        "parked entries are acknowledged"
    );
    let parked = parked(&mut r, &s).await;
    assert_eq!(parked.ids.len(), evs.len());
    let sources: StreamRangeReply = r.xrange_all(&s.stream).await.expect("XRANGE");
    let source_ids: HashSet<String> = sources.ids.iter().map(|e| e.id.clone()).collect();
    let mut parked_ids = HashSet::new();
    for p in &parked.ids {
        let reason: String = p.get("reason").expect("a reason");
        assert!(reason.contains("the database is away"), "{reason}");
        parked_ids.insert(p.get::<String>("source_id").expect("a source id"));
        let topic: String = p.get("topic").expect("the original fields");
        let biz_key: String = p.get("biz_key").expect("the original fields");
        assert!(evs.iter().any(|e| e.topic == topic && e.biz_key == biz_key));
    }
    assert_eq!(parked_ids, source_ids, "each entry parked once");
    let mut c = db.connect().await;
    assert!(effect_counts(&mut c).await.is_empty(), "nothing applied");
    let calls = calls.lock().expect("calls");
    assert_eq!(calls.len(), evs.len());
    assert!(
        calls.values().all(|n| *n == 3),
        "max_attempts deliveries each: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_entries_are_parked_and_the_others_applied() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 20);
    let mut r = redis().await;
    publish(&s.stream, &evs[..10]).await;
    let bad: [&[(&str, &str)]; 3] = [
        &[
            ("id", "1"),
            ("topic", "ORDER_PAID"),
            ("payload", "{}"),
            ("created_at", "x"),
        ],
        &[
            ("id", "2"),
            ("topic", "ORDER_PAID"),
            ("biz_key", "BAD-2"),
            ("payload", "{not json"),
            ("created_at", "x"),
        ],
        &[
            ("id", "three"),
            ("topic", "ORDER_PAID"),
            ("biz_key", "BAD-3"),
            ("payload", "{}"),
            ("created_at", "x"),
        ],
    ];
    for fields in bad {
        let _: String = r.xadd(&s.stream, "*", fields).await.expect("XADD");
    }
    publish(&s.stream, &evs[10..]).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let running = Running::start(settings(&s, "c1"), pg_handler(conn));
    eventually!("the stream drained", drained(&mut r, &s).await);
    running.stop().await;
    assert_eq!(pending(&mut r, &s).await, 0);
    assert_exactly_once_pg(&db, &evs).await;
    let parked = parked(&mut r, &s).await;
    let reasons: Vec<String> = parked
        .ids
        .iter()
        .map(|p| p.get::<String>("reason").expect("a reason"))
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons[0].contains("missing field `biz_key`"),
        "{reasons:?}"
    );
    assert!(reasons[1].contains("not JSON"), "{reasons:?}");
    assert!(reasons[2].contains("not an integer"), "{reasons:?}");
    assert_eq!(
        parked.ids[1].get::<String>("payload").as_deref(),
        Some("{not json"),
        "the original fields kept"
    );
}

/// The delivery count of the entry `id` (`None`: not pending).
async fn deliveries_of(c: &mut MultiplexedConnection, s: &Streams, id: &str) -> Option<usize> {
    let reply: redis::streams::StreamPendingCountReply = c
        .xpending_count(&s.stream, &s.group, id, id, 1)
        .await
        .expect("XPENDING of one entry");
    reply
        .ids
        .into_iter()
        .find(|p| p.id == id)
        .map(|p| p.times_delivered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_park_fails_stays_pending_until_it_is_parked() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 10);
    let mut r = redis().await;
    // The parked stream's name taken by a hash: every XADD to it fails with WRONGTYPE.
    let _: i64 = r
        .hset(&s.parked, "not", "a stream")
        .await
        .expect("HSET on the parked key");
    publish(&s.stream, &evs[..5]).await;
    let bad: String = r
        .xadd(
            &s.stream,
            "*",
            &[("id", "x"), ("topic", "ORDER_PAID"), ("biz_key", "BAD")],
        )
        .await
        .expect("XADD");
    publish(&s.stream, &evs[5..]).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let running = Running::start(settings(&s, "c1"), pg_handler(conn));
    let mut check = db.connect().await;
    eventually!(
        "the good entries applied and the bad one delivered three times, still pending",
        effect_counts(&mut check).await.len() == evs.len()
            && deliveries_of(&mut r, &s, &bad)
                .await
                .is_some_and(|n| n >= 3)
    );
    assert_eq!(
        pending_of(&mut r, &s, "c1").await,
        vec![bad.clone()],
        "only the entry that could not be parked is pending"
    );
    let kind: String = redis::cmd("TYPE")
        .arg(&s.parked)
        .query_async(&mut r)
        .await
        .expect("TYPE");
    assert_eq!(kind, "hash", "nothing was written to the parked key");
    // The key fixed: the entry is parked and acknowledged.
    let _: i64 = r.del(&s.parked).await.expect("DEL");
    eventually!(
        "the bad entry parked and acknowledged",
        parked(&mut r, &s).await.ids.len() == 1 && drained(&mut r, &s).await
    );
    running.stop().await;
    let parked = parked(&mut r, &s).await;
    assert_eq!(
        parked.ids[0].get::<String>("source_id").as_deref(),
        Some(bad.as_str())
    );
    assert_eq!(pending(&mut r, &s).await, 0);
    assert_exactly_once_pg(&db, &evs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_shorter_than_park_after_parks_nothing() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 20);
    publish(&s.stream, &evs).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    // The database "away" for 3 s from the first call.
    let outage_from: Arc<OnceLock<Instant>> = Arc::default();
    let failures: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let failures = failures.clone();
        move |e: Event| {
            let conn = conn.clone();
            let from = *outage_from.get_or_init(Instant::now);
            let down = from.elapsed() < Duration::from_secs(3);
            if down {
                *failures
                    .lock()
                    .expect("failures")
                    .entry(e.message_id())
                    .or_default() += 1;
            }
            async move {
                if down {
                    return Err(Failure::Transient("the database is away".to_owned()));
                }
                pg_apply(&conn, e).await
            }
        }
    };
    let mut settings = settings(&s, "c1");
    settings.max_attempts = 3;
    settings.park_after = Duration::from_secs(10);
    settings.retry_backoff = Duration::from_millis(50);
    settings.retry_backoff_max = Duration::from_millis(500);
    let running = Running::start(settings, handler);
    let mut r = redis().await;
    eventually!("the stream drained", drained(&mut r, &s).await);
    running.stop().await;
    assert_eq!(pending(&mut r, &s).await, 0);
    assert!(parked(&mut r, &s).await.ids.is_empty(), "nothing parked");
    assert_exactly_once_pg(&db, &evs).await;
    let failures = failures.lock().expect("failures");
    assert_eq!(
        failures.len(),
        evs.len(),
        "every entry failed: {failures:?}"
    );
    assert!(
        failures.values().all(|n| *n >= 3),
        "each failed at least max_attempts deliveries without being parked: {failures:?}"
    );
}

/// Whether the stream has the group.
async fn has_group(c: &mut MultiplexedConnection, s: &Streams) -> bool {
    let groups: redis::RedisResult<Vec<HashMap<String, redis::Value>>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&s.stream)
        .query_async(c)
        .await;
    groups.is_ok_and(|gs| {
        gs.iter().any(|g| {
            g.get("name")
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .as_deref()
                == Some(s.group.as_str())
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_starts_at_new_entries_by_default() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let old = events(&format!("{}-old", s.stream), 10);
    let new = events(&format!("{}-new", s.stream), 10);
    publish(&s.stream, &old).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let mut settings = settings(&s, "c1");
    settings.start_id = StreamSettings::new("s", "g", "c").start_id;
    assert_eq!(settings.start_id, "$");
    let running = Running::start(settings, pg_handler(conn));
    let mut r = redis().await;
    eventually!("the group made", has_group(&mut r, &s).await);
    publish(&s.stream, &new).await;
    eventually!("the stream drained", drained(&mut r, &s).await);
    running.stop().await;
    assert_eq!(pending(&mut r, &s).await, 0);
    // Only the entries written after the group was made: the history is not replayed.
    assert_exactly_once_pg(&db, &new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_destroyed_while_running_stops_the_consumer_and_is_not_recreated() {
    let s = Streams::new();
    let db = PgDb::create();
    pg_setup(&db).await;
    let evs = events(&s.stream, 5);
    publish(&s.stream, &evs).await;
    let conn = Arc::new(Mutex::new(db.connect().await));
    let mut running = Running::start(settings(&s, "c1"), pg_handler(conn));
    let mut r = redis().await;
    eventually!("the stream drained", drained(&mut r, &s).await);
    let destroyed: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(&s.stream)
        .arg(&s.group)
        .query_async(&mut r)
        .await
        .expect("XGROUP DESTROY");
    assert_eq!(destroyed, 1);
    let ended = tokio::time::timeout(DEADLINE, &mut running.task)
        .await
        .expect("run returns within the deadline")
        .expect("the consumer task did not panic");
    match ended {
        Err(StreamError::GroupGone { group, .. }) => assert_eq!(group, s.group),
        other => panic!("expected GroupGone, got {other:?}"),
    }
    assert!(!has_group(&mut r, &s).await, "the group was not made again");
}
