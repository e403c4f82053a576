//! The inbox on PostgreSQL, MySQL/MariaDB (under READ COMMITTED and REPEATABLE READ) and
//! SQLite. Every test body is generic over the backend and runs once per backend; what the
//! handler did is checked in SQL, in an `effect` table without a unique key (a second run
//! of a handler would add a second row).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::QueryResult;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify_consumer::inbox::{self, DEFAULT_WINDOW, InboxConnection};
use paynotify_consumer::{InboxError, Outcome, apply_once};
use serde::{Deserialize, Serialize};
use support::{MysqlDb, PgDb, Sqlite, SqliteDb};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// A database of the test's own on one backend, and connections to it.
trait Backend: Send + Sync + Sized + 'static {
    type Conn: Raw;
    fn create() -> Self;
    fn connect(&self) -> impl Future<Output = Self::Conn> + Send;
}

impl Backend for PgDb {
    type Conn = AsyncPgConnection;
    fn create() -> Self {
        PgDb::create()
    }
    async fn connect(&self) -> AsyncPgConnection {
        PgDb::connect(self).await
    }
}

/// MySQL/MariaDB with every connection under READ COMMITTED.
struct MysqlReadCommitted(MysqlDb);
/// PostgreSQL with every connection under REPEATABLE READ: a concurrent insert of the same
/// key is a serialization failure (40001) there, which `apply_once` retries.
struct PgRepeatableRead(PgDb);

impl Backend for PgRepeatableRead {
    type Conn = AsyncPgConnection;
    fn create() -> Self {
        Self(PgDb::create())
    }
    async fn connect(&self) -> AsyncPgConnection {
        let mut conn = self.0.connect().await;
        conn.batch_execute(
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        )
        .await
        .expect("isolation level");
        conn
    }
}
/// MySQL/MariaDB with every connection under REPEATABLE READ (InnoDB's default).
struct MysqlRepeatableRead(MysqlDb);

