//! The shared notify path over HTTP, through a stand-in channel: status codes, provider-shaped
//! failures, and nothing written for anything unverified.

use std::sync::Arc;

use actix_web::http::StatusCode;

use crate::support::helpers::{Backend, released_together, spawn_app, spawn_app_with};
use crate::support::test_channel::{TestNotification, deliver, paid_order, send_raw, sign};

crate::on_every_backend!(
    first_and_repeated_deliveries_are_acknowledged_alike,
    a_conflict_is_409_in_the_providers_shape,
    an_unverified_notification_writes_nothing,
    an_unknown_order_is_404_so_the_provider_retries,
    an_anomaly_is_acknowledged_so_the_provider_stops,
    an_oversize_body_is_413_in_the_providers_shape,
    twenty_concurrent_http_deliveries_make_one_transition,
    a_notification_whose_caller_hangs_up_is_still_applied_once,
    an_order_whose_caller_hangs_up_is_still_created,
);

async fn first_and_repeated_deliveries_are_acknowledged_alike(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("N-1", 19900).await;
    let n = TestNotification::paid("N-1", "T-1", 19900);
    let first = deliver(&app, &n).await;
    let second = deliver(&app, &n).await;
    assert_eq!(first, (StatusCode::NO_CONTENT, String::new()));
    assert_eq!(second, first);
    assert_eq!(app.status_of("N-1").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn a_conflict_is_409_in_the_providers_shape(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("N-2", 19900).await;
    deliver(&app, &TestNotification::paid("N-2", "T-1", 19900)).await;
    // The same payment (transaction id) with another amount.
    let (status, body) = deliver(&app, &TestNotification::paid("N-2", "T-1", 100)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let body: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["code"], "FAIL");
    assert_eq!(app.get_order("N-2").await["transaction_id"], "T-1");
}

async fn an_unverified_notification_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("N-3", 19900).await;
    let (body, _) = TestNotification::paid("N-3", "T-1", 19900).signed();
    let (status, reply) = send_raw(&app, body.clone(), &sign(b"something else")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{reply}");
    assert!(reply.contains("FAIL"));
    // A valid signature over other bytes, and then the right bytes with one byte changed.
    let tampered = body.replacen("19900", "19901", 1);
    let (status, _) = send_raw(&app, tampered, &sign(body.as_bytes())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Signed garbage is a 400, still nothing written.
    let garbage = "{not json".to_owned();
    let signature = sign(garbage.as_bytes());
    let (status, _) = send_raw(&app, garbage, &signature).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    assert_eq!(app.status_of("N-3").await, "WAIT_PAY");
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
}

async fn an_unknown_order_is_404_so_the_provider_retries(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, body) = deliver(&app, &TestNotification::paid("N-404", "T-1", 1)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("FAIL"));
    assert_eq!(app.db.count("pay_callback").await, 0);
}

async fn an_anomaly_is_acknowledged_so_the_provider_stops(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("N-5", 19900).await;
    let (status, _) = deliver(&app, &TestNotification::paid("N-5", "T-1", 1)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(app.status_of("N-5").await, "WAIT_PAY");
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 1);
}

async fn an_oversize_body_is_413_in_the_providers_shape(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.server.max_body_bytes = 2048).await;
    let body = "x".repeat(4096);
    let signature = sign(body.as_bytes());
    let (status, reply) = send_raw(&app, body, &signature).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let reply: serde_json::Value = serde_json::from_str(&reply).expect("json");
    assert_eq!(reply["code"], "FAIL");
}

async fn twenty_concurrent_http_deliveries_make_one_transition(backend: Backend) {
    let app = Arc::new(spawn_app(backend).await);
    app.create_order("N-20", 19900).await;
    let n = TestNotification::paid("N-20", "T-20", 19900);
    let statuses = released_together(20, |_| {
        let (app, n) = (app.clone(), n.clone());
        async move { deliver(&app, &n).await.0 }
    })
    .await;
    for status in statuses {
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.db.count("pay_callback").await, 1);
}

/// With the database gone, a valid notification is 503 (the provider retries), never a
/// success and never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_is_503_so_the_provider_retries() {
    let app = spawn_app(Backend::Postgres).await;
    app.create_order("N-DOWN", 19900).await;
    app.db.drop_now().await;
    let started = std::time::Instant::now();
    let (status, body) = deliver(&app, &TestNotification::paid("N-DOWN", "T-1", 19900)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("FAIL"));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// Sends `request` on a socket of its own, waits `after`, then resets the connection (linger
/// 0), as a provider that gives up does.
async fn hang_up(
    app: &crate::support::helpers::TestApp,
    request: String,
    after: std::time::Duration,
) {
    use tokio::io::AsyncWriteExt;
    let address = app.address.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    socket
        .write_all(request.as_bytes())
        .await
        .expect("send request");
    tokio::time::sleep(after).await;
    socket.set_zero_linger().expect("linger");
    drop(socket);
}

/// After a hang-up: the service still answers every request, on every pooled connection.
async fn service_still_works(app: &crate::support::helpers::TestApp, prefix: &str) {
    for i in 0..6 {
        paid_order(app, &format!("{prefix}-{i}"), 100).await;
    }
}

/// The provider hangs up while the ledger waits for the database (WeChat gives up after
/// 5 s): the verified notice is still applied, exactly once, and no worker or pooled
/// connection is left broken.
async fn a_notification_whose_caller_hangs_up_is_still_applied_once(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.database.pool_size = 2).await;
    app.create_order("N-HANG", 19900).await;
    let (body, signature) = TestNotification::paid("N-HANG", "T-HANG", 19900).signed();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Test-Signature: {signature}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        crate::support::test_channel::PATH,
        body.len()
    );
    let lock = app
        .db
        .hold_write_lock("N-HANG", std::time::Duration::from_millis(1500))
        .await;
    hang_up(&app, request, std::time::Duration::from_millis(700)).await;
    lock.await.expect("lock released");
    for _ in 0..100 {
        if app.status_of("N-HANG").await == "PAID" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(app.status_of("N-HANG").await, "PAID", "applied to its end");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // The provider's retry is a duplicate.
    let retry = deliver(&app, &TestNotification::paid("N-HANG", "T-HANG", 19900)).await;
    assert_eq!(retry.0, StatusCode::NO_CONTENT);
    service_still_works(&app, "N-AFTER").await;
    assert_eq!(app.messages("ORDER_PAID").await, 7);
}

