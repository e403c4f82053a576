//! The RabbitMQ consumer against the machine's RabbitMQ (127.0.0.1:5672, guest/guest), each
//! test in a vhost of its own, events published through the service's real sink, and
//! exactly-once checked in SQL: `stock_move` (no unique key) one row per message id,
//! `stock.on_hand` = initial − paid + refunded, and the inbox's rows.

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use paynotify::relay::sink::{Event as SinkEvent, Sink};
use paynotify::relay::sinks::AmqpSink;
use paynotify_consumer::amqp::{QueueConsumer, QueueError, QueueSettings};
use paynotify_consumer::{Event, Failure, apply_once, inbox, topics};
use support::{PgDb, SqliteDb};

const EXCHANGE: &str = "paynotify.events";
const QUEUE: &str = "inventory";
const PARKED: &str = "inventory.parked";
const CONSUMER: &str = "inventory";
const INITIAL: i64 = 100_000;
/// The deadline of every wait: a bound on a hang, not a speed target. Alone the slowest
/// wait here takes about 10 s; beside the other tests on two loaded cores several times that.
const DEADLINE: Duration = Duration::from_secs(180);

static OUTBOX_ID: AtomicI64 = AtomicI64::new(1);

fn rabbitmqctl(args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl must be installed");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A vhost of the test's own, deleted on drop.
struct Vhost {
    name: String,
}

impl Vhost {
    fn create() -> Self {
        let name = support::unique("pnc-amqp");
        rabbitmqctl(&["-q", "add_vhost", &name]);
        rabbitmqctl(&[
            "-q",
            "set_permissions",
            "-p",
            &name,
            "guest",
            ".*",
            ".*",
            ".*",
        ]);
        Self { name }
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", self.name)
    }

    /// What a broker restart does to this vhost's clients.
    fn close_connections(&self) {
        rabbitmqctl(&[
            "-q",
            "close_all_connections",
            "-p",
            &self.name,
            "test: connection cut",
        ]);
    }

    /// `(messages ready + unacknowledged, consumers)` of `queue`, if it exists.
    fn queue(&self, queue: &str) -> Option<(u64, u64)> {
        let out = rabbitmqctl(&[
            "-q",
            "list_queues",
            "-p",
            &self.name,
            "--no-table-headers",
            "name",
            "messages",
            "consumers",
        ]);
        out.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            if fields.next() != Some(queue) {
                return None;
            }
            let messages = fields.next()?.parse().ok()?;
            let consumers = fields.next()?.parse().ok()?;
            Some((messages, consumers))
        })
    }

    fn messages(&self, queue: &str) -> u64 {
        self.queue(queue).map_or(0, |(m, _)| m)
    }

    async fn wait_consumers(&self, queue: &str, n: u64) {
        wait(&format!("{n} consumers on {queue}"), || async {
            self.queue(queue).is_some_and(|(_, c)| c == n)
        })
        .await;
    }

    async fn channel(&self) -> (Connection, lapin::Channel) {
        let connection = Connection::connect(&self.url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on 127.0.0.1:5672");
        let channel = connection.create_channel().await.expect("channel");
        (connection, channel)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_vhost", &self.name])
            .output();
    }
}

/// Polls `condition` until it holds, at most [`DEADLINE`].
async fn wait<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `n` orders paid, every third refunded once: `(events, paid, refunded)`.
fn events(prefix: &str, n: usize) -> (Vec<SinkEvent>, i64, i64) {
    let mut events = Vec::new();
    let (mut paid, mut refunded) = (0, 0);
    for i in 0..n {
        let order = format!("{prefix}-{i}");
        events.push(event(topics::ORDER_PAID, &order));
        paid += 1;
        if i % 3 == 0 {
            events.push(event(topics::ORDER_REFUNDED, &format!("{order}:R1")));
            refunded += 1;
        }
    }
    (events, paid, refunded)
}

fn event(topic: &str, biz_key: &str) -> SinkEvent {
    SinkEvent {
        id: OUTBOX_ID.fetch_add(1, Ordering::Relaxed),
        topic: topic.to_owned(),
        biz_key: biz_key.to_owned(),
        payload: serde_json::json!({ "order_no": biz_key, "amount": 100 }),
        created_at: "2025-01-01T00:00:00Z".to_owned(),
    }
}

fn message_id(e: &SinkEvent) -> String {
    format!("{}:{}", e.topic, e.biz_key)
}

