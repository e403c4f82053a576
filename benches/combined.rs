//! A combined payment (合单支付) of 50 sub-orders against 50 single payment notices, through
//! `Store::apply`, on PostgreSQL and SQLite: per iteration, (a) the first delivery of one
//! combined notice for a fresh combination, (b) a duplicate of that notice, (c) 50 single
//! notices for 50 fresh orders one after another, (d) those 50 again as duplicates. The
//! combinations and orders are created outside the timed part; the databases start empty.
//!
//! `cargo bench --bench combined -- --warm-up-time 1 --measurement-time 5` (PostgreSQL at
//! $PAYNOTIFY_BENCH_PG_URL, default postgres://postgres@127.0.0.1:5432/postgres; SQLite in a
//! temporary file).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use paynotify::combined::{CombinedRow, Created, NewCombination};
use paynotify::config::{DatabaseSettings, Secret};
use paynotify::notice::{
    ChannelId, Combination, MerchantIds, Notice, NoticeKind, Outcome, SubPayment,
};
use paynotify::order::NewOrder;
use paynotify::store::Store;
use paynotify::store::orders::{CreateOutcome, CreateResult, StoredResponse};
use paynotify::time::{Clock, SystemClock};
use tokio::runtime::Runtime;

const SUBS: usize = 50;
const MCHID: &str = "1900000001";
const APPID: &str = "wx0000000000000001";

static NEXT: AtomicUsize = AtomicUsize::new(1);

fn merchant() -> MerchantIds {
    MerchantIds {
        merchant_id: MCHID.into(),
        app_id: Some(APPID.into()),
    }
}

fn new_order(no: String, combination: Option<&str>) -> NewOrder {
    let now = SystemClock.now();
    NewOrder {
        order_no: no,
        amount_fen: 100,
        currency: "CNY".into(),
        subject: "bench".into(),
        created_at: now,
        expire_at: now.plus_seconds(86_400),
        accounts: Vec::new(),
        combine_out_trade_no: combination.map(str::to_owned),
    }
}

/// Creates a fresh combination of SUBS sub-orders; returns its combined payment notice.
async fn fresh_combination(store: &Store) -> Notice {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let no = format!("C{n}");
    let subs: Vec<NewOrder> = (0..SUBS)
        .map(|k| new_order(format!("C{n}S{k:02}"), Some(&no)))
        .collect();
    let now = SystemClock.now();
    let nos: Vec<&str> = subs.iter().map(|s| s.order_no.as_str()).collect();
    let new = NewCombination {
        row: CombinedRow {
            combine_out_trade_no: no.clone(),
            channel: ChannelId::Wechat.as_str().into(),
            account: MCHID.into(),
            amount_fen: 100 * SUBS as i64,
            sub_order_count: SUBS as i32,
            sub_orders: serde_json::to_string(&nos).expect("json"),
            request_digest: format!("bench-{n}"),
            created_at: now,
            expire_at: now.plus_seconds(86_400),
        },
        subs: subs.clone(),
    };
    let created = store.create_combination(&new, Ok(())).await;
    assert!(
        matches!(created, Ok(Created::Fresh(_))),
        "combination {no}: {created:?}"
    );
    Notice {
        channel: ChannelId::Wechat,
        kind: NoticeKind::Combined(Box::new(Combination {
            subs: subs
                .iter()
                .map(|s| SubPayment {
                    out_trade_no: s.order_no.clone(),
                    transaction_id: format!("T{}", s.order_no),
                    amount_fen: 100,
                    currency: "CNY".into(),
                    mchid: MCHID.into(),
                    trade_state: "SUCCESS".into(),
                    occurred_at: None,
                })
                .collect(),
        })),
        out_trade_no: no,
        transaction_id: String::new(),
        amount_fen: 100 * SUBS as i64,
        currency: "CNY".into(),
        merchant: merchant(),
        merchant_matches: true,
        occurred_at: None,
    }
}

