//! The hot statements keep their primary-key plans whatever PostgreSQL's statistics say
//! (docs/design.md, "Plans that do not depend on statistics"). Two cases that broke them:
//!
//! - an empty, never-analysed database growing under a burst: a plan made while the tables
//!   were tiny (a sequential scan is the cheapest way to read one page) is kept by every
//!   pooled connection's prepared statements while the tables grow;
//! - history analysed while no order was waiting (a quiet night), then a sale: the partial
//!   `WAIT_PAY` indexes look empty, so reading one whole looked cheaper than a primary-key
//!   lookup per notice.
//!
//! Each burst goes through the store as the service runs it (grouped first deliveries, then
//! every notice again as a duplicate), and `pg_stat_user_tables` says what was read.

use std::collections::HashMap;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use paynotify::notice::Outcome;
use paynotify::time::Clock;

use crate::support::helpers::{Backend, TestApp, TestDb, spawn_app};
use crate::support::test_channel::TestNotification;

/// The tables the notify path reads and writes.
const HOT: [&str; 3] = ["orders", "pay_callback", "local_message"];
/// Notices applied at once (the service's requests in flight).
const IN_FLIGHT: usize = 64;

#[derive(QueryableByName, Debug, Clone, Copy, Default)]
struct Reads {
    #[diesel(sql_type = BigInt)]
    seq_scan: i64,
    #[diesel(sql_type = BigInt)]
    seq_tup_read: i64,
    #[diesel(sql_type = BigInt)]
    idx_tup_fetch: i64,
    #[diesel(sql_type = BigInt)]
    n_tup_ins: i64,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    relname: String,
    #[diesel(embed)]
    reads: Reads,
}

fn pg_url(db: &TestDb) -> String {
    match db {
        TestDb::Postgres { url, .. } => url.clone(),
        _ => unreachable!("a PostgreSQL test"),
    }
}

async fn table_reads(url: &str) -> HashMap<String, Reads> {
    let mut c = AsyncPgConnection::establish(url).await.expect("connect");
    // A partition's reads count as its table's (the outbox is partitioned by day).
    let query = diesel::sql_query(
        "SELECT COALESCE(p.relname, s.relname)::text AS relname, \
         sum(COALESCE(s.seq_scan, 0))::bigint AS seq_scan, \
         sum(COALESCE(s.seq_tup_read, 0))::bigint AS seq_tup_read, \
         sum(COALESCE(s.idx_tup_fetch, 0))::bigint AS idx_tup_fetch, \
         sum(s.n_tup_ins)::bigint AS n_tup_ins \
         FROM pg_stat_user_tables s \
         LEFT JOIN pg_inherits i ON i.inhrelid = s.relid \
         LEFT JOIN pg_class p ON p.oid = i.inhparent \
         GROUP BY 1",
    );
    let rows: Vec<Row> = diesel_async::RunQueryDsl::load(query, &mut c)
        .await
        .expect("pg_stat_user_tables");
    rows.into_iter().map(|r| (r.relname, r.reads)).collect()
}

/// Resets the statistics once the start-up's own reads have reported: creating the day
/// partitions reads the (empty) future partition sequentially, and a pooled connection
/// reports that when it is next used or idle for 10 s, which would count it as the burst's.
async fn reset_after_start_up(app: &TestApp) {
    let url = pg_url(&app.db);
    let start = std::time::Instant::now();
    while table_reads(&url)
        .await
        .get("local_message")
        .map_or(0, |r| r.seq_scan)
        == 0
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the start-up's partition work never reported"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    app.db.execute("SELECT pg_stat_reset()").await;
}

/// `orders` waiting for payment, `WO{first}`…, written in one statement.
async fn waiting_orders(db: &TestDb, first: usize, n: usize) {
    db.execute(&format!(
        "INSERT INTO orders (order_no, amount_fen, currency, subject, created_at, expire_at) \
         SELECT 'WO' || g, 19900, 'CNY', 'test', now(), now() + interval '1 day' \
         FROM generate_series({first}, {last}) g",
        last = first + n - 1
    ))
    .await;
}

/// Pays `WO{first}`…`WO{first + n - 1}` through the store, `IN_FLIGHT` at a time (so
/// first deliveries are grouped as under load), then applies every notice again (each one a
/// duplicate).
async fn pay_all(app: &TestApp, first: usize, n: usize) {
    for duplicates in [false, true] {
        let orders: Vec<usize> = (first..first + n).collect();
        for chunk in orders.chunks(IN_FLIGHT) {
            let tasks: Vec<_> = chunk
                .iter()
                .map(|i| {
                    let notice = TestNotification::paid(&format!("WO{i}"), &format!("T{i}"), 19900)
                        .to_notice();
                    let (store, now) = (app.store.clone(), app.clock.now());
                    tokio::spawn(async move { store.apply(&notice, now).await })
                })
                .collect();
            for task in tasks {
                let outcome = task.await.expect("task").expect("applied");
                let expected = if duplicates {
                    Outcome::Duplicate
                } else {
                    Outcome::Applied
                };
                assert_eq!(outcome, expected);
            }
        }
    }
}