/// Through paynotify's own sink (publisher confirms, mandatory): every event must be acked.
async fn publish(vhost: &Vhost, events: &[SinkEvent]) {
    let sink = AmqpSink::new(&vhost.url(), EXCHANGE, Duration::from_secs(10)).expect("sink");
    for batch in events.chunks(100) {
        let results = sink.publish(batch).await;
        assert!(results.iter().all(Result::is_ok), "published: {results:?}");
    }
}

/// A raw message on paynotify's exchange (what a forger or a broken publisher sends).
async fn publish_raw(vhost: &Vhost, body: &[u8], properties: BasicProperties) {
    let (connection, channel) = vhost.channel().await;
    channel
        .confirm_select(Default::default())
        .await
        .expect("confirm mode");
    let confirm = channel
        .basic_publish(
            EXCHANGE.into(),
            topics::ORDER_PAID.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            properties.with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(
        matches!(confirm, lapin::Confirmation::Ack(None)),
        "{confirm:?}"
    );
    let _ = connection.close(200, "done".into()).await;
}

#[derive(diesel::QueryableByName)]
struct Moved {
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// What the handler is told to do.
#[derive(Clone, Copy)]
enum Mode {
    Apply,
    /// A transient failure on the first `k` deliveries of each message.
    FailFirst(u32),
    AlwaysTransient,
    AlwaysPermanent,
    /// A transient failure of every delivery for this long after the first one (a database
    /// outage).
    Outage(Duration),
    /// The first delivery of each message never finishes (a lock never granted).
    HangFirst,
}

/// The stock keeper of the in-process tests, on PostgreSQL.
struct Stock {
    db: tokio::sync::Mutex<AsyncPgConnection>,
    mode: Mode,
    /// Per-delivery work inside the lock, so a batch takes a while.
    delay: Duration,
    /// Handler runs per message id (deliveries, not applications).
    calls: Mutex<HashMap<String, u32>>,
    /// The first delivery's time ([`Mode::Outage`] begins then).
    first_call: Mutex<Option<Instant>>,
}

impl Stock {
    async fn open(db: &PgDb, mode: Mode) -> Arc<Self> {
        let mut conn = db.connect().await;
        conn.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, on_hand BIGINT NOT NULL); \
             CREATE TABLE IF NOT EXISTS stock_move (message_id TEXT NOT NULL, delta BIGINT NOT NULL); \
             INSERT INTO stock VALUES ('SKU-1', {INITIAL}) ON CONFLICT DO NOTHING;"
        ))
        .await
        .expect("tables");
        inbox::create_table(&mut conn).await.expect("inbox");
        Arc::new(Self {
            db: tokio::sync::Mutex::new(conn),
            mode,
            delay: Duration::ZERO,
            calls: Mutex::new(HashMap::new()),
            first_call: Mutex::new(None),
        })
    }

    fn calls(&self) -> HashMap<String, u32> {
        self.calls.lock().expect("calls").clone()
    }

    async fn handle(&self, event: Event) -> Result<(), Failure> {
        let id = event.message_id();
        let call = {
            let mut calls = self.calls.lock().expect("calls");
            let n = calls.entry(id.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let since_first = self
            .first_call
            .lock()
            .expect("first call")
            .get_or_insert_with(Instant::now)
            .elapsed();
        match self.mode {
            Mode::Outage(outage) if since_first < outage => {
                return Err(Failure::Transient(format!("the database is down ({id})")));
            }
            Mode::FailFirst(k) if call <= k => {
                return Err(Failure::Transient(format!("call {call} of {id}")));
            }
            Mode::HangFirst if call == 1 => std::future::pending::<()>().await,
            Mode::AlwaysTransient => return Err(Failure::Transient("always".to_owned())),
            Mode::AlwaysPermanent => return Err(Failure::Permanent("never".to_owned())),
            _ => {}
        }
        let delta: i64 = match event.topic.as_str() {
            topics::ORDER_PAID => -1,
            topics::ORDER_REFUNDED => 1,
            _ => 0,
        };
        let mut db = self.db.lock().await;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        apply_once(&mut *db, CONSUMER, &id, async |tx| {
            diesel::sql_query("UPDATE stock SET on_hand = on_hand + $1 WHERE sku = 'SKU-1'")
                .bind::<BigInt, _>(delta)
                .execute(tx)
                .await?;
            diesel::sql_query("INSERT INTO stock_move (message_id, delta) VALUES ($1, $2)")
                .bind::<Text, _>(id.clone())
                .bind::<BigInt, _>(delta)
                .execute(tx)
                .await?;
            Ok::<_, diesel::result::Error>(delta)
        })
        .await?;
        Ok(())
    }
}

fn handler(stock: &Arc<Stock>) -> impl paynotify_consumer::Handler {
    let stock = stock.clone();
    move |event: Event| {
        let stock = stock.clone();
        async move { stock.handle(event).await }
    }
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .expect(sql)
        .n
}

/// Every event applied exactly once: one `stock_move` row and one inbox row per message id,
/// none other, and the stock's arithmetic.
async fn assert_applied_once(
    conn: &mut AsyncPgConnection,
    events: &[SinkEvent],
    paid: i64,
    refunded: i64,
) {
    let moved: HashMap<String, i64> =
        diesel::sql_query("SELECT message_id, COUNT(*) AS n FROM stock_move GROUP BY message_id")
            .load::<Moved>(conn)
            .await
            .expect("moves")
            .into_iter()
            .map(|m| (m.message_id, m.n))
            .collect();
    for e in events {
        assert_eq!(moved.get(&message_id(e)), Some(&1), "{}", message_id(e));
    }
    assert_eq!(moved.len(), events.len(), "no other message moved stock");
    let on_hand = count(conn, "SELECT on_hand AS n FROM stock WHERE sku = 'SKU-1'").await;
    assert_eq!(on_hand, INITIAL - paid + refunded);
    let processed = count(conn, "SELECT COUNT(*) AS n FROM processed_message").await;
    assert_eq!(processed, events.len() as i64);
}

async fn moves(db: &PgDb) -> i64 {
    count(
        &mut db.connect().await,
        "SELECT COUNT(DISTINCT message_id) AS n FROM stock_move",
    )
    .await
}

fn settings() -> QueueSettings {
    let mut settings = QueueSettings::new(QUEUE);
    settings.retry_delay = Duration::from_millis(20);
    settings.retry_delay_max = Duration::from_millis(200);
    settings.park_after = Duration::ZERO;
    settings.reconnect_delay = Duration::from_millis(100);
    settings.reconnect_delay_max = Duration::from_secs(2);
    settings
}

/// A consumer running in a task of its own, stopped by [`Running::stop`].
struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), QueueError>>,
}