async fn mysql_connect(db: &MysqlDb, level: &str) -> AsyncMysqlConnection {
    let mut conn = db.connect().await;
    conn.batch_execute(&format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"))
        .await
        .expect("isolation level");
    conn
}

impl Backend for MysqlReadCommitted {
    type Conn = AsyncMysqlConnection;
    fn create() -> Self {
        Self(MysqlDb::create())
    }
    async fn connect(&self) -> AsyncMysqlConnection {
        mysql_connect(&self.0, "READ COMMITTED").await
    }
}

impl Backend for MysqlRepeatableRead {
    type Conn = AsyncMysqlConnection;
    fn create() -> Self {
        Self(MysqlDb::create())
    }
    async fn connect(&self) -> AsyncMysqlConnection {
        mysql_connect(&self.0, "REPEATABLE READ").await
    }
}

impl Backend for SqliteDb {
    type Conn = Sqlite;
    fn create() -> Self {
        SqliteDb::create()
    }
    async fn connect(&self) -> Sqlite {
        SqliteDb::connect(self).await
    }
}

/// Runs `$body::<Backend>()` once per backend, each in a test of its own.
macro_rules! on_every_backend {
    ($($body:ident),* $(,)?) => {$(
        mod $body {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$body::<PgDb>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres_repeatable_read() {
                super::$body::<PgRepeatableRead>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mysql_read_committed() {
                super::$body::<MysqlReadCommitted>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mysql_repeatable_read() {
                super::$body::<MysqlRepeatableRead>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$body::<SqliteDb>().await;
            }
        }
    )*};
}

on_every_backend!(
    second_delivery_returns_the_first_result,
    concurrent_redeliveries_run_the_handler_once,
    concurrent_redeliveries_after_a_failed_first_run,
    handler_error_rolls_everything_back,
    database_error_in_the_handler_rolls_everything_back,
    struct_result_is_returned_by_the_duplicate,
    unit_result_stores_nothing,
    stored_result_of_another_type_is_a_decode_error,
    too_long_names_write_nothing,
    consumers_are_independent_and_ids_exact,
    purge_removes_only_old_rows_of_that_consumer,
    create_table_twice,
    a_connection_left_in_a_transaction_is_refused,
);

/// Escapes a test value for a string literal (no binds: placeholders differ by backend).
fn lit(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Raw SQL on a connection of any backend (diesel's `sql_query` needs the concrete one).
trait Raw: InboxConnection {
    fn exec_raw(&mut self, sql: String) -> impl Future<Output = QueryResult<usize>> + Send;
    fn count_raw(&mut self, sql: String) -> impl Future<Output = QueryResult<Vec<Count>>> + Send;
}

macro_rules! raw {
    ($($conn:ty),*) => {$(
        impl Raw for $conn {
            async fn exec_raw(&mut self, sql: String) -> QueryResult<usize> {
                diesel::sql_query(sql).execute(self).await
            }
            async fn count_raw(&mut self, sql: String) -> QueryResult<Vec<Count>> {
                diesel::sql_query(sql).load(self).await
            }
        }
    )*};
}

raw!(AsyncPgConnection, AsyncMysqlConnection, Sqlite);

async fn exec<C: Raw>(conn: &mut C, sql: &str) -> QueryResult<usize> {
    conn.exec_raw(sql.to_owned()).await
}

async fn count<C: Raw>(conn: &mut C, sql: &str) -> i64 {
    let rows = conn
        .count_raw(sql.to_owned())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter().next().map(|row| row.n).expect("one row")
}

/// The inbox table and an effect table whose rows a handler adds.
async fn setup<C: Raw>(conn: &mut C) {
    inbox::create_table(conn).await.expect("inbox table");
    conn.batch_execute(
        "CREATE TABLE effect (consumer VARCHAR(100) NOT NULL, message_id VARCHAR(400) NOT NULL)",
    )
    .await
    .expect("effect table");
}

/// The handler's side effect: one row in `effect`.
async fn effect<C: Raw>(tx: &mut C, consumer: &str, message_id: &str) -> QueryResult<usize> {
    exec(
        tx,
        &format!(
            "INSERT INTO effect (consumer, message_id) VALUES ({}, {})",
            lit(consumer),
            lit(message_id)
        ),
    )
    .await
}

async fn effects<C: Raw>(conn: &mut C, consumer: &str, message_id: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT COUNT(*) AS n FROM effect WHERE consumer = {} AND message_id = {}",
            lit(consumer),
            lit(message_id)
        ),
    )
    .await
}

async fn inbox_rows<C: Raw>(conn: &mut C, consumer: &str, message_id: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT COUNT(*) AS n FROM processed_message WHERE consumer = {} AND message_id = {}",
            lit(consumer),
            lit(message_id)
        ),
    )
    .await
}

async fn all_inbox_rows<C: Raw>(conn: &mut C) -> i64 {
    count(conn, "SELECT COUNT(*) AS n FROM processed_message").await
}

/// The first delivery runs the handler; the second returns its stored result unrun.
async fn second_delivery_returns_the_first_result<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let first = apply_once(conn, "inventory", "ORDER_PAID:O1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:O1").await?;
        Ok::<_, diesel::result::Error>(41)
    })
    .await
    .expect("first");
    assert_eq!(first, Outcome::Applied(41));
    let second = apply_once(conn, "inventory", "ORDER_PAID:O1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:O1").await?;
        Ok::<_, diesel::result::Error>(-1)
    })
    .await
    .expect("second");
    assert_eq!(second, Outcome::Duplicate(41));
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:O1").await, 1);
    assert_eq!(inbox_rows(conn, "inventory", "ORDER_PAID:O1").await, 1);
    assert!(
        inbox::seen(conn, "inventory", "ORDER_PAID:O1")
            .await
            .expect("seen")
    );
    assert!(
        !inbox::seen(conn, "billing", "ORDER_PAID:O1")
            .await
            .expect("seen")
    );
}

/// Connections delivering every message at once.
const DELIVERIES: usize = 10;
/// Messages delivered that way, one after another.
const ROUNDS: usize = 15;

