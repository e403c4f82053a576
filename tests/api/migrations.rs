//! The migrations on rows already there: migrate up to the one before a change, write rows
//! as the service of that time did, run the rest, and find the rows where the new schema
//! keeps them; then back down and up again.

use diesel::Connection;
use diesel::sqlite::SqliteConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};
use paynotify::receipts::store::ReceiptFilter;
use paynotify::store::{MYSQL_MIGRATIONS, POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS, Store};

use crate::support::helpers::{
    Backend, TestApp, TestDb, named, named_accounts, spawn_app, test_settings,
};
use crate::support::test_channel::TestNotification;
use paynotify::notice::Outcome;
use paynotify::time::Clock;

crate::on_every_backend!(
    accounts_named_in_order_columns_move_to_order_account,
    receipts_stored_before_routes_were_kept_name_no_route,
    rows_written_before_partitions_stay_and_anomalies_keep_their_key,
    keys_differing_by_trailing_spaces_are_different_keys,
);

/// The MySQL migration that made the key columns compare byte for byte.
const KEYS_WITHOUT_PADDING: &str = "2026-12-11-000001_keys_without_padding";

/// The migration that put the outbox and the receipts in day partitions and gave payment
/// anomalies their own table.
const PARTITIONS: &str = "2026-12-08-000001_partitions";

/// The migration that moved `orders.wechat_mchid` / `orders.alipay_app_id` into
/// `order_account`.
const ORDER_ACCOUNT: &str = "2026-12-04-000001_order_account";

/// The migration that added `notify_receipt.route`.
const RECEIPT_ROUTE: &str = "2026-12-05-000002_receipt_route";