async fn an_order_whose_caller_hangs_up_is_still_created(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.database.pool_size = 2).await;
    app.create_order("N-LOCKED", 100).await;
    let body = r#"{"order_no":"N-HUNG","amount_fen":100,"currency":"CNY","subject":"s"}"#;
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        app.api_token,
        body.len()
    );
    // PostgreSQL, MySQL: a row lock does not block an insert of another order, so lock the
    // table.
    let lock = match &*app.db {
        crate::support::helpers::TestDb::Postgres { .. }
        | crate::support::helpers::TestDb::Mysql { .. } => {
            app.db
                .hold_table_lock("orders", std::time::Duration::from_millis(1500))
                .await
        }
        crate::support::helpers::TestDb::Sqlite { .. } => {
            app.db
                .hold_write_lock("N-LOCKED", std::time::Duration::from_millis(1500))
                .await
        }
    };
    hang_up(&app, request, std::time::Duration::from_millis(700)).await;
    lock.await.expect("lock released");
    let mut found = false;
    for _ in 0..100 {
        if app.db.count("orders WHERE order_no = 'N-HUNG'").await == 1 {
            found = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(found, "the order was created although its caller left");
    service_still_works(&app, "N-AFTER").await;
}

/// A verified id longer than the providers document is refused at once, never a database
/// error that the provider would retry for a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_longer_than_documented_is_400_and_writes_nothing() {
    let app = spawn_app(Backend::Postgres).await;
    let no = "O".repeat(paynotify::notice::max_len::ORDER_NO + 1);
    let (status, body) = deliver(&app, &TestNotification::paid(&no, "T-1", 100)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("out_trade_no"), "{body}");
    let (status, body) = deliver(&app, &TestNotification::paid("N-L", &"T".repeat(65), 100)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(app.db.count("pay_callback").await, 0);
}

/// A statement that fails on a working database is a 500 (a bug to look at), counted apart
/// from a database that cannot be reached (503); the provider retries both, nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_statement_is_500_and_counted_apart_from_an_unreachable_database() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let app = spawn_app(backend).await;
        app.create_order("N-500", 100).await;
        app.db.execute("DROP TABLE pay_callback").await;
        let (status, body) = deliver(&app, &TestNotification::paid("N-500", "T-1", 100)).await;
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{backend:?}: {body}"
        );
        assert!(
            !body.contains("pay_callback"),
            "the cause is not sent: {body}"
        );
        let count = |outcome| {
            crate::support::helpers::metric(
                &app,
                "paynotify_notifications_total",
                &["wechat", outcome],
            )
        };
        assert_eq!(
            (count("db_error"), count("db_unavailable")),
            (1, 0),
            "{backend:?}"
        );
        assert_eq!(app.status_of("N-500").await, "WAIT_PAY");

        // The database gone: 503.
        app.db.drop_now().await;
        if backend == Backend::Postgres {
            let (status, _) = deliver(&app, &TestNotification::paid("N-500", "T-1", 100)).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(count("db_unavailable"), 1);
        }
    }
}
