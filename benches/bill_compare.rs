//! The database side of a daily bill of 1,000,000 payments on PostgreSQL: its rows streamed
//! into `bill_line` in the run's batches, then the three set-based statements that find the
//! differences, on a ledger of 1,000,000 payments that day and 1,000,000 the day before
//! (analysed). Ten payments differ in amount, ten are missing here, ten missing at the
//! provider: the statements must return exactly those.
//!
//! `cargo bench --bench bill_compare` (PostgreSQL at $PAYNOTIFY_BENCH_PG_URL, default
//! postgres://postgres@127.0.0.1:5432/postgres).

mod support;

use std::time::Instant;

use diesel_async::SimpleAsyncConnection;
use paynotify::bills::store::Scope;
use paynotify::channel::bill::{BillLine, LineKind};
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::notice::ChannelId;
use paynotify::store::Store;
use paynotify::time::Timestamp;

const ROWS: usize = 1_000_000;
/// Rows per insert statement, as `Bills::read` sends them.
const BATCH: usize = 1000;
const DATE: &str = "2026-11-30";

fn at(text: &str) -> Timestamp {
    Timestamp::new(
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("time")
            .with_timezone(&chrono::Utc),
    )
}

/// Bill row `i`: the ledger's payment `B{i}` of 100 fen, but for the planted differences.
fn line(i: usize) -> BillLine {
    BillLine {
        kind: LineKind::Payment,
        // Ten the ledger does not have: B{ROWS+1}..B{ROWS+10}, in place of B1..B10.
        out_trade_no: if i <= 10 {
            format!("B{}", ROWS + i)
        } else {
            format!("B{i}")
        },
        transaction_id: format!("T{i}"),
        out_refund_no: None,
        // Ten with another amount.
        amount_fen: if (11..=20).contains(&i) { 99 } else { 100 },
        fee_milli_fen: 600,
        status: "SUCCESS".into(),
        at: None,
    }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let database = support::BenchDatabase::create("paynotify_bench_bills").await;
        let settings = DatabaseSettings {
            url: Secret::new(database.url.clone()),
            pool_size: 4,
            ..DatabaseSettings::default()
        };
        let store = Store::connect(&settings).expect("store");
        store.migrate().await.expect("migrate");
        let mut db = database.connect().await;
        let seeded = Instant::now();
        // The day (Beijing 2026-11-30 is 11-29T16:00Z .. 11-30T16:00Z) and the day before.
        db.batch_execute(&format!(
            "INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) \
             SELECT 'B' || g, 'wechat', 'T' || g, 100, 'd', timestamptz '2026-11-29 17:00:00+00' + (g % 50000) * interval '1 second' \
             FROM generate_series(1, {ROWS}) g; \
             INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) \
             SELECT 'H' || g, 'wechat', 'TH' || g, 100, 'd', timestamptz '2026-11-28 17:00:00+00' + (g % 50000) * interval '1 second' \
             FROM generate_series(1, {ROWS}) g;"
        ))
        .await
        .expect("seed");
        db.batch_execute("VACUUM ANALYZE pay_callback")
            .await
            .expect("analyze");
        println!(
            "seeded {} ledger payments in {:.1} s (not measured)",
            2 * ROWS,
            seeded.elapsed().as_secs_f64()
        );

        let started = Instant::now();
        let mut batch = Vec::with_capacity(BATCH);
        for i in 1..=ROWS {
            batch.push(line(i));
            if batch.len() == BATCH {
                store
                    .insert_bill_lines(DATE, ChannelId::Wechat, "1900000001", &batch)
                    .await
                    .expect("insert")
                    .expect("no duplicate");
                batch.clear();
            }
        }
        let inserted = started.elapsed();
        db.batch_execute("ANALYZE bill_line").await.expect("analyze");
        let covers = ["1900000001".to_owned()];
        let scope = Scope {
            date: DATE,
            channel: ChannelId::Wechat,
            account: "1900000001",
            covers: &covers,
            unnamed: true,
            start: at("2026-11-29T16:00:00Z"),
            end: at("2026-11-30T16:00:00Z"),
        };
        let compared = Instant::now();
        let differences = store
            .bill_differences(&scope, LineKind::Payment, paynotify::bills::MAX_DIFFERENCES)
            .await
            .expect("differences");
        let after_differences = compared.elapsed();
        let ours_only = store
            .ours_only(&scope, LineKind::Payment, paynotify::bills::MAX_DIFFERENCES)
            .await
            .expect("ours only");
        let after_ours = compared.elapsed();
        let totals = store.ours_totals(&scope).await.expect("totals");
        let after_totals = compared.elapsed();
        assert_eq!(differences.len(), 20, "10 missing here, 10 amounts");
        assert_eq!(ours_only.len(), 10, "B1..B10");
        assert_eq!(totals.count, ROWS as i64);
        println!(
            "{ROWS} bill rows inserted in {:.1} s ({:.0} rows/s, {BATCH} per statement)",
            inserted.as_secs_f64(),
            ROWS as f64 / inserted.as_secs_f64()
        );
        println!(
            "compared: differences {:.2} s, ours only {:.2} s, totals {:.2} s; {} + {} differences found",
            after_differences.as_secs_f64(),
            (after_ours - after_differences).as_secs_f64(),
            (after_totals - after_ours).as_secs_f64(),
            differences.len(),
            ours_only.len()
        );
        drop(db);
        database.drop().await;
    });
}