#[derive(Clone, Copy)]
enum Step {
    /// Every pending migration, or those before the one named.
    Up(Option<&'static str>),
    /// The last migration applied, reverted.
    RevertLast,
}

/// Takes `step` on one connection; the names of the migrations applied (none for a revert).
fn apply<DB: diesel::backend::Backend>(
    conn: &mut impl MigrationHarness<DB>,
    migrations: EmbeddedMigrations,
    step: Step,
) -> Vec<String> {
    let stop = match step {
        Step::RevertLast => {
            conn.revert_last_migration(migrations).expect("revert");
            return Vec::new();
        }
        Step::Up(stop) => stop,
    };
    let mut applied = Vec::new();
    for migration in conn.pending_migrations(migrations).expect("pending") {
        let name = migration.name().to_string();
        if stop == Some(name.as_str()) {
            break;
        }
        conn.run_migration(migration.as_ref())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        applied.push(name);
    }
    applied
}

/// Takes `step` on `db` with the backend's embedded migrations, as `paynotify migrate` does.
async fn migrate(db: &TestDb, backend: Backend, step: Step) -> Vec<String> {
    let url = db.url().to_owned();
    tokio::task::spawn_blocking(move || match backend {
        Backend::Postgres => {
            let mut conn =
                AsyncConnectionWrapper::<AsyncPgConnection>::establish(&url).expect("connect");
            apply(&mut conn, POSTGRES_MIGRATIONS, step)
        }
        Backend::Mysql => {
            let mut conn =
                AsyncConnectionWrapper::<AsyncMysqlConnection>::establish(&url).expect("connect");
            apply(&mut conn, MYSQL_MIGRATIONS, step)
        }
        Backend::Sqlite => {
            let path = url.trim_start_matches("sqlite://");
            let mut conn = SqliteConnection::establish(path).expect("connect");
            apply(&mut conn, SQLITE_MIGRATIONS, step)
        }
    })
    .await
    .expect("migration task")
}

async fn accounts_named_in_order_columns_move_to_order_account(backend: Backend) {
    let db = TestDb::create_unmigrated(backend).await;
    let before = migrate(&db, backend, Step::Up(Some(ORDER_ACCOUNT))).await;
    assert!(!before.is_empty(), "the migrations before {ORDER_ACCOUNT}");
    db.execute(
        "INSERT INTO orders (order_no, amount_fen, currency, subject, created_at, expire_at, \
         wechat_mchid, alipay_app_id) VALUES \
         ('M-BOTH', 100, 'CNY', 't', '2026-11-30T08:00:00.000000Z', '2026-11-30T09:00:00.000000Z', \
          '1900000001', '2021000000000001'), \
         ('M-WECHAT', 100, 'CNY', 't', '2026-11-30T08:00:00.000000Z', '2026-11-30T09:00:00.000000Z', \
          '1900000002', NULL), \
         ('M-ALIPAY', 100, 'CNY', 't', '2026-11-30T08:00:00.000000Z', '2026-11-30T09:00:00.000000Z', \
          NULL, '2021000000000002'), \
         ('M-NONE', 100, 'CNY', 't', '2026-11-30T08:00:00.000000Z', '2026-11-30T09:00:00.000000Z', \
          NULL, NULL)",
    )
    .await;
    let rest = migrate(&db, backend, Step::Up(None)).await;
    assert_eq!(rest.first().map(String::as_str), Some(ORDER_ACCOUNT));

    assert_eq!(db.count("order_account").await, 4);
    let store = Store::connect(&test_settings(db.url()).database).expect("store");
    assert_eq!(
        named_accounts(&store, "M-BOTH").await,
        [
            named("alipay", "2021000000000001"),
            named("wechat", "1900000001")
        ]
    );
    assert_eq!(
        named_accounts(&store, "M-WECHAT").await,
        [named("wechat", "1900000002")]
    );
    assert_eq!(
        named_accounts(&store, "M-ALIPAY").await,
        [named("alipay", "2021000000000002")]
    );
    assert!(named_accounts(&store, "M-NONE").await.is_empty());
    drop(store);

    // Back down (its ADD COLUMN fails unless up dropped the columns) and up again: each
    // account returns to its column and back.
    for _ in &rest {
        migrate(&db, backend, Step::RevertLast).await;
    }
    for (order_no, mchid, app_id) in [
        ("M-BOTH", "= '1900000001'", "= '2021000000000001'"),
        ("M-WECHAT", "= '1900000002'", "IS NULL"),
        ("M-ALIPAY", "IS NULL", "= '2021000000000002'"),
        ("M-NONE", "IS NULL", "IS NULL"),
    ] {
        let row = format!(
            "orders WHERE order_no = '{order_no}' AND wechat_mchid {mchid} AND alipay_app_id {app_id}"
        );
        assert_eq!(db.count(&row).await, 1, "{row}");
    }
    assert_eq!(migrate(&db, backend, Step::Up(None)).await, rest);
    assert_eq!(db.count("order_account").await, 4);
}

async fn receipts_stored_before_routes_were_kept_name_no_route(backend: Backend) {
    let db = TestDb::create_unmigrated(backend).await;
    migrate(&db, backend, Step::Up(Some(RECEIPT_ROUTE))).await;
    db.execute(
        "INSERT INTO notify_receipt (channel, received_at, headers, body_b64, body_bytes, \
         status, outcome) VALUES \
         ('wechat', '2026-12-04T08:00:00.000000Z', '{}', 'e30=', 2, 401, 'bad_signature')",
    )
    .await;
    let rest = migrate(&db, backend, Step::Up(None)).await;
    assert_eq!(rest.first().map(String::as_str), Some(RECEIPT_ROUTE));

    let store = Store::connect(&test_settings(db.url()).database).expect("store");
    let old = store
        .receipts(&ReceiptFilter {
            limit: 10,
            ..ReceiptFilter::default()
        })
        .await
        .expect("receipts");
    assert_eq!(old.len(), 1);
    assert_eq!(
        (old[0].route.as_deref(), old[0].outcome.as_str()),
        (None, "bad_signature")
    );
    drop(store);

    // Back down and up again (its ADD COLUMN fails unless down dropped the column); the
    // receipt stays.
    for _ in &rest {
        migrate(&db, backend, Step::RevertLast).await;
    }
    assert_eq!(db.count("notify_receipt").await, 1);
    assert_eq!(migrate(&db, backend, Step::Up(None)).await, rest);
    db.execute("UPDATE notify_receipt SET route = '/notify/wechat/pay'")
        .await;
    assert_eq!(
        db.count("notify_receipt WHERE route = '/notify/wechat/pay'")
            .await,
        1
    );
}

async fn rows_written_before_partitions_stay_and_anomalies_keep_their_key(backend: Backend) {
    let db = TestDb::create_unmigrated(backend).await;
    migrate(&db, backend, Step::Up(Some(PARTITIONS))).await;
    db.execute(
        "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at, sent_at) VALUES \
         ('ORDER_PAID', 'MP-1', '{\"order_no\":\"MP-1\"}', 1, 1, '2026-12-05T08:00:00.000000Z', '2026-12-05T08:00:00.000000Z', '2026-12-05T08:00:01.000000Z'), \
         ('PAYMENT_ANOMALY', 'MP-2:wechat:T-2', '{\"order_no\":\"MP-2\",\"reason\":\"AMOUNT_MISMATCH\"}', 0, 0, '2026-12-06T08:00:00.000000Z', '2026-12-06T08:00:00.000000Z', NULL)",
    )
    .await;
    db.execute(
        "INSERT INTO notify_receipt (channel, received_at, headers, body_b64, body_bytes, \
         status, outcome) VALUES \
         ('wechat', '2026-12-04T08:00:00.000000Z', '{}', 'e30=', 2, 401, 'bad_signature')",
    )
    .await;
    let rest = migrate(&db, backend, Step::Up(None)).await;
    assert_eq!(rest.first().map(String::as_str), Some(PARTITIONS));

    assert_eq!(db.count("local_message").await, 2);
    assert_eq!(db.count("notify_receipt").await, 1);
    assert_eq!(
        db.count("payment_anomaly WHERE biz_key = 'MP-2:wechat:T-2' AND order_no = 'MP-2'")
            .await,
        1,
        "the anomaly's key moved to its own table"
    );
    if backend != Backend::Sqlite {
        // The old rows are the partition of everything before the day after the newest.
        let partition = |table: &str, name: &str| match backend {
            Backend::Mysql => format!("{table} PARTITION ({name})"),
            _ => name.to_string(),
        };
        assert_eq!(
            db.count(&partition("local_message", "local_message_before_20261207"))
                .await,
            2
        );
        assert_eq!(
            db.count(&partition(
                "notify_receipt",
                "notify_receipt_before_20261205"
            ))
            .await,
            1
        );
        // New ids continue after the old ones.
        db.execute(
            "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) VALUES \
             ('ORDER_PAID', 'MP-3', '{}', 0, 0, '2026-12-08T08:00:00.000000Z', '2026-12-08T08:00:00.000000Z')",
        )
        .await;
        assert_eq!(
            db.count("local_message WHERE biz_key = 'MP-3' AND id > 2")
                .await,
            1
        );
        assert_eq!(
            db.count(&partition("local_message", "local_message_future"))
                .await,
            1,
            "a day no partition covers yet lands in the future partition"
        );
    }

    // The anomaly's message delivered and gone with its day, as retention does.
    db.execute("DELETE FROM local_message WHERE topic = 'PAYMENT_ANOMALY'")
        .await;
    // Back down and up again: every row stays, and the anomaly's message is back for the old
    // code, which knows a recorded anomaly by it.
    for _ in &rest {
        migrate(&db, backend, Step::RevertLast).await;
    }
    let outbox = db.count("local_message").await;
    assert_eq!(outbox, if backend == Backend::Sqlite { 2 } else { 3 });
    assert_eq!(
        db.count("local_message WHERE topic = 'PAYMENT_ANOMALY' AND biz_key = 'MP-2:wechat:T-2'")
            .await,
        1
    );
    assert_eq!(db.count("notify_receipt").await, 1);
    assert_eq!(migrate(&db, backend, Step::Up(None)).await, rest);
    assert_eq!(db.count("local_message").await, outbox);
    assert_eq!(db.count("payment_anomaly").await, 1);
}

/// An order written as a client's system may name it, past `POST /orders` (which takes no
/// spaces): straight into its table.
async fn order_named(app: &TestApp, order_no: &str, amount_fen: i64) {
    let now = app
        .clock
        .now()
        .as_datetime()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    app.db
        .execute(&format!(
            "INSERT INTO orders (order_no, amount_fen, currency, subject, created_at, expire_at) \
             VALUES ('{order_no}', {amount_fen}, 'CNY', 't', '{now}', '{now}')"
        ))
        .await;
}

/// The order of exactly `order_no` as stored: its status, amount and refunded amount. (Not
/// through `GET /orders/…`: a URL loses its trailing spaces.)
async fn stored(app: &TestApp, order_no: &str) -> (&'static str, i64, i64) {
    let order = app
        .store
        .order(order_no)
        .await
        .expect("read")
        .unwrap_or_else(|| panic!("{order_no:?} is there"));
    assert_eq!(order.order_no, order_no);
    (order.status.as_str(), order.amount_fen, order.refunded_fen)
}

/// Numbers that differ only by trailing spaces are different keys on every backend (MySQL's
/// utf8mb4_bin pads: they were one): two orders, each paid once and refunded under refund
/// numbers that differ so; two anomalies whose transactions differ so; and a payment of a
/// number only here with a space more is an unknown order, which pays nothing.
async fn keys_differing_by_trailing_spaces_are_different_keys(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("SP-1", 100).await;
    order_named(&app, "SP-1 ", 200).await;
    order_named(&app, "SP-1  ", 300).await;
    assert_eq!(app.db.count("orders WHERE order_no LIKE 'SP-1%'").await, 3);
    for (order_no, amount) in [("SP-1", 100), ("SP-1 ", 200), ("SP-1  ", 300)] {
        let paid = TestNotification::paid(order_no, &format!("T-{}", order_no.len()), amount);
        assert_eq!(
            app.apply(&paid.to_notice()).await,
            Outcome::Applied,
            "{order_no:?}"
        );
        assert_eq!(
            app.apply(&paid.to_notice()).await,
            Outcome::Duplicate,
            "{order_no:?}"
        );
        assert_eq!(
            stored(&app, order_no).await,
            ("PAID", amount, 0),
            "{order_no:?}"
        );
    }
    assert_eq!(app.db.count("pay_callback").await, 3);
    assert_eq!(app.messages("ORDER_PAID").await, 3);

    // Two refunds of one order, numbered 'R-1' and 'R-1 ': each counted once.
    for (out_refund_no, fen) in [("R-1", 10), ("R-1 ", 20)] {
        let mut refund = TestNotification::paid("SP-1", "T-4", 100);
        refund.kind = "refunded".into();
        refund.refund = Some((out_refund_no.into(), format!("RF-{fen}"), fen));
        assert_eq!(
            app.apply(&refund.to_notice()).await,
            Outcome::Applied,
            "{out_refund_no:?}"
        );
        assert_eq!(
            app.apply(&refund.to_notice()).await,
            Outcome::Duplicate,
            "{out_refund_no:?}"
        );
    }
    assert_eq!(stored(&app, "SP-1").await, ("PAID", 100, 30));
    assert_eq!(stored(&app, "SP-1 ").await, ("PAID", 200, 0));

    // Two more payments of one order under transactions 'T-X' and 'T-X ': two anomalies.
    for transaction_id in ["T-X", "T-X "] {
        let again = TestNotification::paid("SP-1 ", transaction_id, 200);
        assert!(
            matches!(app.apply(&again.to_notice()).await, Outcome::Anomaly(_)),
            "{transaction_id:?}"
        );
    }
    assert_eq!(app.db.count("payment_anomaly").await, 2);

    // Only 'SP-2' is here: a payment of 'SP-2 ' finds no order.
    app.create_order("SP-2", 100).await;
    let other = TestNotification::paid("SP-2 ", "T-SP-2", 100);
    assert_eq!(app.apply(&other.to_notice()).await, Outcome::UnknownOrder);
    assert_eq!(stored(&app, "SP-2").await, ("WAIT_PAY", 100, 0));
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no LIKE 'SP-2%'")
            .await,
        0
    );
}

