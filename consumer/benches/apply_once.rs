//! `apply_once` on PostgreSQL against the same transaction written by hand.
//!
//! `cargo bench -p paynotify-consumer --bench apply_once` (PostgreSQL at
//! $PAYNOTIFY_BENCH_PG_URL, default postgres://postgres@127.0.0.1:5432/postgres; psql on
//! PATH). It creates a database of its own (dropped at the end), the inbox table and a
//! `stock` row, then on one connection, one new message id per iteration:
//!
//! - `by hand`: `BEGIN; INSERT INTO processed_message … ON CONFLICT DO NOTHING; UPDATE stock
//!   SET on_hand = on_hand - 1 WHERE sku = …; COMMIT` through diesel-async's `transaction`
//!   with `sql_query`;
//! - `apply_once ()`: the same UPDATE inside `apply_once`, returning `()`;
//! - `apply_once result`: the same, returning a small struct (one more UPDATE to store it).
//!
//! The three run in alternating rounds so that none is always measured on a warmer or a
//! busier machine; at the end the mean time per iteration of each and the ratios are
//! printed, and stock arithmetic is checked in SQL (one decrement per inbox row).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use diesel::sql_types::{BigInt, Text, Timestamp};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify_consumer::{apply_once, inbox};
use serde::{Deserialize, Serialize};

const ROUNDS: usize = 3;
const STOCK: i64 = 1_000_000_000;