/// Creates SUBS fresh ordinary orders; returns one payment notice for each.
async fn fresh_singles(store: &Store) -> Vec<Notice> {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut notices = Vec::with_capacity(SUBS);
    for k in 0..SUBS {
        let no = format!("P{n}S{k:02}");
        let created = store
            .create_order(&new_order(no.clone(), None), None, |o| StoredResponse {
                status: if matches!(o, CreateOutcome::Created(_)) {
                    201
                } else {
                    409
                },
                body: String::new(),
            })
            .await;
        assert!(
            matches!(&created, Ok(CreateResult::Fresh(r)) if r.status == 201),
            "order {no}: {created:?}"
        );
        notices.push(Notice {
            channel: ChannelId::Wechat,
            kind: NoticeKind::Paid,
            transaction_id: format!("T{no}"),
            out_trade_no: no,
            amount_fen: 100,
            currency: "CNY".into(),
            merchant: merchant(),
            merchant_matches: true,
            occurred_at: None,
        });
    }
    notices
}

async fn apply(store: &Store, notice: &Notice, expect: Outcome) {
    let outcome = store.apply(notice, SystemClock.now()).await;
    assert_eq!(outcome.ok(), Some(expect), "{}", notice.out_trade_no);
}

/// Times `iters` rounds of `timed` on inputs made by `setup` outside the timed part.
fn timed_rounds<I, S, SF, T, TF>(rt: &Runtime, iters: u64, setup: S, timed: T) -> Duration
where
    S: Fn() -> SF,
    SF: Future<Output = I>,
    T: Fn(I) -> TF,
    TF: Future<Output = ()>,
{
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let input = rt.block_on(setup());
        let started = Instant::now();
        rt.block_on(timed(input));
        total += started.elapsed();
    }
    total
}

fn backend(c: &mut Criterion, rt: &Runtime, name: &str, store: &Store) {
    let mut group = c.benchmark_group(format!("combined_{name}"));
    group.sample_size(10);
    group.bench_function(BenchmarkId::new("combined_50", "first"), |b| {
        b.iter_custom(|iters| {
            timed_rounds(
                rt,
                iters,
                || fresh_combination(store),
                |n| async move { apply(store, &n, Outcome::Applied).await },
            )
        })
    });
    group.bench_function(BenchmarkId::new("combined_50", "duplicate"), |b| {
        b.iter_custom(|iters| {
            timed_rounds(
                rt,
                iters,
                || async {
                    let n = fresh_combination(store).await;
                    apply(store, &n, Outcome::Applied).await;
                    n
                },
                |n| async move { apply(store, &n, Outcome::Duplicate).await },
            )
        })
    });
    group.bench_function(BenchmarkId::new("singles_50", "first"), |b| {
        b.iter_custom(|iters| {
            timed_rounds(
                rt,
                iters,
                || fresh_singles(store),
                |ns| async move {
                    for n in &ns {
                        apply(store, n, Outcome::Applied).await;
                    }
                },
            )
        })
    });
    group.bench_function(BenchmarkId::new("singles_50", "duplicate"), |b| {
        b.iter_custom(|iters| {
            timed_rounds(
                rt,
                iters,
                || async {
                    let ns = fresh_singles(store).await;
                    for n in &ns {
                        apply(store, n, Outcome::Applied).await;
                    }
                    ns
                },
                |ns| async move {
                    for n in &ns {
                        apply(store, n, Outcome::Duplicate).await;
                    }
                },
            )
        })
    });
    group.finish();
}

fn store_at(rt: &Runtime, url: String) -> Store {
    let settings = DatabaseSettings {
        url: Secret::new(url),
        pool_size: 4,
        ..DatabaseSettings::default()
    };
    let store = Store::connect(&settings).expect("store");
    rt.block_on(store.migrate()).expect("migrate");
    store
}

fn postgres(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let database = rt.block_on(support::BenchDatabase::create("paynotify_bench_combined"));
    let store = store_at(&rt, database.url.clone());
    backend(c, &rt, "postgres", &store);
    drop(store);
    rt.block_on(database.drop());
}

fn sqlite(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let path = std::env::temp_dir().join(format!(
        "paynotify_bench_combined_{}.db",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let store = store_at(&rt, format!("sqlite://{}", path.display()));
    backend(c, &rt, "sqlite", &store);
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

criterion_group!(benches, postgres, sqlite);
criterion_main!(benches);