/// The reads of the hot tables since `pg_stat_reset()`, once every connection of the
/// service reported them (a backend reports at its exit, so the service is stopped first).
async fn reads_after(app: TestApp, paid: i64) -> (std::sync::Arc<TestDb>, HashMap<String, Reads>) {
    let db = app.db.clone();
    let url = pg_url(&db);
    drop(app);
    let start = std::time::Instant::now();
    loop {
        let reads = table_reads(&url).await;
        let inserted = reads.get("pay_callback").map_or(0, |r| r.n_tup_ins);
        if inserted == paid {
            // Every backend that wrote a callback has reported; give the last ones a moment.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            return (db, table_reads(&url).await);
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the service's connections reported {inserted} of {paid} callback rows"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn show(reads: &HashMap<String, Reads>) {
    for table in HOT {
        println!("{table}: {:?}", reads.get(table));
    }
}

/// An empty database that was never analysed, paid into: no hot table is read by a
/// sequential scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_an_empty_database_reads_no_hot_table_sequentially() {
    const N: usize = 2_000;
    let app = spawn_app(Backend::Postgres).await;
    waiting_orders(&app.db, 0, N).await;
    reset_after_start_up(&app).await;
    pay_all(&app, 0, N).await;
    let (_db, reads) = reads_after(app, N as i64).await;
    show(&reads);
    // The outbox's partitions reported too (its reads are summed over them): one message per
    // payment.
    assert_eq!(
        reads.get("local_message").map(|r| r.n_tup_ins),
        Some(N as i64),
        "{reads:?}"
    );
    for table in HOT {
        let r = reads.get(table).copied().unwrap_or_default();
        assert_eq!(
            (r.seq_scan, r.seq_tup_read),
            (0, 0),
            "{table} read sequentially: {r:?}"
        );
    }
}

/// History analysed while no order waited, then a sale's orders: each notice reads a few
/// index entries per table, not the partial `WAIT_PAY` indexes whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_quiet_night_analysed_each_notice_reads_a_few_index_entries() {
    const HISTORY: usize = 100_000;
    const N: usize = 3_000;
    let app = spawn_app(Backend::Postgres).await;
    app.db
        .execute(&format!(
            "INSERT INTO orders (order_no, status, amount_fen, currency, subject, channel, \
               transaction_id, created_at, paid_at, expire_at) \
             SELECT 'H' || g, 'PAID', 19900, 'CNY', 'history', 'wechat', 'TH' || g, \
               now() - interval '2 days', now() - interval '2 days', now() - interval '1 day' \
             FROM generate_series(1, {HISTORY}) g; \
             INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) \
             SELECT 'H' || g, 'wechat', 'TH' || g, 19900, repeat('0', 64), now() - interval '2 days' \
             FROM generate_series(1, {HISTORY}) g; \
             INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at, sent_at) \
             SELECT 'ORDER_PAID', 'H' || g, '{{}}', 1, 1, now() - interval '2 days', now() - interval '2 days', now() - interval '2 days' \
             FROM generate_series(1, {HISTORY}) g; \
             ANALYZE orders; ANALYZE pay_callback; ANALYZE local_message;"
        ))
        .await;
    // The sale: thousands of waiting orders the statistics do not know of.
    waiting_orders(&app.db, 0, N).await;
    reset_after_start_up(&app).await;
    pay_all(&app, 0, N).await;
    let (_db, reads) = reads_after(app, N as i64).await;
    show(&reads);
    // The outbox's partitions reported too (its reads are summed over them): one message per
    // payment.
    assert_eq!(
        reads.get("local_message").map(|r| r.n_tup_ins),
        Some(N as i64),
        "{reads:?}"
    );
    // Each notice is applied twice (first delivery, duplicate); a primary-key plan fetches
    // a handful of rows per table for each.
    let bound = 4 * N as i64;
    for table in HOT {
        let r = reads.get(table).copied().unwrap_or_default();
        assert_eq!(r.seq_scan, 0, "{table} read sequentially: {r:?}");
        assert!(
            r.idx_tup_fetch <= bound,
            "{table}: {} index tuples fetched for {N} notices applied twice: {r:?}",
            r.idx_tup_fetch
        );
    }
}

/// A duplicate of a paid order locks nothing: it is answered at once while a refund (here,
/// any transaction) holds the order row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_is_answered_while_another_transaction_holds_the_paid_order() {
    use diesel_async::SimpleAsyncConnection;
    let app = spawn_app(Backend::Postgres).await;
    waiting_orders(&app.db, 0, 1).await;
    let notice = TestNotification::paid("WO0", "T0", 19900).to_notice();
    let outcome = app.store.apply(&notice, app.clock.now()).await;
    assert_eq!(outcome.expect("applied"), Outcome::Applied);
    let mut holder = AsyncPgConnection::establish(&pg_url(&app.db))
        .await
        .expect("connect");
    holder
        .batch_execute("BEGIN; SELECT order_no FROM orders WHERE order_no = 'WO0' FOR UPDATE")
        .await
        .expect("hold the order");
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        app.store.apply(&notice, app.clock.now()),
    )
    .await
    .expect("answered without waiting for the order's lock");
    assert_eq!(again.expect("a duplicate"), Outcome::Duplicate);
    holder.batch_execute("ROLLBACK").await.expect("rollback");
}
