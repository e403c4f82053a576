//! A deadlock victim is applied again inside the service, never answered 503: a payment whose
//! transaction PostgreSQL chose to undo to break a lock cycle with another transaction.

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::support::helpers::{Backend, spawn_app_with};
use crate::support::test_channel::{TestNotification, deliver};

#[derive(QueryableByName)]
struct Waiting {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Whether a connection of the service waits for a lock in this database now.
async fn service_waits_for_a_lock(c: &mut AsyncPgConnection) -> bool {
    let found: Vec<Waiting> = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'paynotify' AND wait_event_type = 'Lock'",
    )
    .load(c)
    .await
    .expect("pg_stat_activity");
    found.iter().any(|w| w.n > 0)
}

/// Each payment on its own (`group_apply_max = 0`): the one-statement path takes the order's
/// row, then its callback key. Another transaction holding the callback key and then asking
/// for the row closes a cycle; the service, waiting longest, is the victim PostgreSQL undoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_victim_is_applied_again_not_answered_503() {
    let app = spawn_app_with(Backend::Postgres, |s| s.database.group_apply_max = 0).await;
    app.create_order("DL-1", 100).await;
    let mut other = AsyncPgConnection::establish(app.db.url())
        .await
        .expect("connect");
    let mut watcher = AsyncPgConnection::establish(app.db.url())
        .await
        .expect("connect");
    other
        .batch_execute(
            "BEGIN; INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, \
             digest, created_at) VALUES ('DL-1', 'wechat', 'T-OTHER', 100, repeat('0', 64), now())",
        )
        .await
        .expect("the callback key taken");
    let delivery = {
        let (address, client) = (app.address.clone(), app.client.clone());
        let n = TestNotification::paid("DL-1", "T-DL-1", 100);
        tokio::spawn(async move {
            let (body, signature) = n.signed();
            client
                .post(format!("{address}{}", crate::support::test_channel::PATH))
                .header("X-Test-Signature", signature)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !service_waits_for_a_lock(&mut watcher).await {
        assert!(
            Instant::now() < deadline,
            "the service never waited for the key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The cycle: PostgreSQL undoes the service's statement (it waited first), and this
    // transaction gets the row.
    other
        .batch_execute("SELECT order_no FROM orders WHERE order_no = 'DL-1' FOR UPDATE")
        .await
        .expect("the row, once the victim is undone");
    other.batch_execute("ROLLBACK").await.expect("rollback");
    let status = delivery.await.expect("task").expect("answered");
    assert_eq!(status, 204, "applied again, not 503");
    assert_eq!(app.status_of("DL-1").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // Nothing else changed: a repeat is a duplicate.
    let n = TestNotification::paid("DL-1", "T-DL-1", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

crate::on_every_backend!(overlapping_groups_at_once_answer_every_delivery_2xx);

/// Every order delivered three times at once, in three different orders, through group
/// apply: groups that overlap in their orders, twins on the ordinary path beside them, never
/// a 503 (a deadlock among them is applied again), one payment per order.
async fn overlapping_groups_at_once_answer_every_delivery_2xx(backend: Backend) {
    let app = std::sync::Arc::new(spawn_app_with(backend, |_| {}).await);
    let orders: Vec<String> = (0..40).map(|i| format!("DL-G-{i:02}")).collect();
    for no in &orders {
        app.create_order(no, 100).await;
    }
    let mut notices = Vec::new();
    for round in 0..3 {
        let mut these: Vec<&String> = orders.iter().collect();
        match round {
            1 => these.reverse(),
            2 => these.sort_by_key(|no| (no.len(), no.chars().rev().collect::<String>())),
            _ => {}
        }
        notices.extend(
            these
                .into_iter()
                .map(|no| TestNotification::paid(no, &format!("T-{no}"), 100)),
        );
    }
    let statuses = crate::support::helpers::released_together(notices.len(), |i| {
        let (app, n) = (app.clone(), notices[i].clone());
        async move { deliver(&app, &n).await.0 }
    })
    .await;
    let refused: Vec<_> = statuses
        .iter()
        .filter(|s| **s != StatusCode::NO_CONTENT)
        .collect();
    assert!(refused.is_empty(), "not acknowledged: {refused:?}");
    assert_eq!(app.messages("ORDER_PAID").await, orders.len() as i64);
    assert_eq!(
        app.db.count("orders WHERE status = 'PAID'").await,
        orders.len() as i64
    );
}
