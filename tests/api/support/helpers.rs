//! `spawn_app()`: the real service on port 0 with a database of its own (`TestDb`, in
//! `test_db`), plus helpers to talk to it and to look at its rows.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use actix_web::dev::ServerHandle;
use chrono::{TimeZone, Utc};
use paynotify::config::{Secret, Settings};
use paynotify::jobs::Jobs;
use paynotify::metrics::Metrics;
use paynotify::startup::{Application, Options};
use paynotify::store::Store;
use paynotify::time::ManualClock;

pub use super::test_db::{Backend, TestDb};

pub struct TestApp {
    pub address: String,
    pub store: Store,
    pub clock: Arc<ManualClock>,
    pub client: reqwest::Client,
    /// Shared with a service rebuilt on the same database (`TestApp::rebuild`).
    pub db: Arc<TestDb>,
    pub api_token: String,
    pub metrics: Arc<Metrics>,
    /// The provider queries and closes of the reconcile and expiry jobs.
    pub reconciler: Arc<paynotify::reconcile::Reconciler>,
    /// The daily bill reconciliation.
    pub bills: Arc<paynotify::bills::Bills>,
    /// Refunds started through paynotify (the job's work: `refunds.drive_due()`).
    pub refunds: Arc<paynotify::refunds::Refunds>,
    /// Transfers started through paynotify (the job's work: `transfers.drive_due()`).
    pub transfers: Arc<paynotify::transfers::Transfers>,
    /// The provider accounts of the file and of `/admin/merchants` (a second instance's
    /// reload: `merchants.reload()`).
    pub merchants: Arc<paynotify::merchants::Merchants>,
    handle: ServerHandle,
    /// The relay, expiry and retention jobs, when the test asked for them.
    jobs: Option<Jobs>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        let jobs = self.jobs.take();
        tokio::spawn(async move {
            if let Some(jobs) = jobs {
                jobs.shutdown(std::time::Duration::from_millis(100)).await;
            }
            handle.stop(false).await
        });
    }
}

pub const API_TOKEN: &str = "test-token";

/// Every key of an order in `GET /orders/{order_no}` (interface.md), sorted.
pub const ORDER_KEYS: [&str; 11] = [
    "amount_fen",
    "channel",
    "closed_at",
    "combine_out_trade_no",
    "created_at",
    "currency",
    "order_no",
    "paid_at",
    "refunded_fen",
    "status",
    "transaction_id",
];

/// Settings for a test: the given database, port 0, a token, small timeouts.
pub fn test_settings(db_url: &str) -> Settings {
    let mut settings = Settings::default();
    settings.server.listen = "127.0.0.1:0".parse().expect("addr");
    settings.server.api_token = Secret::new(API_TOKEN);
    settings.database.url = Secret::new(db_url);
    settings.database.pool_size = 8;
    // Never the working directory's data/archive.
    settings.retention.archive_dir = std::env::temp_dir().join(format!(
        "paynotify-archive-{}",
        paynotify::random::token(b"abcdefghijklmnopqrstuvwxyz", 12).expect("random")
    ));
    settings
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |_| {}).await
}

pub async fn spawn_app_with(backend: Backend, customise: impl FnOnce(&mut Settings)) -> TestApp {
    spawn(backend, customise, false).await
}

/// Like `paynotify serve`: the service plus its jobs (the relay with `relay.sink`, expiry,
/// retention), on the test's manual clock.
pub async fn spawn_app_with_jobs(
    backend: Backend,
    customise: impl FnOnce(&mut Settings),
) -> TestApp {
    spawn(backend, customise, true).await
}

async fn spawn(
    backend: Backend,
    customise: impl FnOnce(&mut Settings),
    with_jobs: bool,
) -> TestApp {
    paynotify::telemetry::init_for_tests();
    let db = Arc::new(TestDb::create(backend).await);
    spawn_on(db, customise, with_jobs).await
}

/// The service on an existing test database.
async fn spawn_on(
    db: Arc<TestDb>,
    customise: impl FnOnce(&mut Settings),
    with_jobs: bool,
) -> TestApp {
    let mut settings = test_settings(db.url());
    customise(&mut settings);
    settings.validate().expect("test settings are valid");
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 8, 0, 0)
            .single()
            .expect("time"),
    ));
    let options = Options {
        clock: clock.clone(),
        extra_notify_routes: vec![crate::support::test_channel::route()],
    };
    let app = Application::build(&settings, options)
        .await
        .expect("application builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let store = app.store().clone();
    let metrics = app.metrics();
    let reconciler = app.reconciler();
    let bills = app.bills();
    let refunds = app.refunds();
    let transfers = app.transfers();
    let merchants = app.merchants();
    let handle = app.handle();
    let jobs = if with_jobs {
        Some(
            app.start_jobs(&settings, clock.clone())
                .await
                .expect("jobs start"),
        )
    } else {
        None
    };
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        store,
        clock,
        client: reqwest::Client::new(),
        db,
        api_token: API_TOKEN.to_owned(),
        metrics,
        reconciler,
        bills,
        refunds,
        transfers,
        merchants,
        handle,
        jobs,
    }
}

