//! A change of database writer (a failover): answers cached before it are not trusted, orders
//! acknowledged shortly before it are checked again through the provider query, and outbox row
//! ids move on past the old writer's. The writer change is simulated
//! (`Writer::simulate_failover`) here; `failover_pg.rs` does it with two real servers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use actix_web::http::StatusCode;
use paynotify::metrics::Metrics;

use crate::support::helpers::{Backend, TestApp, eventually, metric, spawn_app_with};
use crate::support::test_channel::{TestNotification, deliver};

const REDIS: &str = "redis://127.0.0.1:6379";
static PREFIX: AtomicU32 = AtomicU32::new(0);

fn prefix() -> String {
    format!(
        "pn-failover:{}:{}:",
        std::process::id(),
        PREFIX.fetch_add(1, Ordering::Relaxed)
    )
}

/// What an asynchronous standby promoted without the last commit of `order_no` holds: the
/// order waiting, no callback row, no event.
pub(crate) async fn lose_payment(app: &TestApp, order_no: &str) {
    app.db
        .execute(&format!(
            "DELETE FROM pay_callback WHERE out_trade_no = '{order_no}'; \
             DELETE FROM local_message WHERE biz_key = '{order_no}'; \
             UPDATE orders SET status = 'WAIT_PAY', transaction_id = NULL, paid_at = NULL \
             WHERE order_no = '{order_no}'"
        ))
        .await;
}

fn counted(app: &TestApp, outcome: &str) -> u64 {
    metric(app, "paynotify_notifications_total", &["wechat", outcome])
}

crate::on_every_backend!(
    a_repeat_cached_before_a_failover_is_decided_by_the_new_writer,
    an_order_acknowledged_before_a_failover_and_lost_is_paid_again_through_the_query,
    outbox_ids_move_on_past_the_old_writers,
);

