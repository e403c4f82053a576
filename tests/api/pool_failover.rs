//! Connections across a failover: a `database.url` listing several servers, a server made
//! read-only (demoted, fenced) under a running service, and what `/readyz` says meanwhile.
//! The servers made read-only, stalled or stopped are the test's own (`support/own_db.rs`);
//! the second, writable server is the shared one, with the test's own database.

use std::time::Duration;

use paynotify::config::{Secret, Settings};
use paynotify::store::Store;

use crate::support::helpers::{Backend, TestApp, eventually, free_port, readiness, spawn_app_with};
use crate::support::own_db::{OwnMariadb, OwnPostgres};

/// The database name and `host:port` of a one-host test URL.
fn name_and_host(url: &str) -> (String, String) {
    let rest = url.split_once('@').map_or(url, |(_, r)| r);
    let (host, name) = rest.split_once('/').expect("url has a database");
    (name.to_owned(), host.to_owned())
}

/// `POST /orders` once: its status.
async fn try_create(app: &TestApp, order_no: &str) -> u16 {
    app.client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(&serde_json::json!({
            "order_no": order_no, "amount_fen": 100, "currency": "CNY", "subject": "test"
        }))
        .send()
        .await
        .expect("POST /orders")
        .status()
        .as_u16()
}

/// The migrations on a server the service did not choose (it migrates only the writer).
async fn migrate(url: &str) {
    let mut settings = Settings::default();
    settings.database.url = Secret::new(url);
    let store = Store::connect(&settings.database).expect("store");
    store.migrate().await.expect("migrations");
}

/// `(status, database, database_host)` of `GET /readyz`.
async fn ready(app: &TestApp) -> (u16, String, serde_json::Value) {
    let (status, body) = readiness(app).await;
    let database = body["database"].as_str().unwrap_or_default().to_owned();
    (status, database, body["database_host"].clone())
}

/// MariaDB, two hosts: the first (the test's own) is made read-only under the running
/// service; the next order lands on the second, and `/readyz` names it. (root may write to a
/// read-only MariaDB: only the pool's check keeps the service off it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_leaves_a_server_made_read_only_for_the_next_writable_host() {
    let own = OwnMariadb::start(&[]).await;
    let mut shared = String::new();
    let app = spawn_app_with(Backend::Mysql, |s| {
        shared = s.database.url.expose().to_owned();
        let (name, host) = name_and_host(&shared);
        own.sql(&format!(
            "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        ));
        s.database.url = Secret::new(format!("mysql://root@127.0.0.1:{},{host}/{name}", own.port));
    })
    .await;
    migrate(&shared).await;
    let (name, shared_host) = name_and_host(&shared);
    let own_host = format!("127.0.0.1:{}", own.port);

    assert_eq!(
        ready(&app).await,
        (200, "up".into(), own_host.clone().into())
    );
    app.create_order("MF-1", 100).await;
    assert_eq!(own.count(&name, "orders WHERE order_no = 'MF-1'"), 1);

    own.sql("SET GLOBAL read_only = 1");
    app.create_order("MF-2", 100).await;
    assert_eq!(
        own.count(&name, "orders WHERE order_no = 'MF-2'"),
        0,
        "an order written to the read-only server"
    );
    assert_eq!(app.db.count("orders WHERE order_no = 'MF-2'").await, 1);
    assert_eq!(ready(&app).await, (200, "up".into(), shared_host.into()));
}

/// MariaDB, one host, the service's user without the privilege to write to a read-only
/// server: made read-only, `/readyz` says `failing_over` (503) and a write is a 503 (retry),
/// not a 500; writable again, both recover. The semi-sync gauge is -1 until semi-sync is
/// enabled, then follows `Rpl_semi_sync_master_status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_read_only_server_is_failing_over_and_a_write_is_retried() {
    let own = OwnMariadb::start(&[
        "--log-bin=binlog",
        "--server-id=1",
        "--log-bin-trust-function-creators=1",
    ])
    .await;
    let app = spawn_app_with(Backend::Mysql, |s| {
        own.sql(
            "CREATE DATABASE pay CHARACTER SET utf8mb4 COLLATE utf8mb4_bin; \
             CREATE USER 'app'@'127.0.0.1'; GRANT ALL ON pay.* TO 'app'@'127.0.0.1'",
        );
        s.database.url = Secret::new(own.url("app", "pay"));
    })
    .await;
    let own_host = format!("127.0.0.1:{}", own.port);
    assert_eq!(
        ready(&app).await,
        (200, "up".into(), own_host.clone().into())
    );
    assert_eq!(semi_sync(&app).await, -1);

    own.sql("SET GLOBAL read_only = 1");
    assert_eq!(
        ready(&app).await,
        (503, "failing_over".into(), own_host.clone().into())
    );
    assert_eq!(try_create(&app, "MR-1").await, 503);

    own.sql("SET GLOBAL read_only = 0");
    assert_eq!(ready(&app).await, (200, "up".into(), own_host.into()));
    app.create_order("MR-1", 100).await;

    // Semi-sync on and no replica: the first commit waits out the timeout and the primary
    // falls back to asynchronous replication.
    own.sql(
        "SET GLOBAL rpl_semi_sync_master_timeout = 200; \
         SET GLOBAL rpl_semi_sync_master_enabled = ON",
    );
    assert_eq!(semi_sync(&app).await, 1);
    app.create_order("MR-2", 100).await;
    let fell_back = eventually(Duration::from_secs(5), || async {
        semi_sync(&app).await == 0
    })
    .await;
    assert!(
        fell_back,
        "the gauge did not follow Rpl_semi_sync_master_status"
    );
}