fn server() -> String {
    std::env::var("PAYNOTIFY_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The bench's own database, dropped when this is, whatever happened.
struct Database {
    name: String,
    url: String,
}

impl Database {
    fn create() -> Self {
        let name = format!("pnc_bench_apply_once_{}", std::process::id());
        let server = server();
        let status = Command::new("psql")
            .args([&server, "-qc", &format!("CREATE DATABASE {name}")])
            .status()
            .expect("psql must be installed");
        assert!(status.success(), "CREATE DATABASE {name}");
        let base = server.rsplit_once('/').map(|(b, _)| b).unwrap_or(&server);
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &server(),
                "-qc",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .status();
    }
}

#[derive(Serialize, Deserialize)]
struct Reserved {
    sku: String,
    left: i64,
}

#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn decrement(tx: &mut AsyncPgConnection) -> diesel::QueryResult<usize> {
    diesel::sql_query("UPDATE stock SET on_hand = on_hand - 1 WHERE sku = $1")
        .bind::<Text, _>("A")
        .execute(tx)
        .await
}

struct Bench {
    rt: tokio::runtime::Runtime,
    conn: RefCell<AsyncPgConnection>,
    next: RefCell<u64>,
    /// Per variant: total time and iterations measured (warm-up included).
    totals: RefCell<BTreeMap<&'static str, (Duration, u64)>>,
}

impl Bench {
    fn id(&self) -> String {
        let mut next = self.next.borrow_mut();
        *next += 1;
        format!("ORDER_PAID:B{next}")
    }

    fn record(&self, variant: &'static str, elapsed: Duration, iters: u64) {
        let mut totals = self.totals.borrow_mut();
        let entry = totals.entry(variant).or_default();
        entry.0 += elapsed;
        entry.1 += iters;
    }

    fn by_hand(&self, iters: u64) -> Duration {
        let conn = &mut *self.conn.borrow_mut();
        let ids: Vec<String> = (0..iters).map(|_| self.id()).collect();
        let elapsed = self.rt.block_on(async {
            let started = Instant::now();
            for id in &ids {
                let now = chrono::Utc::now().naive_utc();
                conn.transaction::<_, diesel::result::Error, _>(async |tx| {
                    diesel::sql_query(
                        "INSERT INTO processed_message (consumer, message_id, processed_at) \
                         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    )
                    .bind::<Text, _>("bench")
                    .bind::<Text, _>(id.as_str())
                    .bind::<Timestamp, _>(now)
                    .execute(tx)
                    .await?;
                    decrement(tx).await?;
                    Ok(())
                })
                .await
                .expect("by hand");
            }
            started.elapsed()
        });
        self.record("by hand", elapsed, iters);
        elapsed
    }

    fn apply_unit(&self, iters: u64) -> Duration {
        let conn = &mut *self.conn.borrow_mut();
        let ids: Vec<String> = (0..iters).map(|_| self.id()).collect();
        let elapsed = self.rt.block_on(async {
            let started = Instant::now();
            for id in &ids {
                let outcome =
                    apply_once(conn, "bench", id, async |tx| decrement(tx).await.map(drop))
                        .await
                        .expect("apply_once");
                assert!(!outcome.is_duplicate());
            }
            started.elapsed()
        });
        self.record("apply_once ()", elapsed, iters);
        elapsed
    }

    fn apply_result(&self, iters: u64) -> Duration {
        let conn = &mut *self.conn.borrow_mut();
        let ids: Vec<String> = (0..iters).map(|_| self.id()).collect();
        let elapsed = self.rt.block_on(async {
            let started = Instant::now();
            for id in &ids {
                let outcome = apply_once(conn, "bench", id, async |tx| {
                    let n = decrement(tx).await?;
                    Ok::<_, diesel::result::Error>(Reserved {
                        sku: "A".to_owned(),
                        left: n as i64,
                    })
                })
                .await
                .expect("apply_once");
                assert!(!outcome.is_duplicate());
            }
            started.elapsed()
        });
        self.record("apply_once result", elapsed, iters);
        elapsed
    }
}

fn apply_once_vs_by_hand(c: &mut Criterion) {
    let db = Database::create();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let conn = rt.block_on(async {
        let mut conn = AsyncPgConnection::establish(&db.url)
            .await
            .expect("connect to the bench database");
        inbox::create_table(&mut conn).await.expect("inbox table");
        conn.batch_execute(&format!(
            "CREATE TABLE stock (sku TEXT PRIMARY KEY, on_hand BIGINT NOT NULL); \
             INSERT INTO stock VALUES ('A', {STOCK});"
        ))
        .await
        .expect("stock");
        conn
    });
    let bench = Bench {
        rt,
        conn: RefCell::new(conn),
        next: RefCell::new(0),
        totals: RefCell::new(BTreeMap::new()),
    };

    let mut group = c.benchmark_group("inbox on PostgreSQL");
    for round in 1..=ROUNDS {
        group.bench_function(format!("by hand/{round}"), |b| {
            b.iter_custom(|iters| bench.by_hand(iters))
        });
        group.bench_function(format!("apply_once ()/{round}"), |b| {
            b.iter_custom(|iters| bench.apply_unit(iters))
        });
        group.bench_function(format!("apply_once result/{round}"), |b| {
            b.iter_custom(|iters| bench.apply_result(iters))
        });
    }
    group.finish();

    let totals = bench.totals.borrow();
    let per_iter = |variant: &str| {
        let (time, iters) = totals[variant];
        time.as_secs_f64() / iters as f64
    };
    let hand = per_iter("by hand");
    println!("\nmean over every iteration run (warm-up included):");
    for (variant, (time, iters)) in totals.iter() {
        let mean = time.as_secs_f64() / *iters as f64;
        println!(
            "  {variant:<18} {iters:>7} iterations, {:>8.1} µs each, {:>7.0}/s, throughput vs by hand {:.3}",
            mean * 1e6,
            1.0 / mean,
            hand / mean
        );
    }

    // Exactly once, in SQL: one decrement per inbox row.
    let conn = &mut *bench.conn.borrow_mut();
    let (rows, on_hand) = bench.rt.block_on(async {
        let rows: Vec<Row> = diesel::sql_query("SELECT COUNT(*) AS n FROM processed_message")
            .load(conn)
            .await
            .expect("count");
        let stock: Vec<Row> = diesel::sql_query("SELECT on_hand AS n FROM stock")
            .load(conn)
            .await
            .expect("stock");
        (rows[0].n, stock[0].n)
    });
    assert_eq!(STOCK - on_hand, rows, "one decrement per inbox row");
    assert_eq!(
        rows as u64,
        *bench.next.borrow(),
        "one inbox row per message"
    );
    println!("  checked: {rows} messages, {rows} inbox rows, stock down by {rows}");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = apply_once_vs_by_hand
}
criterion_main!(benches);