/// `DELIVERIES` connections deliver each of `ROUNDS` messages at the same moment (a
/// barrier per message); the handler sleeps inside its transaction so the deliveries
/// overlap. When `fail_first` is set, the first handler to run for a message fails after
/// its sleep (while the others wait on its row). Returns every delivery's outcome per
/// message, in no particular order.
async fn deliver_concurrently<B: Backend>(
    db: &B,
    fail_first: bool,
) -> Vec<Vec<Result<Outcome<String>, InboxError<String>>>> {
    let barrier = Arc::new(Barrier::new(DELIVERIES));
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = JoinSet::new();
    for _ in 0..DELIVERIES {
        let mut conn = db.connect().await;
        let barrier = barrier.clone();
        let runs = runs.clone();
        tasks.spawn(async move {
            let mut outcomes = Vec::new();
            for round in 0..ROUNDS {
                let id = format!("ORDER_PAID:C{round}");
                barrier.wait().await;
                let runs = &runs[round];
                let outcome = apply_once(&mut conn, "inventory", &id, async |tx| {
                    let run = runs.fetch_add(1, Ordering::SeqCst);
                    effect(tx, "inventory", &id)
                        .await
                        .map_err(|e| e.to_string())?;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    if fail_first && run == 0 {
                        return Err("the first run fails".to_owned());
                    }
                    Ok(format!("reserved for {id} by run {run}"))
                })
                .await;
                outcomes.push(outcome);
            }
            outcomes
        });
    }
    let mut per_round: Vec<Vec<_>> = (0..ROUNDS).map(|_| Vec::new()).collect();
    let deadline = Duration::from_secs(120);
    let all = tokio::time::timeout(deadline, tasks.join_all())
        .await
        .expect("the deliveries finish in time");
    for outcomes in all {
        for (round, outcome) in outcomes.into_iter().enumerate() {
            per_round[round].push(outcome);
        }
    }
    per_round
}

/// Concurrent redeliveries of one message: the handler runs once, one delivery is
/// `Applied`, every other one `Duplicate` with the same stored result.
async fn concurrent_redeliveries_run_the_handler_once<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let per_round = deliver_concurrently(&db, false).await;
    for (round, outcomes) in per_round.into_iter().enumerate() {
        let id = format!("ORDER_PAID:C{round}");
        let expected = format!("reserved for {id} by run 0");
        let mut applied = 0;
        for outcome in outcomes {
            match outcome {
                Ok(Outcome::Applied(v)) => {
                    applied += 1;
                    assert_eq!(v, expected);
                }
                Ok(Outcome::Duplicate(v)) => assert_eq!(v, expected, "{id}"),
                Err(e) => panic!("{id}: {e}"),
            }
        }
        assert_eq!(applied, 1, "{id}: exactly one delivery applied");
        assert_eq!(effects(conn, "inventory", &id).await, 1, "{id}: one effect");
        assert_eq!(inbox_rows(conn, "inventory", &id).await, 1, "{id}");
    }
    assert_eq!(all_inbox_rows(conn).await, ROUNDS as i64);
}

/// The first run of each message fails while the other deliveries wait on its row (on
/// InnoDB the classic deadlock among the waiters, retried inside `apply_once`): exactly one
/// delivery fails with the handler's error, one applies, the rest are duplicates of it, and
/// only the applied run's effect remains.
async fn concurrent_redeliveries_after_a_failed_first_run<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let per_round = deliver_concurrently(&db, true).await;
    for (round, outcomes) in per_round.into_iter().enumerate() {
        let id = format!("ORDER_PAID:C{round}");
        let (mut applied, mut failed) = (Vec::new(), 0);
        let mut duplicates = Vec::new();
        for outcome in outcomes {
            match outcome {
                Ok(Outcome::Applied(v)) => applied.push(v),
                Ok(Outcome::Duplicate(v)) => duplicates.push(v),
                Err(InboxError::Handler(e)) => {
                    assert_eq!(e, "the first run fails");
                    failed += 1;
                }
                Err(e) => panic!("{id}: {e}"),
            }
        }
        assert_eq!(failed, 1, "{id}: the first run failed");
        assert_eq!(applied.len(), 1, "{id}: exactly one delivery applied");
        assert_eq!(applied[0], format!("reserved for {id} by run 1"));
        assert_eq!(duplicates.len(), DELIVERIES - 2);
        assert!(duplicates.iter().all(|v| *v == applied[0]), "{id}");
        assert_eq!(effects(conn, "inventory", &id).await, 1, "{id}: one effect");
        assert_eq!(inbox_rows(conn, "inventory", &id).await, 1, "{id}");
    }
}

