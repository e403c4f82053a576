//! The ledger alone on PostgreSQL: notices per second at 16 concurrent connections, for first
//! deliveries and for duplicates, next to pgbench running the same statements as raw SQL on
//! the same database in the same run.
//!
//! `cargo bench --bench ledger` (PostgreSQL at $PAYNOTIFY_BENCH_PG_URL, default
//! postgres://postgres@127.0.0.1:5432/postgres; pgbench on PATH for the raw figures).

mod support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use diesel_async::SimpleAsyncConnection;
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Outcome};
use paynotify::store::Store;
use paynotify::time::{Clock, SystemClock};

const CONCURRENCY: usize = 16;
const ORDERS: usize = 20_000;

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

/// Applies notices 1..=ORDERS from CONCURRENCY tasks; returns notices per second.
async fn run(store: &Store, expect: Outcome) -> f64 {
    let next = Arc::new(AtomicUsize::new(1));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (store, next) = (store.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i > ORDERS {
                        break;
                    }
                    let outcome = store.apply(&notice(i), SystemClock.now()).await;
                    assert_eq!(outcome.ok(), Some(expect), "notice {i}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    ORDERS as f64 / started.elapsed().as_secs_f64()
}

fn pgbench(url: &str, script: &str) -> Option<f64> {
    let output = Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &CONCURRENCY.to_string(),
            "-j",
            "2",
        ])
        .args(["-t", &(ORDERS / CONCURRENCY).to_string()])
        .args(["-D", &format!("norders={ORDERS}"), "-f", script, url])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let database = support::BenchDatabase::create("paynotify_bench").await;
    let url = database.url.clone();
    let settings = DatabaseSettings {
        url: Secret::new(url.clone()),
        pool_size: CONCURRENCY as u32,
        ..DatabaseSettings::default()
    };
    let store = Store::connect(&settings).expect("store");
    store.migrate().await.expect("migrate");
    let mut db = database.connect().await;
    // Orders B1..B{2N}: the first half for paynotify, the second for pgbench.
    db.batch_execute(&format!(
        "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, \
         created_at, expire_at) SELECT 'B' || g, 'WAIT_PAY', 100, 0, 'CNY', 'bench', now(), \
         now() + interval '1 day' FROM generate_series(1, {}) g; \
         CREATE SEQUENCE bench_seq START {}; ANALYZE;",
        2 * ORDERS,
        ORDERS + 1
    ))
    .await
    .expect("seed orders");

    let first = run(&store, Outcome::Applied).await;
    let raw_first = pgbench(&url, "benches/sql/ledger_first.sql");
    let duplicate = run(&store, Outcome::Duplicate).await;
    let raw_duplicate = pgbench(&url, "benches/sql/ledger_duplicate.sql");

    println!("ledger on PostgreSQL, {CONCURRENCY} connections, {ORDERS} notices per phase");
    let row = |what: &str, ours: f64, raw: Option<f64>| match raw {
        Some(raw) => println!(
            "{what:<18} paynotify {ours:>8.0}/s   raw SQL (pgbench) {raw:>8.0}/s   ratio {:.2}",
            ours / raw
        ),
        None => println!("{what:<18} paynotify {ours:>8.0}/s   raw SQL: pgbench not found"),
    };
    row("first deliveries", first, raw_first);
    row("duplicates", duplicate, raw_duplicate);

    drop(db);
    drop(store);
    database.drop().await;
}
