//! The relay's own commits on PostgreSQL do not wait for the WAL flush; a payment's do.
//!
//! On a server of the test's own, every durable commit is made to wait for a synchronous
//! standby that never connects (`synchronous_standby_names`): a statement whose commit waits
//! for the flush never returns, one committed asynchronously returns at once. The relay's
//! claim and its "sent" marks must return; an order written next on the same pooled
//! connection must wait (the setting ends with the relay's statement, never with the
//! connection).

use std::time::Duration;

use paynotify::config::{Secret, Settings};
use paynotify::order::NewOrder;
use paynotify::store::Store;
use paynotify::store::orders::StoredResponse;
use paynotify::time::Timestamp;

use crate::support::own_db::OwnPostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_commits_do_not_wait_for_the_flush_and_an_order_on_its_connection_does() {
    let own = OwnPostgres::start();
    own.psql("postgres", "CREATE DATABASE relay_commit");
    let mut settings = Settings::default();
    settings.database.url = Secret::new(own.url("relay_commit"));
    // One connection: the relay's statements and the order after them share it.
    settings.database.pool_size = 1;
    let store = Store::connect(&settings.database).expect("store");
    store.migrate().await.expect("migrations");
    let now = Timestamp::new(chrono::Utc::now());
    own.execute(
        "relay_commit",
        &format!(
            "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) \
             SELECT 'TEST', 'k' || g, '{{}}', 0, 0, '{0}', '{0}' FROM generate_series(1, 3) g",
            now.as_datetime().to_rfc3339()
        ),
    )
    .await;

    own.set_system("synchronous_standby_names", "nobody").await;
    let quick = Duration::from_secs(10);
    let claimed = tokio::time::timeout(
        quick,
        store.claim_messages("relay-1", now, now.plus_seconds(60), 100),
    )
    .await
    .expect("the claim's commit does not wait for the flush")
    .expect("claim");
    assert_eq!(claimed.len(), 3);
    let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
    let marked = tokio::time::timeout(quick, store.mark_sent("relay-1", &ids, now, now))
        .await
        .expect("the marks' commit does not wait for the flush")
        .expect("mark_sent");
    assert_eq!(marked, 3);

    // An order on the same connection is durable as ever: its commit waits for the standby.
    let order = NewOrder {
        order_no: "RC-1".into(),
        amount_fen: 100,
        currency: "CNY".into(),
        subject: "durable".into(),
        created_at: now,
        expire_at: now.plus_seconds(3600),
        accounts: Vec::new(),
        combine_out_trade_no: None,
    };
    let render = |_: &_| StoredResponse {
        status: 201,
        body: String::new(),
    };
    let waited = tokio::time::timeout(
        Duration::from_secs(2),
        store.create_order(&order, None, render),
    )
    .await;
    assert!(
        waited.is_err(),
        "the order's commit must wait for the flush: {waited:?}"
    );
    // Released: the order's commit goes through, and it is there.
    own.set_system("synchronous_standby_names", "").await;
    assert!(
        crate::support::helpers::eventually(Duration::from_secs(10), || async {
            own.count("relay_commit", "orders WHERE order_no = 'RC-1'")
                .await
                == 1
        })
        .await
    );
    assert_eq!(
        own.count("relay_commit", "local_message WHERE status = 1")
            .await,
        3
    );
}