/// A handler error leaves neither the inbox row nor an effect; the next delivery runs the
/// handler and applies.
async fn handler_error_rolls_everything_back<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let failed = apply_once(conn, "inventory", "ORDER_PAID:E1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:E1")
            .await
            .map_err(|e| e.to_string())?;
        Err::<u32, _>("out of stock".to_owned())
    })
    .await;
    assert!(
        matches!(&failed, Err(InboxError::Handler(e)) if e == "out of stock"),
        "{failed:?}"
    );
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:E1").await, 0);
    assert_eq!(inbox_rows(conn, "inventory", "ORDER_PAID:E1").await, 0);
    assert!(
        !inbox::seen(conn, "inventory", "ORDER_PAID:E1")
            .await
            .expect("seen")
    );
    let next = apply_once(conn, "inventory", "ORDER_PAID:E1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:E1")
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(7u32)
    })
    .await
    .expect("the next delivery");
    assert_eq!(next, Outcome::Applied(7));
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:E1").await, 1);
    assert_eq!(inbox_rows(conn, "inventory", "ORDER_PAID:E1").await, 1);
}

/// A statement of the handler that the database refuses, after one that succeeded: both
/// roll back with the row, and the next delivery applies.
async fn database_error_in_the_handler_rolls_everything_back<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let failed = apply_once(conn, "inventory", "ORDER_PAID:D1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:D1").await?;
        exec(tx, "INSERT INTO no_such_table (x) VALUES (1)").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await;
    assert!(
        matches!(
            failed,
            Err(InboxError::Handler(diesel::result::Error::DatabaseError(
                ..
            )))
        ),
        "{failed:?}"
    );
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:D1").await, 0);
    assert_eq!(inbox_rows(conn, "inventory", "ORDER_PAID:D1").await, 0);
    let next = apply_once(conn, "inventory", "ORDER_PAID:D1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:D1").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await
    .expect("the next delivery");
    assert_eq!(next, Outcome::Applied(()));
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:D1").await, 1);
    assert_eq!(inbox_rows(conn, "inventory", "ORDER_PAID:D1").await, 1);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Reservation {
    sku: String,
    left: i64,
    note: Option<String>,
}

/// A struct result is stored and returned as such by a duplicate.
async fn struct_result_is_returned_by_the_duplicate<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let reserved = Reservation {
        sku: "SKU-é'\"".to_owned(),
        left: 9,
        note: Some("first run".to_owned()),
    };
    let first = apply_once(conn, "inventory", "ORDER_PAID:S1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:S1").await?;
        Ok::<_, diesel::result::Error>(reserved.clone())
    })
    .await
    .expect("first");
    assert_eq!(first, Outcome::Applied(reserved.clone()));
    let second = apply_once(conn, "inventory", "ORDER_PAID:S1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:S1").await?;
        Ok::<_, diesel::result::Error>(Reservation {
            sku: "other".to_owned(),
            left: 0,
            note: None,
        })
    })
    .await
    .expect("second");
    assert_eq!(second, Outcome::Duplicate(reserved));
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:S1").await, 1);
}