impl Running {
    fn start(vhost: &Vhost, settings: QueueSettings, stock: &Arc<Stock>) -> Self {
        let consumer = QueueConsumer::new(&vhost.url(), settings).expect("consumer");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handler = handler(stock);
        let task = tokio::spawn(async move {
            consumer
                .run(handler, async {
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
        assert!(!self.task.is_finished(), "the consumer ended by itself");
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let ended = tokio::time::timeout(DEADLINE, &mut self.task)
            .await
            .expect("the consumer stops after shutdown")
            .expect("the consumer's task");
        assert!(ended.is_ok(), "run after shutdown: {ended:?}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The parked messages: `(x-parked-reason, message_id property, body)`, taken off the queue.
async fn parked(vhost: &Vhost, max: usize) -> Vec<(String, Option<String>, Vec<u8>)> {
    let (connection, channel) = vhost.channel().await;
    let mut out = Vec::new();
    for _ in 0..=max {
        let Some(message) = channel
            .basic_get(PARKED.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        else {
            break;
        };
        let properties = &message.delivery.properties;
        let reason = properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-parked-reason").cloned())
            .map(|v| match v {
                AMQPValue::LongString(s) => s.to_string(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        out.push((
            reason,
            properties.message_id().as_ref().map(ShortString::to_string),
            message.delivery.data.clone(),
        ));
    }
    let _ = connection.close(200, "done".into()).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_event_published_twice_is_applied_once_and_the_queue_drains() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::Apply).await;
    let running = Running::start(&vhost, settings(), &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    let (events, paid, refunded) = events("O", 150);
    publish(&vhost, &events).await;
    publish(&vhost, &events).await;

    let total = events.len() as i64;
    wait("every event applied and acked", || async {
        moves(&db).await == total && vhost.messages(QUEUE) == 0
    })
    .await;
    // Both copies of every event were delivered and acked; the second was a duplicate.
    wait("both copies handled", || async {
        stock.calls().values().sum::<u32>() == 2 * total as u32
    })
    .await;
    running.stop().await;

    assert_applied_once(&mut db.connect().await, &events, paid, refunded).await;
    assert!(
        stock.calls().values().all(|&n| n == 2),
        "{:?}",
        stock.calls()
    );
    assert_eq!(vhost.messages(QUEUE), 0);
    assert_eq!(vhost.messages(PARKED), 0);
}

/// A handler that hangs is cut off after `handler_timeout` and its delivery requeued as a
/// transient failure: with one prefetch slot, a hung first delivery of each message would
/// otherwise hold the queue for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_handler_is_cut_off_and_its_message_applied_on_the_next_delivery() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::HangFirst).await;
    let mut settings = settings();
    settings.prefetch = 1;
    settings.max_attempts = 5;
    settings.handler_timeout = Some(Duration::from_millis(300));
    let running = Running::start(&vhost, settings, &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    let (events, paid, refunded) = events("H", 3);
    publish(&vhost, &events).await;
    let total = events.len() as i64;
    // Well under DEADLINE: each message waits out one timeout, not a hang.
    let start = Instant::now();
    while !(moves(&db).await == total && vhost.messages(QUEUE) == 0) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "a hung handler held the queue: {:?}",
            stock.calls()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running.stop().await;

    assert_applied_once(&mut db.connect().await, &events, paid, refunded).await;
    assert!(
        stock.calls().values().all(|&n| n == 2),
        "each hung once, then applied: {:?}",
        stock.calls()
    );
    assert_eq!(vhost.messages(PARKED), 0);
}

/// The example binary, killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_example(vhost: &Vhost, db: &SqliteDb) -> Child {
    let child = Command::new(support::inventory_example())
        .args([
            "--sink",
            "amqp",
            "--amqp-url",
            &vhost.url(),
            "--database",
            &db.path,
            "--queue",
            QUEUE,
            "--initial-stock",
            &INITIAL.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    Child(child)
}

async fn sqlite_count(db: &SqliteDb, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(&mut db.connect().await)
        .await
        .expect(sql)
        .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_killed_between_commit_and_ack_applies_each_event_once_after_restart() {
    tokio::task::spawn_blocking(support::inventory_example)
        .await
        .expect("the example built");
    let vhost = Vhost::create();
    let db = SqliteDb::create();
    let mut child = start_example(&vhost, &db);
    vhost.wait_consumers(QUEUE, 1).await;

    let mut all = Vec::new();
    let (mut paid, mut refunded) = (0, 0);
    let mut batch = 0;
    let mut proven = false;
    for round in 0..30 {
        let processed = sqlite_count(&db, "SELECT COUNT(*) AS n FROM processed_message").await;
        if all.len() as i64 - processed < 100 {
            let (events, p, r) = events(&format!("K{batch}"), 300);
            batch += 1;
            publish(&vhost, &events).await;
            all.extend(events);
            paid += p;
            refunded += r;
        }
        let target = processed + 10;
        wait("progress before the kill", || async {
            sqlite_count(&db, "SELECT COUNT(*) AS n FROM processed_message").await >= target
        })
        .await;
        drop(child); // SIGKILL: no chance to ack what it committed
        wait("the killed consumer gone", || async {
            vhost.queue(QUEUE).is_some_and(|(_, c)| c == 0)
        })
        .await;
        let held = vhost.messages(QUEUE) as i64;
        let processed = sqlite_count(&db, "SELECT COUNT(*) AS n FROM processed_message").await;
        let unprocessed = all.len() as i64 - processed;
        // Never acked before committing: every message not processed is still held.
        assert!(
            held >= unprocessed,
            "held {held} < unprocessed {unprocessed}"
        );
        child = start_example(&vhost, &db);
        vhost.wait_consumers(QUEUE, 1).await;
        if held > unprocessed {
            eprintln!(
                "round {round}: the broker holds {held}, {unprocessed} unprocessed: \
                 killed between commit and ack"
            );
            proven = true;
            break;
        }
    }
    assert!(proven, "no kill landed between a commit and its ack");

    let total = all.len() as i64;
    wait(
        "every event applied and acked after the restart",
        || async {
            sqlite_count(&db, "SELECT COUNT(*) AS n FROM processed_message").await == total
                && vhost.messages(QUEUE) == 0
        },
    )
    .await;
    drop(child);

    let mut conn = db.connect().await;
    let moved: HashMap<String, i64> =
        diesel::sql_query("SELECT message_id, COUNT(*) AS n FROM stock_move GROUP BY message_id")
            .load::<Moved>(&mut conn)
            .await
            .expect("moves")
            .into_iter()
            .map(|m| (m.message_id, m.n))
            .collect();
    for e in &all {
        assert_eq!(moved.get(&message_id(e)), Some(&1), "{}", message_id(e));
    }
    assert_eq!(moved.len(), all.len());
    let on_hand = diesel::sql_query("SELECT on_hand AS n FROM stock WHERE sku = 'SKU-1'")
        .get_result::<Count>(&mut conn)
        .await
        .expect("stock")
        .n;
    assert_eq!(on_hand, INITIAL - paid + refunded);
    assert_eq!(vhost.messages(QUEUE), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_cut_mid_batch_is_reconnected_and_every_event_applied_once() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let mut stock = Stock::open(&db, Mode::Apply).await;
    Arc::get_mut(&mut stock).expect("not shared yet").delay = Duration::from_millis(5);
    let running = Running::start(&vhost, settings(), &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    let (events, paid, refunded) = events("C", 600);
    publish(&vhost, &events).await;
    let total = events.len() as i64;
    wait("some applied", || async { moves(&db).await >= 50 }).await;
    vhost.close_connections();
    let at_cut = moves(&db).await;
    assert!(at_cut < total, "the batch was done before the cut");

    wait(
        "every event applied and acked after reconnecting",
        || async { moves(&db).await == total && vhost.messages(QUEUE) == 0 },
    )
    .await;
    running.stop().await;
    assert_applied_once(&mut db.connect().await, &events, paid, refunded).await;
    assert_eq!(vhost.messages(PARKED), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_on_one_queue_apply_every_event_once_in_total() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let first = Stock::open(&db, Mode::Apply).await;
    let second = Stock::open(&db, Mode::Apply).await;
    let mut s = settings();
    s.prefetch = 8;
    let a = Running::start(&vhost, s.clone(), &first);
    let b = Running::start(&vhost, s, &second);
    vhost.wait_consumers(QUEUE, 2).await;

    let (events, paid, refunded) = events("T", 200);
    publish(&vhost, &events).await;
    publish(&vhost, &events).await;
    let total = events.len() as i64;
    wait("every event applied and acked", || async {
        moves(&db).await == total && vhost.messages(QUEUE) == 0
    })
    .await;
    a.stop().await;
    b.stop().await;

    assert_applied_once(&mut db.connect().await, &events, paid, refunded).await;
    let (x, y) = (
        first.calls().values().sum::<u32>(),
        second.calls().values().sum::<u32>(),
    );
    assert!(
        x > 0 && y > 0,
        "both consumers handled deliveries: {x}, {y}"
    );
    assert_eq!(x + y, 2 * total as u32, "every copy handled once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transient_failures_are_requeued_until_applied_once() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::FailFirst(2)).await;
    let mut s = settings();
    s.max_attempts = 5;
    let running = Running::start(&vhost, s, &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    let (events, paid, refunded) = events("F", 30);
    publish(&vhost, &events).await;
    let total = events.len() as i64;
    wait("every event applied and acked", || async {
        moves(&db).await == total && vhost.messages(QUEUE) == 0
    })
    .await;
    running.stop().await;

    assert_applied_once(&mut db.connect().await, &events, paid, refunded).await;
    let calls = stock.calls();
    for e in &events {
        assert_eq!(calls.get(&message_id(e)), Some(&3), "{}", message_id(e));
    }
    assert_eq!(vhost.messages(PARKED), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_shorter_than_park_after_parks_nothing() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::Outage(Duration::from_secs(3))).await;
    let mut s = settings();
    s.max_attempts = 3;
    s.park_after = Duration::from_secs(10);
    let running = Running::start(&vhost, s, &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    // Fewer than the prefetch (32): every message is in hand during the outage.
    let (events, paid, refunded) = events("D", 20);
    publish(&vhost, &events).await;
    let total = events.len() as i64;
    wait("every event applied and acked after the outage", || async {
        moves(&db).await == total && vhost.messages(QUEUE) == 0
    })
    .await;
    running.stop().await;

    assert_applied_once(&mut db.connect().await, &events, paid, refunded).await;
    assert_eq!(vhost.messages(PARKED), 0, "nothing parked");
    // Every message failed on more than max_attempts deliveries during the outage, and was
    // kept because park_after had not passed.
    let calls = stock.calls();
    for e in &events {
        let n = calls.get(&message_id(e)).copied().unwrap_or(0);
        assert!(n > 3, "{}: {n} deliveries", message_id(e));
    }
}

async fn assert_all_parked(mode: Mode, max_attempts: u32, calls_each: u32, reason: &str) {
    let mut s = settings();
    s.max_attempts = max_attempts;
    assert_all_parked_with(s, mode, calls_each, reason).await;
}

async fn assert_all_parked_with(s: QueueSettings, mode: Mode, calls_each: u32, reason: &str) {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, mode).await;
    let running = Running::start(&vhost, s, &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    let (events, _, _) = events("P", 12);
    publish(&vhost, &events).await;
    let total = events.len() as u64;
    wait("every event parked", || async {
        vhost.messages(PARKED) == total && vhost.messages(QUEUE) == 0
    })
    .await;
    running.stop().await;

    let mut conn = db.connect().await;
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM stock_move").await,
        0
    );
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM processed_message").await,
        0
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT on_hand AS n FROM stock WHERE sku = 'SKU-1'"
        )
        .await,
        INITIAL
    );
    let calls = stock.calls();
    for e in &events {
        assert_eq!(
            calls.get(&message_id(e)),
            Some(&calls_each),
            "{}",
            message_id(e)
        );
    }
    let parked = parked(&vhost, events.len()).await;
    assert_eq!(parked.len(), events.len());
    let mut ids: Vec<String> = Vec::new();
    for (why, id, body) in &parked {
        assert!(why.contains(reason), "{why}");
        let event: Event = serde_json::from_slice(body).expect("the original body");
        assert_eq!(id.as_deref(), Some(event.message_id().as_str()));
        ids.push(event.message_id());
    }
    ids.sort();
    let mut expected: Vec<String> = events.iter().map(message_id).collect();
    expected.sort();
    assert_eq!(ids, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_always_fails_parks_every_message_after_max_attempts() {
    assert_all_parked(Mode::AlwaysTransient, 3, 3, "failed 3 times").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quorum_queue_parks_at_its_delivery_limit_before_it_would_drop_the_message() {
    let mut s = settings();
    s.queue_arguments
        .insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        )
        .insert("x-delivery-limit".into(), AMQPValue::LongInt(3));
    // Neither of these would park within the test: only the queue's limit does.
    s.max_attempts = 1_000;
    s.park_after = Duration::from_secs(3600);
    assert_all_parked_with(s, Mode::AlwaysTransient, 3, "failed 3 times").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parked_queue_left_with_other_arguments_is_used_as_it_is() {
    let vhost = Vhost::create();
    // As an earlier version declared it: with the work queue's TTL.
    {
        let (connection, channel) = vhost.channel().await;
        let mut arguments = FieldTable::default();
        arguments.insert("x-message-ttl".into(), AMQPValue::LongInt(3_600_000));
        channel
            .queue_declare(
                PARKED.into(),
                lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .expect("the old parked queue");
        let _ = connection.close(200, "done".into()).await;
    }
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::AlwaysPermanent).await;
    let running = Running::start(&vhost, settings(), &stock);
    vhost.wait_consumers(QUEUE, 1).await;
    let (events, _, _) = events("O", 4);
    publish(&vhost, &events).await;
    wait("every event parked on the old queue", || async {
        vhost.messages(PARKED) == events.len() as u64 && vhost.messages(QUEUE) == 0
    })
    .await;
    running.stop().await;
    assert_eq!(moves(&db).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permanent_failure_is_parked_at_once() {
    assert_all_parked(Mode::AlwaysPermanent, 5, 1, "permanent: never").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_messages_are_parked_and_the_others_applied() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::Apply).await;
    let running = Running::start(&vhost, settings(), &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    let (first, paid_a, refunded_a) = events("M", 10);
    publish(&vhost, &first).await;
    publish_raw(&vhost, b"not json {", BasicProperties::default()).await;
    publish_raw(
        &vhost,
        br#"{"id": 1, "topic": "ORDER_PAID"}"#,
        BasicProperties::default(),
    )
    .await;
    // A well-formed event under another message's id.
    let forged = serde_json::to_vec(&event(topics::ORDER_PAID, "M-forged")).expect("json");
    let mut headers = FieldTable::default();
    headers.insert(
        "x-test".into(),
        AMQPValue::LongString(LongString::from("forged")),
    );
    publish_raw(
        &vhost,
        &forged,
        BasicProperties::default()
            .with_message_id("ORDER_PAID:M-0".into())
            .with_headers(headers),
    )
    .await;
    let (second, paid_b, refunded_b) = events("N", 10);
    publish(&vhost, &second).await;

    let events: Vec<SinkEvent> = first.into_iter().chain(second).collect();
    let total = events.len() as i64;
    wait("the good applied, the bad parked", || async {
        moves(&db).await == total && vhost.messages(QUEUE) == 0 && vhost.messages(PARKED) == 3
    })
    .await;
    running.stop().await;

    assert_applied_once(
        &mut db.connect().await,
        &events,
        paid_a + paid_b,
        refunded_a + refunded_b,
    )
    .await;
    assert!(
        !stock.calls().contains_key("ORDER_PAID:M-forged"),
        "no handler ran for the forged message"
    );
    let parked = parked(&vhost, 3).await;
    let mut reasons: Vec<&str> = parked.iter().map(|(r, _, _)| r.as_str()).collect();
    reasons.sort();
    assert_eq!(parked.len(), 3, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("the body is not JSON")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("the body is not an event")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("the message_id property")),
        "{reasons:?}"
    );
    let bodies: Vec<&[u8]> = parked.iter().map(|(_, _, b)| b.as_slice()).collect();
    assert!(
        bodies.contains(&b"not json {".as_slice()),
        "the original body kept"
    );
    assert!(bodies.contains(&forged.as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_refusing_every_connection_is_given_up_on_after_the_bounded_attempts() {
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::Apply).await;
    let mut s = settings();
    s.reconnect_attempts = 3;
    s.reconnect_delay = Duration::from_millis(10);
    s.timeout = Duration::from_secs(5);
    // A vhost that does not exist: the broker refuses every connection.
    let consumer = QueueConsumer::new(
        &format!(
            "amqp://guest:guest@127.0.0.1:5672/{}",
            support::unique("pnc-missing")
        ),
        s,
    )
    .expect("consumer");
    let ended = tokio::time::timeout(
        DEADLINE,
        consumer.run(handler(&stock), std::future::pending()),
    )
    .await
    .expect("run gives up in time");
    assert!(
        matches!(ended, Err(QueueError::GaveUp { attempts: 3, .. })),
        "{ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parked_messages_outlive_the_queues_ttl_and_length_limit() {
    let vhost = Vhost::create();
    let db = PgDb::create();
    let stock = Stock::open(&db, Mode::AlwaysPermanent).await;
    let mut s = settings();
    s.queue_arguments
        .insert("x-message-ttl".into(), AMQPValue::LongInt(1000))
        .insert("x-max-length".into(), AMQPValue::LongInt(1));
    let running = Running::start(&vhost, s, &stock);
    vhost.wait_consumers(QUEUE, 1).await;

    // One at a time: the queue itself holds at most one ready message.
    let (events, _, _) = events("L", 3);
    for (i, e) in events.iter().enumerate() {
        publish(&vhost, std::slice::from_ref(e)).await;
        wait(&format!("{} parked", i + 1), || async {
            vhost.messages(PARKED) == i as u64 + 1 && vhost.messages(QUEUE) == 0
        })
        .await;
    }
    let arguments = rabbitmqctl(&[
        "-q",
        "list_queues",
        "-p",
        &vhost.name,
        "--no-table-headers",
        "name",
        "arguments",
    ]);
    let line = |queue: &str| {
        arguments
            .lines()
            .find(|l| l.split_whitespace().next() == Some(queue))
            .unwrap_or_else(|| panic!("{queue} in {arguments}"))
            .to_owned()
    };
    assert!(line(QUEUE).contains("x-message-ttl"), "{arguments}");
    assert!(!line(PARKED).contains("x-message-ttl"), "{arguments}");
    assert!(!line(PARKED).contains("x-max-length"), "{arguments}");
    // Past the queue's TTL (1 s) three times over: nothing parked expired or was dropped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(vhost.messages(PARKED), events.len() as u64);
    running.stop().await;

    let parked = parked(&vhost, events.len()).await;
    let mut ids: Vec<String> = parked.iter().filter_map(|(_, id, _)| id.clone()).collect();
    ids.sort();
    let mut expected: Vec<String> = events.iter().map(message_id).collect();
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(moves(&db).await, 0);
}