impl TestApp {
    /// Stops this service and builds another on the same database with other settings
    /// (a configuration fixed and the service restarted).
    pub async fn rebuild(self, customise: impl FnOnce(&mut Settings)) -> TestApp {
        self.handle.stop(true).await;
        spawn_on(Arc::clone(&self.db), customise, false).await
    }

    /// Another instance of the service on the same database, this one still running (two
    /// instances behind one load balancer).
    pub async fn spawn_beside(&self, customise: impl FnOnce(&mut Settings)) -> TestApp {
        spawn_on(Arc::clone(&self.db), customise, false).await
    }

    /// [`TestApp::spawn_beside`], with the jobs `paynotify serve` runs.
    pub async fn spawn_beside_with_jobs(&self, customise: impl FnOnce(&mut Settings)) -> TestApp {
        spawn_on(Arc::clone(&self.db), customise, true).await
    }

    /// Waits (up to 10 s) until `notify_receipt` holds at least `n` rows; returns the count.
    pub async fn receipts_stored(&self, n: i64) -> i64 {
        for _ in 0..200 {
            let stored = self.db.count("notify_receipt").await;
            if stored >= n {
                return stored;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.db.count("notify_receipt").await
    }

    /// Shuts down in `paynotify serve`'s order: the HTTP server first (its workers and their
    /// runtimes end), then the jobs, whose relay gives back its leases.
    pub async fn shutdown(&mut self, drain: std::time::Duration) {
        self.handle.stop(true).await;
        if let Some(jobs) = self.jobs.take() {
            jobs.shutdown(drain).await;
        }
    }

    /// Uses the pool from a runtime of its own, as an HTTP worker does, `n` checkouts at a
    /// time so the pool opens new connections there; returns once that runtime is gone.
    pub fn use_pool_from_a_worker_runtime(&self, n: usize) {
        let store = self.store.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("worker runtime");
            runtime.block_on(async move {
                let pings = (0..n).map(|_| {
                    let store = store.clone();
                    tokio::spawn(async move { store.ping().await })
                });
                for ping in pings.collect::<Vec<_>>() {
                    ping.await.expect("ping task").expect("ping");
                }
            });
        })
        .join()
        .expect("worker thread");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn create_order(&self, order_no: &str, amount_fen: i64) {
        let response = self
            .client
            .post(self.url("/orders"))
            .bearer_auth(&self.api_token)
            .json(&serde_json::json!({
                "order_no": order_no, "amount_fen": amount_fen, "currency": "CNY", "subject": "test"
            }))
            .send()
            .await
            .expect("POST /orders");
        assert_eq!(response.status(), 201, "creating {order_no}");
    }

    pub async fn get_order(&self, order_no: &str) -> serde_json::Value {
        let response = self
            .client
            .get(self.url(&format!("/orders/{order_no}")))
            .bearer_auth(&self.api_token)
            .send()
            .await
            .expect("GET /orders");
        assert_eq!(response.status(), 200);
        response.json().await.expect("order JSON")
    }

    pub async fn status_of(&self, order_no: &str) -> String {
        self.get_order(order_no).await["status"]
            .as_str()
            .expect("status")
            .to_owned()
    }

    /// The status and refunded total of an order.
    pub async fn refund_state(&self, order_no: &str) -> (String, i64) {
        let order = self.get_order(order_no).await;
        let status = order["status"].as_str().expect("status").to_owned();
        (
            status,
            order["refunded_fen"].as_i64().expect("refunded_fen"),
        )
    }

    /// The outbox rows of one topic, newest first.
    pub async fn outbox(&self, topic: &str) -> Vec<paynotify::store::outbox::StoredMessage> {
        let all = self.store.messages(None, 1000).await.expect("messages");
        all.into_iter().filter(|m| m.topic == topic).collect()
    }

    /// Outbox rows of a topic.
    /// `(reason, biz_key)` of every `PAYMENT_ANOMALY` message of an order, oldest first.
    pub async fn anomalies(&self, order_no: &str) -> Vec<(String, String)> {
        let mut messages = self.outbox("PAYMENT_ANOMALY").await;
        messages.sort_by_key(|m| m.id);
        messages
            .into_iter()
            .filter(|m| m.payload.0["order_no"] == order_no)
            .map(|m| {
                (
                    m.payload.0["reason"].as_str().unwrap_or("").to_owned(),
                    m.biz_key,
                )
            })
            .collect()
    }

    pub async fn messages(&self, topic: &str) -> i64 {
        self.db
            .count(&format!("local_message WHERE topic = '{topic}'"))
            .await
    }
}

/// Generates one `#[tokio::test]` per backend for each listed `async fn(Backend)`.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::helpers::Backend::Postgres).await
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::helpers::Backend::Mysql).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::helpers::Backend::Sqlite).await
                }
            )*
        }
    };
}

