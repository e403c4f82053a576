//! The ledger alone on MySQL/MariaDB: notices per second at 16 concurrent connections, for
//! first deliveries and for duplicates, next to the same statements as raw SQL transactions
//! (same driver, same server, same run, no ledger logic around them).
//!
//! `cargo bench --bench ledger_mysql` (server at $PAYNOTIFY_BENCH_MYSQL_URL, default
//! mysql://root@127.0.0.1:3306/mysql).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Outcome};
use paynotify::store::Store;
use paynotify::time::{Clock, SystemClock};

const CONCURRENCY: usize = 16;
const ORDERS: usize = 10_000;
const DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn notice(i: usize) -> Notice {
    Notice {
        channel: ChannelId::Wechat,
        kind: NoticeKind::Paid,
        out_trade_no: format!("B{i}"),
        transaction_id: format!("T{i}"),
        amount_fen: 100,
        currency: "CNY".into(),
        merchant: MerchantIds {
            merchant_id: "1900000001".into(),
            app_id: Some("wx0000000000000001".into()),
        },
        merchant_matches: true,
        occurred_at: None,
    }
}

/// Runs `work(i)` for i in `from..from + ORDERS` from CONCURRENCY tasks; returns per second.
async fn rate<F, Fut>(from: usize, work: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (next, work) = (Arc::new(AtomicUsize::new(from)), Arc::new(work));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (next, work) = (next.clone(), work.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= from + ORDERS {
                        break;
                    }
                    work(i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    ORDERS as f64 / started.elapsed().as_secs_f64()
}

/// The ledger's statements as raw SQL, one transaction per notice on a connection of the
/// pool: callback row, order compare-and-set, outbox row (first delivery); callback row
/// refused as a duplicate, then the winner's digest read (duplicate).
async fn raw(pool: Arc<Vec<tokio::sync::Mutex<AsyncMysqlConnection>>>, i: usize, first: bool) {
    let mut conn = pool[i % CONCURRENCY].lock().await;
    let conn = &mut *conn;
    let no = format!("B{i}");
    conn.batch_execute("START TRANSACTION")
        .await
        .expect("begin");
    let inserted = diesel::sql_query(
        "INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) \
         VALUES (?, 'wechat', ?, 100, ?, UTC_TIMESTAMP(6))",
    )
    .bind::<Text, _>(&no)
    .bind::<Text, _>(format!("T{i}"))
    .bind::<Text, _>(DIGEST)
    .execute(conn)
    .await;
    if first {
        inserted.expect("callback row");
        diesel::sql_query(
            "UPDATE orders SET status = 'PAID', channel = 'wechat', transaction_id = ?, \
             paid_at = UTC_TIMESTAMP(6) WHERE order_no = ? AND status = 'WAIT_PAY' \
             AND amount_fen = 100 AND currency = 'CNY'",
        )
        .bind::<Text, _>(format!("T{i}"))
        .bind::<Text, _>(&no)
        .execute(conn)
        .await
        .expect("order");
        diesel::sql_query(
            "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) \
             VALUES ('ORDER_PAID', ?, ?, 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .bind::<Text, _>(&no)
        .bind::<Text, _>(format!(
            r#"{{"order_no":"{no}","channel":"wechat","transaction_id":"T{i}","amount_fen":100,"currency":"CNY"}}"#
        ))
        .execute(conn)
        .await
        .expect("message");
    } else {
        assert!(inserted.is_err(), "a duplicate");
        #[derive(diesel::QueryableByName)]
        struct Seen {
            #[diesel(sql_type = Text)]
            #[allow(dead_code)]
            digest: String,
        }
        let _: Seen = diesel::sql_query(
            "SELECT digest FROM pay_callback WHERE out_trade_no = ? AND channel = 'wechat'",
        )
        .bind::<Text, _>(&no)
        .get_result(conn)
        .await
        .expect("winner");
    }
    conn.batch_execute("COMMIT").await.expect("commit");
}

#[tokio::main]
async fn main() {
    let admin_url = std::env::var("PAYNOTIFY_BENCH_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".into());
    let name = format!("paynotify_bench_{}", std::process::id());
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url.as_str(), |(b, _)| b);
    let url = format!("{base}/{name}");
    let mut admin = AsyncMysqlConnection::establish(&admin_url)
        .await
        .expect("MySQL/MariaDB");
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name} CHARACTER SET utf8mb4"
        ))
        .await
        .expect("create database");
    let store = Store::connect(&DatabaseSettings {
        url: Secret::new(url.clone()),
        pool_size: CONCURRENCY as u32,
        ..DatabaseSettings::default()
    })
    .expect("store");
    store.migrate().await.expect("migrate");

    // Orders B1..B{2N}: the first half for paynotify, the second for raw SQL.
    let mut seed = AsyncMysqlConnection::establish(&url).await.expect("seed");
    for chunk in (1..=2 * ORDERS).collect::<Vec<_>>().chunks(1000) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|g| {
                format!("('B{g}', 'WAIT_PAY', 100, 0, 'CNY', 'bench', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)")
            })
            .collect();
        seed.batch_execute(&format!(
            "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, \
             created_at, expire_at) VALUES {}",
            rows.join(", ")
        ))
        .await
        .expect("seed orders");
    }
    seed.batch_execute("ANALYZE TABLE orders")
        .await
        .expect("analyze");
    let mut connections = Vec::new();
    for _ in 0..CONCURRENCY {
        let mut c = AsyncMysqlConnection::establish(&url)
            .await
            .expect("raw conn");
        c.batch_execute(
            "SET time_zone = '+00:00'; SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )
        .await
        .expect("session");
        connections.push(tokio::sync::Mutex::new(c));
    }
    let pool = Arc::new(connections);

    let apply = |expect: Outcome| {
        let store = store.clone();
        move |i: usize| {
            let store = store.clone();
            async move {
                let outcome = store.apply(&notice(i), SystemClock.now()).await;
                assert_eq!(outcome.ok(), Some(expect), "notice {i}");
            }
        }
    };
    let first = rate(1, apply(Outcome::Applied)).await;
    let raw_first = rate(ORDERS + 1, {
        let pool = pool.clone();
        move |i| raw(pool.clone(), i, true)
    })
    .await;
    let duplicate = rate(1, apply(Outcome::Duplicate)).await;
    let raw_duplicate = rate(ORDERS + 1, {
        let pool = pool.clone();
        move |i| raw(pool.clone(), i, false)
    })
    .await;

    println!("ledger on MySQL/MariaDB, {CONCURRENCY} connections, {ORDERS} notices per phase");
    for (what, ours, raw) in [
        ("first deliveries", first, raw_first),
        ("duplicates", duplicate, raw_duplicate),
    ] {
        println!(
            "{what:<18} paynotify {ours:>8.0}/s   raw SQL {raw:>8.0}/s   ratio {:.2}",
            ours / raw
        );
    }
    drop(store);
    let _ = admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .await;
}
