//! Liveness, readiness, and what happens when the database is gone or saturated.

use std::time::{Duration, Instant};

use crate::support::helpers::{Backend, TestApp, readiness, spawn_app, spawn_app_with};

crate::on_every_backend!(ready_when_the_database_answers);

/// The status of `GET /healthz`.
async fn liveness(app: &TestApp) -> u16 {
    app.get_without_token("/healthz").await.status().as_u16()
}

async fn ready_when_the_database_answers(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(liveness(&app).await, 200);
    let (status, body) = readiness(&app).await;
    assert_eq!(status, 200);
    // The server in use, as the test URL names it (`…@127.0.0.1:5432/db`); none for SQLite.
    let host = match backend {
        Backend::Sqlite => serde_json::Value::Null,
        _ => {
            let url = app.db.url();
            let rest = url.split_once('@').map_or(url, |(_, r)| r);
            rest.split('/').next().unwrap_or_default().into()
        }
    };
    assert_eq!(
        body,
        serde_json::json!({
            "status": "ready", "database": "up", "database_host": host,
            "redis": "disabled", "sink": "up"
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unready_when_the_database_is_gone() {
    let app = spawn_app(Backend::Postgres).await;
    app.db.drop_now().await;
    let (status, body) = readiness(&app).await;
    assert_eq!(status, 503);
    assert_eq!(body["status"], "unready");
    assert_eq!(body["database"], "down");
    assert_eq!(
        liveness(&app).await,
        200,
        "liveness does not depend on the database"
    );
}

/// One connection, held by a request stuck behind a table lock: the next request gets a
/// quick 503 instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_is_a_quick_503_not_a_hang() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

    let app = spawn_app_with(Backend::Postgres, |s| {
        s.database.pool_size = 1;
        s.database.acquire_timeout_ms = 300;
        s.database.statement_timeout_ms = 3000;
    })
    .await;
    app.create_order("H-1", 100).await;

    let mut locker = AsyncPgConnection::establish(app.db.url())
        .await
        .expect("connect");
    locker
        .batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");

    let stuck = {
        let (client, url) = (app.client.clone(), app.url("/orders/H-1"));
        tokio::spawn(async move {
            client
                .get(url)
                .bearer_auth(crate::support::helpers::API_TOKEN)
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let second = app
        .client
        .get(app.url("/orders/H-1"))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("request");
    assert_eq!(second.status(), 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The stuck request ends by the statement timeout, also as 503, and the pool recovers.
    let stuck = stuck.await.expect("task").expect("response");
    assert_eq!(stuck.status(), 503);
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    assert_eq!(app.status_of("H-1").await, "WAIT_PAY");
}