/// The value of one counter of the app, by metric name and label values.
pub fn metric(app: &TestApp, name: &str, labels: &[&str]) -> u64 {
    let vec = match name {
        "paynotify_notifications_total" => &app.metrics.notifications,
        "paynotify_notify_rejections_total" => &app.metrics.rejections,
        "paynotify_anomalies_total" => &app.metrics.anomalies,
        "paynotify_gate_total" => &app.metrics.gate,
        "paynotify_receipts_total" => &app.metrics.receipts,
        "paynotify_certificate_refresh_total" => &app.metrics.certificate_refresh,
        other => panic!("unknown metric {other}"),
    };
    Metrics::count(vec, labels)
}

/// An admin request with the API token: the status and the JSON answer.
pub async fn admin(app: &TestApp, method: reqwest::Method, path: &str) -> (u16, serde_json::Value) {
    let response = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect(path);
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

/// An admin request with the API token and a JSON body: the status and the JSON answer
/// (`null` when the answer is not JSON).
pub async fn admin_json(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let response = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&app.api_token)
        .json(body)
        .send()
        .await
        .expect(path);
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// POSTs a forged provider request (its headers and raw body); returns status and body.
pub async fn post_delivery(
    app: &TestApp,
    path: &str,
    d: &paynotify::qa::forge::Delivery,
) -> (u16, String) {
    let mut request = app.client.post(app.url(path)).body(d.body.clone());
    for (name, value) in &d.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let response = request.send().await.expect("notify request");
    (
        response.status().as_u16(),
        response.text().await.expect("body"),
    )
}

/// A known-answer vector file (tests/vectors/…).
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("vector JSON")
}

/// A WeChat payment notice as the WeChat channel would decode it.
pub fn wechat_paid(
    order_no: &str,
    transaction_id: &str,
    amount_fen: i64,
) -> paynotify::notice::Notice {
    use paynotify::notice::{ChannelId, MerchantIds, Notice, NoticeKind};
    Notice {
        channel: ChannelId::Wechat,
        kind: NoticeKind::Paid,
        out_trade_no: order_no.into(),
        transaction_id: transaction_id.into(),
        amount_fen,
        currency: "CNY".into(),
        merchant: MerchantIds {
            merchant_id: "1900000001".into(),
            app_id: Some("wx1".into()),
        },
        merchant_matches: true,
        occurred_at: None,
    }
}

/// A test's own connection to the Redis at `url`: patient (5 s to connect, 5 s for an
/// answer), because the client's defaults (1 s, 0.5 s) are what the service's timeouts are
/// tested against, not what a two-core machine running the whole suite guarantees a test's
/// look at a node.
pub async fn redis_connection(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let patient = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(5)))
        .set_response_timeout(Some(std::time::Duration::from_secs(5)));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&patient)
        .await
}

/// Every entry of a Redis stream: `(id, [(field, value)])`.
pub async fn stream_entries(redis_url: &str, stream: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut conn = redis_connection(redis_url).await.expect("conn");
    redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("xrange")
}

/// Polls `check` every 50 ms for at most `limit`; true once it held.
pub async fn eventually<F, Fut>(limit: std::time::Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    check().await
}