/// A `()` result leaves the `result` column NULL and a duplicate returns `()`.
async fn unit_result_stores_nothing<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    for expected in [Outcome::Applied(()), Outcome::Duplicate(())] {
        let outcome = apply_once(conn, "inventory", "ORDER_PAID:U1", async |tx| {
            effect(tx, "inventory", "ORDER_PAID:U1").await?;
            Ok::<_, diesel::result::Error>(())
        })
        .await
        .expect("delivery");
        assert_eq!(outcome, expected);
    }
    let null = count(
        conn,
        "SELECT COUNT(*) AS n FROM processed_message \
         WHERE message_id = 'ORDER_PAID:U1' AND result IS NULL",
    )
    .await;
    assert_eq!(null, 1, "the row exists and its result is NULL");
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:U1").await, 1);
}

/// A stored result that no longer decodes as the caller's type (the type changed between
/// the two runs) is a `Decode` error, and the handler does not run.
async fn stored_result_of_another_type_is_a_decode_error<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let reserved = Reservation {
        sku: "A".to_owned(),
        left: 1,
        note: None,
    };
    apply_once(conn, "inventory", "ORDER_PAID:T1", async |_tx| {
        Ok::<_, diesel::result::Error>(reserved)
    })
    .await
    .expect("first");
    let as_number = apply_once(conn, "inventory", "ORDER_PAID:T1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:T1").await?;
        Ok::<_, diesel::result::Error>(5u64)
    })
    .await;
    assert!(
        matches!(as_number, Err(InboxError::Decode(_))),
        "{as_number:?}"
    );
    // A `()` first run stores nothing, which reads back as `null`: not a number either.
    apply_once(conn, "inventory", "ORDER_PAID:T2", async |_tx| {
        Ok::<_, diesel::result::Error>(())
    })
    .await
    .expect("first");
    let after_unit = apply_once(conn, "inventory", "ORDER_PAID:T2", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:T2").await?;
        Ok::<_, diesel::result::Error>(5u64)
    })
    .await;
    assert!(
        matches!(after_unit, Err(InboxError::Decode(_))),
        "{after_unit:?}"
    );
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:T1").await, 0);
    assert_eq!(effects(conn, "inventory", "ORDER_PAID:T2").await, 0);
    assert_eq!(all_inbox_rows(conn).await, 2);
}

