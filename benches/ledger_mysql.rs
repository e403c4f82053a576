//! The ledger alone on MariaDB: notices per second at 16 concurrent connections, for first
//! deliveries and for duplicates, next to mariadb-slap running the same statements as raw SQL
//! (benches/sql/ledger_*_mysql.sql) on the same server in the same run.
//!
//! `cargo bench --bench ledger_mysql` (server at $PAYNOTIFY_BENCH_MYSQL_URL, default
//! mysql://root@127.0.0.1:3306/mysql, root without a password for mariadb-slap; MariaDB for
//! its sequences).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Outcome};
use paynotify::store::Store;
use paynotify::time::{Clock, SystemClock};

const CONCURRENCY: usize = 16;
const ORDERS: usize = 10_000;

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

/// The next value of a MariaDB sequence.
async fn next_value(conn: &mut AsyncMysqlConnection, seq: &str) -> Option<i64> {
    #[derive(diesel::QueryableByName)]
    struct Next {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let sql = format!("SELECT NEXTVAL({seq}) AS n");
    diesel::sql_query(sql)
        .get_result::<Next>(conn)
        .await
        .ok()
        .map(|r| r.n)
}

/// The same statements as raw SQL, run by `mariadb-slap` (the server's own load client, as
/// pgbench is for PostgreSQL) from 16 connections, one round trip per statement. Each
/// transaction takes the next order from `seq`; returns transactions per second.
async fn slap(
    conn: &mut AsyncMysqlConnection,
    schema: &str,
    script: &str,
    seq: &str,
) -> Option<f64> {
    let before = next_value(conn, seq).await?;
    let statements = std::fs::read_to_string(script).ok()?.lines().count();
    let output = std::process::Command::new("mariadb-slap")
        .args([
            "-h",
            "127.0.0.1",
            "-u",
            "root",
            "--iterations=1",
            "--delimiter=;",
        ])
        .arg(format!("--create-schema={schema}"))
        .arg(format!("--concurrency={CONCURRENCY}"))
        .arg(format!("--number-of-queries={}", ORDERS * statements))
        .arg("--init-command=SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .arg(format!("--query={script}"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let seconds: f64 = text
        .lines()
        .find(|l| l.contains("Average number of seconds to run all queries"))?
        .split(':')
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let done = next_value(conn, seq).await? - before - 1;
    Some(done as f64 / seconds)
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
    seed.batch_execute(&format!(
        "CREATE SEQUENCE bench_seq START WITH {first}; CREATE SEQUENCE dup_seq START WITH {first}",
        first = ORDERS + 1
    ))
    .await
    .expect("sequences");

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
    let raw_first = slap(
        &mut seed,
        &name,
        "benches/sql/ledger_first_mysql.sql",
        "bench_seq",
    )
    .await;
    let duplicate = rate(1, apply(Outcome::Duplicate)).await;
    let raw_duplicate = slap(
        &mut seed,
        &name,
        "benches/sql/ledger_duplicate_mysql.sql",
        "dup_seq",
    )
    .await;

    println!("ledger on MySQL/MariaDB, {CONCURRENCY} connections, {ORDERS} notices per phase");
    for (what, ours, raw) in [
        ("first deliveries", first, raw_first),
        ("duplicates", duplicate, raw_duplicate),
    ] {
        match raw {
            Some(raw) => println!(
                "{what:<18} paynotify {ours:>8.0}/s   raw SQL (mariadb-slap) {raw:>8.0}/s   ratio {:.2}",
                ours / raw
            ),
            None => println!("{what:<18} paynotify {ours:>8.0}/s   raw SQL: mariadb-slap not run"),
        }
    }
    drop(store);
    let _ = admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .await;
}