async fn a_repeat_cached_before_a_failover_is_decided_by_the_new_writer(backend: Backend) {
    let prefix = prefix();
    let key_prefix = prefix.clone();
    let app = spawn_app_with(backend, move |s| {
        s.redis.url = paynotify::config::Secret::new(REDIS);
        s.redis.key_prefix = key_prefix;
        s.redis.timeout_ms = 1000;
    })
    .await;
    app.create_order("FO-G", 100).await;
    let n = TestNotification::paid("FO-G", "T-FO-G", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(
        counted(&app, "duplicate_cached"),
        1,
        "the gate answers repeats"
    );

    // The commit is lost with the old writer: before anyone notices, the gate still answers
    // from its cache and the order stays unpaid (what a failover without this did).
    lose_payment(&app, "FO-G").await;
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(counted(&app, "duplicate_cached"), 2);
    assert_eq!(app.status_of("FO-G").await, "WAIT_PAY");

    // Noticed: neither Redis nor this instance's memory answers; the new writer's ledger
    // applies the payment.
    let failover = app.store.writer().simulate_failover("gate");
    assert!(failover.is_some(), "a failover");
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(counted(&app, "duplicate_cached"), 2);
    assert_eq!(counted(&app, "applied"), 2);
    assert_eq!(app.status_of("FO-G").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // Answers given by the new writer are cached again.
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(counted(&app, "duplicate_cached"), 3);
    assert_eq!(app.metrics.database_failovers.get(), 1, "counted once");

    // An idempotent POST /orders answer cached before the failover is not trusted either:
    // the order it created is looked for on the new writer.
    let post = || {
        app.client
            .post(app.url("/orders"))
            .bearer_auth(&app.api_token)
            .header("Idempotency-Key", "fo-key")
            .json(&serde_json::json!({ "order_no": "FO-O", "amount_fen": 100 }))
            .send()
    };
    assert_eq!(post().await.expect("post").status(), 201);
    app.db.execute("DELETE FROM idempotency_key").await;
    app.db
        .execute("DELETE FROM orders WHERE order_no = 'FO-O'")
        .await;
    assert_eq!(post().await.expect("post").status(), 201, "from Redis");
    assert_eq!(app.db.count("orders WHERE order_no = 'FO-O'").await, 0);
    app.store.writer().simulate_failover("orders");
    assert_eq!(post().await.expect("post").status(), 201);
    assert_eq!(
        app.db.count("orders WHERE order_no = 'FO-O'").await,
        1,
        "created again on the new writer"
    );
    crate::gate::flush(&prefix).await;
}

async fn an_order_acknowledged_before_a_failover_and_lost_is_paid_again_through_the_query(
    backend: Backend,
) {
    let fake = crate::reconcile::fake().await;
    let url = fake.url.clone();
    let app = spawn_app_with(backend, move |s| crate::reconcile::configure(s, &url)).await;
    // Two orders paid and acknowledged; one of them lost with the old writer.
    for no in ["FO-LOST", "FO-KEPT"] {
        crate::reconcile::create(&app, no, 19900, "wechat").await;
        crate::reconcile::paid_at(&fake, no, 19900, "wechat");
        assert_eq!(
            crate::reconcile::notify_paid(&app, "wechat", no, 19900).await,
            204
        );
    }
    lose_payment(&app, "FO-LOST").await;
    assert!(fake.state.calls().is_empty(), "nobody asked yet");

    app.store.writer().simulate_failover("recheck");
    let recovered = || {
        Metrics::count(&app.metrics.failover_rechecks, &["recovered"])
            + Metrics::count(&app.metrics.failover_rechecks, &["present"])
    };
    assert!(
        eventually(Duration::from_secs(20), || async { recovered() == 2 }).await,
        "both rechecked"
    );
    assert_eq!(app.status_of("FO-LOST").await, "PAID");
    assert_eq!(app.status_of("FO-KEPT").await, "PAID");
    assert_eq!(
        Metrics::count(&app.metrics.failover_rechecks, &["recovered"]),
        1
    );
    assert_eq!(
        Metrics::count(&app.metrics.failover_rechecks, &["present"]),
        1
    );
    // Through the provider query, for the lost one only.
    assert_eq!(fake.state.calls().len(), 1);
    assert_eq!(
        Metrics::count(&app.metrics.payments_recovered, &["wechat"]),
        1
    );
    assert_eq!(app.messages("ORDER_PAID").await, 2);
}

async fn outbox_ids_move_on_past_the_old_writers(backend: Backend) {
    let app = spawn_app_with(backend, |_| {}).await;
    // What identifies the writer: PostgreSQL's cluster and timeline; MariaDB's server id,
    // host and port (it has no server_uuid); SQLite nothing.
    let identity = app.store.writer().identity();
    match backend {
        Backend::Postgres => {
            let id = identity.expect("reported");
            let (cluster, timeline) = id.split_once('/').expect("cluster/timeline");
            assert!(
                cluster.parse::<u64>().is_ok() && timeline.len() == 8,
                "{id}"
            );
        }
        Backend::Mysql => {
            let id = identity.expect("reported");
            assert!(
                (id.contains('@') && id.ends_with(":3306")) || id.len() == 36,
                "{id}"
            );
        }
        Backend::Sqlite => assert_eq!(identity, None),
    }
    app.create_order("FO-ID-1", 100).await;
    let n = TestNotification::paid("FO-ID-1", "T-1", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    let first = app.outbox("ORDER_PAID").await[0].id;
    app.store
        .writer()
        .simulate_failover("ids")
        .expect("a failover");
    // The ids move on before the acknowledged order is rechecked.
    assert!(
        eventually(Duration::from_secs(20), || async {
            Metrics::count(&app.metrics.failover_rechecks, &["present"]) == 1
        })
        .await,
        "rechecked"
    );
    app.create_order("FO-ID-2", 100).await;
    let n = TestNotification::paid("FO-ID-2", "T-2", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    let ids: Vec<i64> = app
        .outbox("ORDER_PAID")
        .await
        .iter()
        .map(|m| m.id)
        .collect();
    let second = ids.iter().copied().max().unwrap_or(0);
    if backend == Backend::Sqlite {
        // One file, no other writer: nothing to move past.
        assert!(second > first && second < first + 1000, "{ids:?}");
    } else {
        assert!(
            second > first + paynotify::store::writer::OUTBOX_ID_JUMP,
            "{first} then {second}"
        );
    }
}
