//! The shared notify path over HTTP, through a stand-in channel: status codes, provider-shaped
//! failures, and nothing written for anything unverified.

use std::sync::Arc;

use actix_web::http::StatusCode;
use tokio::sync::Barrier;

use crate::helpers::{Backend, spawn_app, spawn_app_with};
use crate::test_channel::{TestNotification, deliver, send_raw, sign};

crate::on_both_backends!(
    first_and_repeated_deliveries_are_acknowledged_alike,
    a_conflict_is_409_in_the_providers_shape,
    an_unverified_notification_writes_nothing,
    an_unknown_order_is_404_so_the_provider_retries,
    an_anomaly_is_acknowledged_so_the_provider_stops,
    an_oversize_body_is_413_in_the_providers_shape,
    twenty_concurrent_http_deliveries_make_one_transition,
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
    let (status, body) = deliver(&app, &TestNotification::paid("N-2", "T-2", 19900)).await;
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
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (app, n, barrier) = (app.clone(), n.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                deliver(&app, &n).await.0
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task"), StatusCode::NO_CONTENT);
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