/// MySQL: rows written before the key columns compared bytes read back the same after it,
/// and down and up again keep them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keys_written_before_they_compared_bytes_read_back_alike() {
    let backend = Backend::Mysql;
    let db = TestDb::create_unmigrated(backend).await;
    migrate(&db, backend, Step::Up(Some(KEYS_WITHOUT_PADDING))).await;
    db.execute(
        "INSERT INTO orders (order_no, amount_fen, currency, subject, created_at, expire_at) VALUES \
         ('K-ORDER-1', 100, 'CNY', 't', '2026-12-10T08:00:00.000000Z', '2026-12-10T09:00:00.000000Z')",
    )
    .await;
    db.execute(
        "INSERT INTO payment_anomaly (biz_key, order_no, payload, created_at) VALUES \
         ('K-ORDER-1:wechat:T-1', 'K-ORDER-1', '{\"reason\":\"AMOUNT_MISMATCH\"}', '2026-12-10T08:00:00.000000Z')",
    )
    .await;
    let rest = migrate(&db, backend, Step::Up(None)).await;
    assert_eq!(rest.first().map(String::as_str), Some(KEYS_WITHOUT_PADDING));
    let store = Store::connect(&test_settings(db.url()).database).expect("store");
    let order = store
        .order("K-ORDER-1")
        .await
        .expect("read")
        .expect("the order is found by its number");
    assert_eq!(order.order_no, "K-ORDER-1");
    assert_eq!(db.count("orders WHERE order_no = 'K-ORDER-1 '").await, 0);
    assert_eq!(
        db.count("payment_anomaly WHERE order_no = 'K-ORDER-1'")
            .await,
        1
    );
    drop(store);
    for _ in &rest {
        migrate(&db, backend, Step::RevertLast).await;
    }
    assert_eq!(db.count("orders WHERE order_no = 'K-ORDER-1'").await, 1);
    assert_eq!(migrate(&db, backend, Step::Up(None)).await, rest);
    assert_eq!(db.count("orders WHERE order_no = 'K-ORDER-1'").await, 1);
}