/// An id longer than 300 characters or a consumer longer than 100 is refused before
/// anything is written; the limits are characters, not bytes.
async fn too_long_names_write_nothing<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let long_id = "x".repeat(inbox::MESSAGE_ID_MAX + 1);
    let long_consumer = "c".repeat(inbox::CONSUMER_MAX + 1);
    let refused = apply_once(conn, "inventory", &long_id, async |tx| {
        effect(tx, "inventory", "long").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await;
    assert!(
        matches!(
            refused,
            Err(InboxError::TooLong {
                what: "message id",
                max: 300
            })
        ),
        "{refused:?}"
    );
    let refused = apply_once(conn, &long_consumer, "ORDER_PAID:L1", async |tx| {
        effect(tx, "inventory", "long").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await;
    assert!(
        matches!(
            refused,
            Err(InboxError::TooLong {
                what: "consumer name",
                max: 100
            })
        ),
        "{refused:?}"
    );
    assert_eq!(all_inbox_rows(conn).await, 0);
    assert_eq!(count(conn, "SELECT COUNT(*) AS n FROM effect").await, 0);
    // Exactly at the limits, in two-byte characters, fits every backend's columns.
    let max_id = "é".repeat(inbox::MESSAGE_ID_MAX);
    let max_consumer = "ü".repeat(inbox::CONSUMER_MAX);
    let fits = apply_once(conn, &max_consumer, &max_id, async |_tx| {
        Ok::<_, diesel::result::Error>(1)
    })
    .await
    .expect("at the limits");
    assert_eq!(fits, Outcome::Applied(1));
    assert_eq!(inbox_rows(conn, &max_consumer, &max_id).await, 1);
}

/// Two consumers apply one message id each on their own; ids differing only in case or
/// by a trailing space are distinct messages (on MySQL too).
async fn consumers_are_independent_and_ids_exact<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    for consumer in ["inventory", "billing"] {
        let outcome = apply_once(conn, consumer, "ORDER_PAID:I1", async |tx| {
            effect(tx, consumer, "ORDER_PAID:I1").await?;
            Ok::<_, diesel::result::Error>(consumer.to_owned())
        })
        .await
        .expect("delivery");
        assert_eq!(outcome, Outcome::Applied(consumer.to_owned()));
    }
    for consumer in ["inventory", "billing"] {
        let again = apply_once(conn, consumer, "ORDER_PAID:I1", async |tx| {
            effect(tx, consumer, "ORDER_PAID:I1").await?;
            Ok::<_, diesel::result::Error>(String::new())
        })
        .await
        .expect("redelivery");
        assert_eq!(again, Outcome::Duplicate(consumer.to_owned()));
        assert_eq!(effects(conn, consumer, "ORDER_PAID:I1").await, 1);
    }
    // A consumer name differing by a trailing space is another consumer (MySQL's PAD SPACE
    // collations would make it the same one).
    let padded = apply_once(conn, "inventory ", "ORDER_PAID:I1", async |_tx| {
        Ok::<_, diesel::result::Error>("padded".to_owned())
    })
    .await
    .expect("delivery to the padded consumer");
    assert_eq!(padded, Outcome::Applied("padded".to_owned()));
    let ids = ["ORDER_PAID:abc", "ORDER_PAID:ABC", "ORDER_PAID:abc "];
    for id in ids {
        let outcome = apply_once(conn, "inventory", id, async |tx| {
            effect(tx, "inventory", id).await?;
            Ok::<_, diesel::result::Error>(id.to_owned())
        })
        .await
        .expect("delivery");
        assert_eq!(outcome, Outcome::Applied(id.to_owned()), "{id:?}");
    }
    for id in ids {
        let again = apply_once(conn, "inventory", id, async |tx| {
            effect(tx, "inventory", id).await?;
            Ok::<_, diesel::result::Error>(String::new())
        })
        .await
        .expect("redelivery");
        assert_eq!(again, Outcome::Duplicate(id.to_owned()), "{id:?}");
    }
    assert_eq!(
        count(
            conn,
            "SELECT COUNT(*) AS n FROM effect WHERE consumer = 'inventory'"
        )
        .await,
        4
    );
    assert_eq!(all_inbox_rows(conn).await, 6);
}

/// Inserts `n` rows of `consumer` named `{prefix}{i}` processed `age` ago, directly.
async fn insert_aged<C: Raw>(
    conn: &mut C,
    consumer: &str,
    prefix: &str,
    n: usize,
    age: chrono::Duration,
) {
    let at = (chrono::Utc::now().naive_utc() - age).format("%Y-%m-%d %H:%M:%S%.6f");
    for start in (0..n).step_by(500) {
        let values: Vec<String> = (start..n.min(start + 500))
            .map(|i| format!("({}, '{prefix}{i}', '{at}')", lit(consumer)))
            .collect();
        exec(
            conn,
            &format!(
                "INSERT INTO processed_message (consumer, message_id, processed_at) VALUES {}",
                values.join(", ")
            ),
        )
        .await
        .expect("aged rows");
    }
}

/// `purge` deletes only that consumer's rows older than the window, over several batches,
/// and keeps the younger ones. A purged message's redelivery applies again: why the window
/// must be longer than the relay's redelivery (and any redrive of a dead letter).
async fn purge_removes_only_old_rows_of_that_consumer<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let eight_days = chrono::Duration::days(8);
    insert_aged(conn, "inventory", "old-", 2500, eight_days).await;
    insert_aged(conn, "inventory", "young-", 30, chrono::Duration::days(6)).await;
    insert_aged(conn, "billing", "old-", 40, eight_days).await;
    apply_once(conn, "inventory", "ORDER_PAID:P1", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:P1").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await
    .expect("a fresh delivery");

    let purged = inbox::purge(conn, "inventory", DEFAULT_WINDOW)
        .await
        .expect("purge");
    assert_eq!(purged, 2500);
    let inventory = count(
        conn,
        "SELECT COUNT(*) AS n FROM processed_message WHERE consumer = 'inventory'",
    )
    .await;
    assert_eq!(inventory, 31, "the 30 young rows and the fresh one remain");
    let old_left = count(
        conn,
        "SELECT COUNT(*) AS n FROM processed_message \
         WHERE consumer = 'inventory' AND message_id LIKE 'old-%'",
    )
    .await;
    assert_eq!(old_left, 0);
    let billing = count(
        conn,
        "SELECT COUNT(*) AS n FROM processed_message WHERE consumer = 'billing'",
    )
    .await;
    assert_eq!(billing, 40, "another consumer's rows are its own to purge");
    assert_eq!(
        inbox::purge(conn, "inventory", DEFAULT_WINDOW)
            .await
            .expect("purge"),
        0
    );

    // Past the window a redelivery is a new message; inside it, a duplicate.
    let purged_again = apply_once(conn, "inventory", "old-7", async |tx| {
        effect(tx, "inventory", "old-7").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await
    .expect("redelivery of a purged message");
    assert_eq!(purged_again, Outcome::Applied(()));
    assert_eq!(effects(conn, "inventory", "old-7").await, 1);
    let young = apply_once(conn, "inventory", "young-7", async |tx| {
        effect(tx, "inventory", "young-7").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await
    .expect("redelivery inside the window");
    assert_eq!(young, Outcome::Duplicate(()));
    assert_eq!(effects(conn, "inventory", "young-7").await, 0);
    let billing_old = apply_once(conn, "billing", "old-7", async |_tx| {
        Ok::<_, diesel::result::Error>(())
    })
    .await
    .expect("billing");
    assert_eq!(billing_old, Outcome::Duplicate(()));
}

/// `create_table` is `IF NOT EXISTS`: a second call keeps the table and its rows.
async fn create_table_twice<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    inbox::create_table(conn).await.expect("first");
    apply_once(conn, "inventory", "ORDER_PAID:K1", async |_tx| {
        Ok::<_, diesel::result::Error>(3)
    })
    .await
    .expect("delivery");
    inbox::create_table(conn).await.expect("second");
    let again = apply_once(conn, "inventory", "ORDER_PAID:K1", async |_tx| {
        Ok::<_, diesel::result::Error>(4)
    })
    .await
    .expect("redelivery");
    assert_eq!(again, Outcome::Duplicate(3));
    assert_eq!(all_inbox_rows(conn).await, 1);
}

/// A handler whose future is dropped mid-transaction (a timeout, a shutdown `select!`)
/// leaves its connection inside the transaction: nothing of it committed, and a later
/// `apply_once` on that connection is refused rather than nested in it (where its "commit"
/// would be a savepoint release that never reaches the database).
async fn a_connection_left_in_a_transaction_is_refused<B: Backend>() {
    let db = B::create();
    let conn = &mut db.connect().await;
    setup(conn).await;
    let cut = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        apply_once(conn, "inventory", "ORDER_PAID:C1", async |tx| {
            effect(tx, "inventory", "ORDER_PAID:C1").await?;
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            Ok::<_, diesel::result::Error>(())
        }),
    )
    .await;
    assert!(cut.is_err(), "the handler was cut off");
    let next = apply_once(conn, "inventory", "ORDER_PAID:C2", async |tx| {
        effect(tx, "inventory", "ORDER_PAID:C2").await?;
        Ok::<_, diesel::result::Error>(())
    })
    .await;
    assert!(matches!(next, Err(InboxError::InTransaction)), "{next:?}");
    drop(next);
    // A fresh connection sees neither message: the cut one never committed, the refused
    // one never ran.
    let fresh = &mut db.connect().await;
    assert_eq!(effects(fresh, "inventory", "ORDER_PAID:C1").await, 0);
    assert_eq!(effects(fresh, "inventory", "ORDER_PAID:C2").await, 0);
    assert_eq!(all_inbox_rows(fresh).await, 0);
}