/// `paynotify_database_semi_sync_active` after a scrape.
async fn semi_sync(app: &TestApp) -> i64 {
    let text = app
        .get_without_token("/metrics")
        .await
        .text()
        .await
        .expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix("paynotify_database_semi_sync_active "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the gauge is exported")
}

/// PostgreSQL, two hosts: the first (the test's own) is made read-only under the running
/// service (`default_transaction_read_only`, as a fenced primary); after at most one 503 the
/// service writes to the second and `/readyz` names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leaves_a_server_made_read_only_for_the_next_writable_host() {
    let own = OwnPostgres::start();
    let mut shared = String::new();
    // The shared server's database is a copy of the migrated template; the service
    // migrates the one on its own server (the writer).
    let app = spawn_app_with(Backend::Postgres, |s| {
        shared = s.database.url.expose().to_owned();
        let (name, host) = name_and_host(&shared);
        own.psql("postgres", &format!("CREATE DATABASE {name}"));
        s.database.url = Secret::new(format!(
            "postgres://postgres@127.0.0.1:{},{host}/{name}?target_session_attrs=read-write",
            own.port
        ));
        s.database.pool_size = 4;
    })
    .await;
    let (name, shared_host) = name_and_host(&shared);
    let own_host = format!("127.0.0.1:{}", own.port);

    assert_eq!(
        ready(&app).await,
        (200, "up".into(), own_host.clone().into())
    );
    app.create_order("PF-1", 100).await;
    assert_eq!(own.count(&name, "orders WHERE order_no = 'PF-1'").await, 1);

    own.set_system("default_transaction_read_only", "on").await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let status = try_create(&app, "PF-2").await;
        statuses.push(status);
        if status == 201 {
            break;
        }
    }
    assert!(
        statuses.last() == Some(&201) && statuses.len() <= 2,
        "answers while the first server is read-only: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| [201, 503].contains(s)),
        "{statuses:?}"
    );
    assert_eq!(own.count(&name, "orders WHERE order_no = 'PF-2'").await, 0);
    assert_eq!(ready(&app).await, (200, "up".into(), shared_host.into()));
}