/// A storm of deliveries during a fault: more than 50 answers, each an acknowledgement (204)
/// or "retry" (503), never anything else.
pub fn assert_storm_answers(statuses: &[actix_web::http::StatusCode]) {
    use actix_web::http::StatusCode;
    assert!(statuses.len() > 50, "a storm: {}", statuses.len());
    let unexpected: Vec<_> = statuses
        .iter()
        .filter(|s| **s != StatusCode::NO_CONTENT && **s != StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
}

/// `(channel, account)` of every account an order names, as the reconcile and expiry jobs
/// read them (`order_account`, by channel).
pub async fn named_accounts(store: &Store, order_no: &str) -> Vec<(String, String)> {
    let order = store
        .reconcile_target(order_no)
        .await
        .expect("reconcile target")
        .expect("the order");
    order
        .accounts
        .into_iter()
        .map(|a| (a.channel, a.account))
        .collect()
}

/// One `(channel, account)` of [`named_accounts`].
pub fn named(channel: &str, account: &str) -> (String, String) {
    (channel.to_owned(), account.to_owned())
}

/// A port on 127.0.0.1 that was free a moment ago (nothing listens there until the caller
/// starts something on it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET /readyz`: its status and JSON body.
pub async fn readiness(app: &TestApp) -> (u16, serde_json::Value) {
    let response = app.get_without_token("/readyz").await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("readyz JSON"))
}

/// Waits (up to 10 s) until a Redis server the test started at `url` answers PING.
pub async fn redis_answers(url: &str) -> bool {
    eventually(std::time::Duration::from_secs(10), || async {
        match redis_connection(url).await {
            Ok(mut c) => redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await
}

/// Runs `work(0)` … `work(n - 1)` each on a task of its own, all released at once by one
/// barrier (as many as possible inside the same moment); their results, in order.
pub async fn released_together<T, F, Fut>(n: usize, mut work: F) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, job) = (Arc::clone(&barrier), work(i));
            tokio::spawn(async move {
                barrier.wait().await;
                job.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(n);
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    results
}

/// Eight workers delivering the payments of `orders` round-robin (transaction `T-{order}`,
/// 100 fen) through the test channel, until stopped or, with a `limit`, until it passes.
pub struct Storm {
    stop: Arc<std::sync::atomic::AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<actix_web::http::StatusCode>>>,
}

impl Storm {
    pub fn start(
        app: &Arc<TestApp>,
        orders: &[String],
        limit: Option<std::time::Duration>,
    ) -> Self {
        use crate::support::test_channel::{TestNotification, deliver};
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers = (0..8)
            .map(|worker| {
                let (app, orders, stop) = (Arc::clone(app), orders.to_vec(), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut statuses = Vec::new();
                    let mut i = worker;
                    let started = std::time::Instant::now();
                    // `load` alone would be diesel's (`RunQueryDsl` is in scope here).
                    while !std::sync::atomic::AtomicBool::load(&stop, Ordering::Relaxed)
                        && limit.is_none_or(|limit| started.elapsed() < limit)
                    {
                        let no = &orders[i % orders.len()];
                        statuses.push(
                            deliver(&app, &TestNotification::paid(no, &format!("T-{no}"), 100))
                                .await
                                .0,
                        );
                        i += 1;
                    }
                    statuses
                })
            })
            .collect();
        Self { stop, workers }
    }

    /// Stops every worker; every answer they had.
    pub async fn stop(self) -> Vec<actix_web::http::StatusCode> {
        self.stop.store(true, Ordering::Relaxed);
        let mut statuses = Vec::new();
        for worker in self.workers {
            statuses.extend(worker.await.expect("worker"));
        }
        statuses
    }
}

impl TestApp {
    /// Applies `notice` through the ledger at the app's time; a database error fails the test.
    pub async fn apply(&self, notice: &paynotify::notice::Notice) -> paynotify::notice::Outcome {
        use paynotify::time::Clock;
        self.store
            .apply(notice, self.clock.now())
            .await
            .expect("no database error")
    }

    /// Creates the order of `notice` for its amount, and applies `notice`, its first payment.
    pub async fn create_and_apply(&self, notice: &paynotify::notice::Notice) {
        self.create_order(&notice.out_trade_no, notice.amount_fen)
            .await;
        assert_eq!(
            self.apply(notice).await,
            paynotify::notice::Outcome::Applied,
            "{}",
            notice.out_trade_no
        );
    }

    /// `GET path` as anyone may send it, without the API token.
    pub async fn get_without_token(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// One expiry run now (`jobs::expire_orders`): the orders it closed.
    pub async fn expire_now(&self) -> usize {
        paynotify::jobs::expire_orders(&self.reconciler, self.clock.as_ref())
            .await
            .expect("expiry")
    }
}

/// Every known-answer vector file (`*.json`) of `dir`, by file name, in name order.
pub fn vector_files(dir: &std::path::Path) -> Vec<(String, serde_json::Value)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("vectors")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("?")
                .to_owned();
            (name, read_json(&path))
        })
        .collect()
}
