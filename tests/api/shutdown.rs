//! `paynotify serve`'s shutdown: the HTTP server stops first, then the jobs; the relay gives
//! back every lease it holds, on both backends, whatever runtime opened the pool's
//! connections.

use std::time::Duration;

use paynotify::config::Secret;

use crate::support::helpers::{Backend, TestApp, spawn_app_with_jobs};

/// An HTTP receiver that accepts connections and never answers: a relay batch sent to it
/// stays in flight (the sink waits 10 s) while the test shuts down.
async fn silent_receiver() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/events", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..64 {
            match listener.accept().await {
                Ok((socket, _)) => held.push(socket),
                Err(_) => return,
            }
        }
    });
    (url, task)
}

async fn leases_held(app: &TestApp) -> i64 {
    app.db
        .count("local_message WHERE locked_by IS NOT NULL OR locked_until IS NOT NULL")
        .await
}

crate::on_every_backend!(
    shutdown_releases_the_leases_of_a_batch_in_flight_after_workers_used_the_pool,
);

async fn shutdown_releases_the_leases_of_a_batch_in_flight_after_workers_used_the_pool(
    backend: Backend,
) {
    // Several rounds: each ends with one release on whichever pooled connection is next.
    for round in 0..3 {
        let (url, receiver) = silent_receiver().await;
        let mut app = spawn_app_with_jobs(backend, |s| {
            s.relay.sink = paynotify::config::SinkKind::Http;
            s.relay.http_url = url;
            s.relay.http_secret = Secret::new("s");
            s.relay.interval_ms = 50;
        })
        .await;
        // HTTP workers check out pooled connections from their own runtimes; those
        // runtimes end before the relay releases its leases.
        app.use_pool_from_a_worker_runtime(8);
        // Closing an order writes its ORDER_CLOSED message, which the relay then claims.
        app.create_order(&format!("SD{round}"), 100).await;
        let closed = app
            .client
            .post(app.url(&format!("/orders/SD{round}/close")))
            .bearer_auth(&app.api_token)
            .send()
            .await
            .expect("close");
        assert_eq!(closed.status(), 200, "round {round}: the order closes");
        let mut claimed = 0;
        for _ in 0..200 {
            claimed = leases_held(&app).await;
            if claimed > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(claimed > 0, "round {round}: the relay claimed the message");
        app.shutdown(Duration::from_millis(200)).await;
        assert_eq!(
            leases_held(&app).await,
            0,
            "round {round}: every lease released at shutdown"
        );
        receiver.abort();
    }
}