/// PostgreSQL, the test's own server and a second host where nothing listens: read-only, no
/// writer answers (`failing_over`); writable with a synchronous standby that never answers,
/// a commit waits and `/readyz` says `degraded`; stopped, `failing_over` again; all 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_readiness_is_failing_over_then_degraded() {
    let own = OwnPostgres::start();
    own.execute("postgres", "CREATE DATABASE pay").await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/pay?target_session_attrs=read-write",
        own.port,
        free_port()
    );
    let app = spawn_app_with(Backend::Postgres, |s| {
        s.database.url = Secret::new(url.clone());
        s.database.sync_wait_alert_ms = 300;
    })
    .await;
    let own_host = format!("127.0.0.1:{}", own.port);
    assert_eq!(
        ready(&app).await,
        (200, "up".into(), own_host.clone().into())
    );

    own.set_system("default_transaction_read_only", "on").await;
    let (status, database, _) = ready(&app).await;
    assert_eq!((status, database.as_str()), (503, "failing_over"));

    own.set_system("default_transaction_read_only", "off").await;
    assert_eq!(
        ready(&app).await,
        (200, "up".into(), own_host.clone().into())
    );

    own.set_system("synchronous_standby_names", "nobody").await;
    let waiting = {
        let url = own.url("pay");
        tokio::spawn(async move {
            use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
            let mut conn = AsyncPgConnection::establish(&url).await.expect("connect");
            // Waits for a standby that never comes, until the server is stopped.
            let _ = conn
                .batch_execute("CREATE TABLE waits (x int); INSERT INTO waits VALUES (1)")
                .await;
        })
    };
    let degraded = eventually(Duration::from_secs(5), || async {
        ready(&app).await == (503, "degraded".into(), own_host.clone().into())
    })
    .await;
    waiting.abort();
    assert!(degraded, "readyz: {:?}", ready(&app).await);

    // Stopped: neither listed server answers.
    own.stop();
    assert_eq!(
        ready(&app).await,
        (503, "failing_over".into(), serde_json::Value::Null)
    );
}

/// A COMMIT whose answer was lost: the payment's commit waits for a synchronous standby that
/// never answers and its session is terminated (57P01) — committed locally, answer cut off.
/// The provider gets 503 (it retries), never 2xx and never a 500 or a refusal, and it is not
/// counted as a failed statement; the retry, once the standby requirement is lifted, is a
/// duplicate: one callback row, the order paid once, one `ORDER_PAID`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_commit_whose_answer_was_lost_is_a_503_and_the_retry_decides() {
    use crate::support::test_channel::{TestNotification, deliver};

    let own = OwnPostgres::start();
    let app = spawn_app_with(Backend::Postgres, |s| {
        own.psql("postgres", "CREATE DATABASE pay");
        s.database.url = Secret::new(own.url("pay"));
        s.database.statement_timeout_ms = 15_000;
    })
    .await;
    app.create_order("LC-1", 100).await;
    own.set_system("synchronous_standby_names", "nobody").await;

    let notification = TestNotification::paid("LC-1", "T-LC-1", 100);
    // The commit waits; once it does, its session is terminated.
    let cut_off = async {
        let waiting = eventually(Duration::from_secs(5), || async {
            own.count(
                "postgres",
                "pg_stat_activity WHERE wait_event = 'SyncRep' AND datname = 'pay'",
            )
            .await
                == 1
        })
        .await;
        assert!(waiting, "the payment's commit never waited for the standby");
        own.execute(
            "postgres",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        )
        .await;
    };
    let ((status, body), ()) = tokio::join!(deliver(&app, &notification), cut_off);
    assert_eq!(status, 503, "{body}");
    let count = |outcome| {
        crate::support::helpers::metric(&app, "paynotify_notifications_total", &["wechat", outcome])
    };
    assert_eq!(
        count("db_error"),
        0,
        "a lost answer is not a failed statement"
    );
    // Counted `db_unavailable` today (the driver reports a lost connection, not what the
    // server did with the COMMIT); `undecided` would say it better. Either is a 503.
    assert_eq!(count("db_unavailable") + count("undecided"), 1);
    // Committed locally although the answer was lost.
    assert_eq!(own.count("pay", "pay_callback").await, 1);

    own.set_system("synchronous_standby_names", "").await;
    let (status, body) = deliver(&app, &notification).await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(own.count("pay", "pay_callback").await, 1);
    assert_eq!(app.status_of("LC-1").await, "PAID");
    assert_eq!(
        own.count("pay", "local_message WHERE topic = 'ORDER_PAID'")
            .await,
        1
    );
}
