//! The inbox: one `processed_message` row per `(consumer, message_id)`, written in the
//! same transaction as the handler's effects.
//!
//! [`apply_once`] opens a transaction, inserts the row first (so a concurrent redelivery of
//! the same message waits on the row's lock instead of running the handler beside it),
//! runs the handler on the same connection, stores its result beside the row and commits.
//! A redelivery finds the row, rolls back its empty transaction and returns the stored
//! result as [`Outcome::Duplicate`] without running the handler. A handler error rolls the
//! row back with everything else: the next delivery runs the handler again.
//!
//! The table is the consumer's, in the consumer's database ([`create_table`] makes it; the
//! same DDL is in `consumer/sql/`). [`purge`] empties it past the deduplication window.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel_async::AsyncConnection;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How long a processed message is remembered by default: the relay's retries of one
/// message end within about two hours (16 attempts, backoff capped at 10 minutes), and
/// paynotify keeps sent rows 7 days. A dead letter redriven later than the window is
/// applied again; keep the window longer than anything you would redrive.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest `consumer` name, in characters (the column is `VARCHAR(100)`).
pub const CONSUMER_MAX: usize = 100;
/// The longest message id, in characters (the column is `VARCHAR(300)`).
pub const MESSAGE_ID_MAX: usize = 300;

/// Rows [`purge`] deletes per statement.
const PURGE_BATCH: i64 = 1000;

/// What [`apply_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The handler ran now and its transaction committed.
    Applied(T),
    /// The message was applied before: the handler did not run; this is the result that
    /// run stored.
    Duplicate(T),
}

impl<T> Outcome<T> {
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }

    /// The result, whichever run produced it.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Applied(t) | Outcome::Duplicate(t) => t,
        }
    }
}

/// Why [`apply_once`] applied nothing. In every case the transaction rolled back: no
/// effect of the handler and no inbox row remain.
#[derive(Debug, thiserror::Error)]
pub enum InboxError<E> {
    #[error("inbox: {0}")]
    Database(#[from] diesel::result::Error),
    #[error("the handler failed: {0}")]
    Handler(E),
    /// `consumer` or `message_id` is longer than its column.
    #[error("inbox: the {what} is longer than {max} characters")]
    TooLong { what: &'static str, max: usize },
    #[error("inbox: the handler's result could not be stored: {0}")]
    Encode(serde_json::Error),
    /// The first run's stored result does not decode as this `T` (its type changed).
    #[error("inbox: the stored result of the first run does not decode: {0}")]
    Decode(serde_json::Error),
    /// The row that made this delivery a duplicate was gone when its result was read
    /// (purged in between, or its transaction rolled back), several times over.
    #[error("inbox: the message's row kept vanishing between the insert and the read")]
    Vanished,
    /// The connection is inside a transaction already: one the caller opened, or one a
    /// handler left open when it panicked or its future was dropped. `apply_once` opens its
    /// own transaction and never nests in another (a savepoint would commit nothing).
    /// Drop the connection (pools do: they discard a connection left in a transaction).
    #[error(
        "inbox: the connection is already inside a transaction (left open by a cancelled or panicked handler?); use another connection"
    )]
    InTransaction,
}

/// The handler [`apply_once`] runs: an `async |tx| …` closure on the transaction's
/// connection whose future is `Send` (spelled out so that the bound can be written; any
/// such closure has it).
pub trait TxHandler<'r, C: 'r, R>:
    AsyncFnOnce(&'r mut C) -> R + FnOnce(&'r mut C) -> <Self as TxHandler<'r, C, R>>::Fut
{
    type Fut: Future<Output = R> + Send;
}

impl<'r, C: 'r, R, F, Fut> TxHandler<'r, C, R> for F
where
    F: AsyncFnOnce(&'r mut C) -> R + FnOnce(&'r mut C) -> Fut,
    Fut: Future<Output = R> + Send,
{
    type Fut = Fut;
}

/// The connections the inbox runs on: diesel-async's PostgreSQL, MySQL/MariaDB and SQLite
/// connections (and, through `&mut *pooled`, a pooled one of each).
pub trait InboxConnection: AsyncConnection + Send + Sized + 'static + sealed::Statements {}

impl<C: AsyncConnection + Send + Sized + 'static + sealed::Statements> InboxConnection for C {}

pub(crate) mod sealed {
    use super::*;

    /// The backend's statements; one implementation per backend file.
    pub trait Statements {
        /// `true` when the row was inserted now; `false` when it exists (committed by an
        /// earlier run, or by a concurrent one this statement waited for).
        fn claim<'a>(
            &'a mut self,
            consumer: &'a str,
            message_id: &'a str,
            at: NaiveDateTime,
        ) -> impl Future<Output = QueryResult<bool>> + Send + 'a;
        fn store_result<'a>(
            &'a mut self,
            consumer: &'a str,
            message_id: &'a str,
            result: &'a str,
        ) -> impl Future<Output = QueryResult<()>> + Send + 'a;
        /// `None`: no row; `Some(None)`: a row whose result is JSON `null`.
        fn stored_result<'a>(
            &'a mut self,
            consumer: &'a str,
            message_id: &'a str,
        ) -> impl Future<Output = QueryResult<Option<Option<String>>>> + Send + 'a;
        /// Deletes at most `limit` rows of `consumer` processed before `before`.
        fn purge_batch<'a>(
            &'a mut self,
            consumer: &'a str,
            before: NaiveDateTime,
            limit: i64,
        ) -> impl Future<Output = QueryResult<usize>> + Send + 'a;
        fn create_table(&mut self) -> impl Future<Output = QueryResult<()>> + Send + '_;
    }
}

/// The `result` column, read back for a duplicate.
#[derive(diesel::QueryableByName)]
pub(crate) struct Stored {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) result: Option<String>,
}

type Boxed<'a, R> = Pin<Box<dyn Future<Output = R> + Send + 'a>>;

/// The transaction's own failure modes, carried out of diesel's `transaction` (which rolls
/// back on any `Err`).
enum Abort<E> {
    Duplicate,
    /// A lock conflict at the inbox insert, before the handler ran: worth a new attempt.
    Conflict(diesel::result::Error),
    Database(diesel::result::Error),
    Handler(E),
    Encode(serde_json::Error),
}

impl<E> From<diesel::result::Error> for Abort<E> {
    fn from(e: diesel::result::Error) -> Self {
        Abort::Database(e)
    }
}

/// How many times [`apply_once`] opens its transaction before giving up on a claim that
/// keeps losing a lock conflict (or whose row keeps vanishing before it is read).
const CLAIM_ATTEMPTS: u32 = 5;

/// Runs `handler` once for `(consumer, message_id)`, in one transaction with the inbox row.
///
/// ```ignore
/// let outcome = apply_once(&mut conn, "inventory", &event.message_id(), async |tx| {
///     diesel::sql_query("UPDATE stock SET on_hand = on_hand - 1 WHERE sku = 'A'")
///         .execute(tx)
///         .await
/// })
/// .await?;
/// ```
///
/// `Applied(t)`: the handler ran and everything it did on `tx` committed with the row.
/// `Duplicate(t)`: an earlier run committed; `t` is its stored result (serialised as JSON
/// beside the row; a `()` result stores nothing). Concurrent deliveries of one message
/// wait on the row's lock: one runs the handler, the others return `Duplicate`.
/// Errors roll everything back; the delivery should be retried (see [`InboxError`]).
///
/// **Lock conflicts on the inbox row are retried here.** On MySQL/MariaDB, when the run
/// holding a message's row rolls back (its handler failed) while two or more deliveries of
/// the same message wait on it, InnoDB lets them all take a shared lock on the key and
/// then picks a deadlock victim (1213) among them; on PostgreSQL under `REPEATABLE READ` or
/// `SERIALIZABLE`, a delivery that waited for a concurrent insert of its key fails with a
/// serialization failure (40001). Both happen at the inbox insert, before the handler
/// runs, and roll back an empty transaction, so `apply_once` opens a new one at once, up
/// to 5 attempts in all; the caller sees only the final `Applied`/`Duplicate` (or, after
/// the last attempt, the database error). A deadlock or serialization failure in the
/// handler's own statements is *not* retried (the handler is `FnOnce` and has run): it is
/// returned as the handler's error with everything rolled back, for the delivery to be
/// redelivered.
///
/// SQLite connections need a `busy_timeout` so a second writer waits instead of failing.
pub fn apply_once<'a, C, T, E, F>(
    conn: &'a mut C,
    consumer: &'a str,
    message_id: &'a str,
    handler: F,
) -> impl Future<Output = Result<Outcome<T>, InboxError<E>>> + Send + 'a
where
    C: InboxConnection,
    T: Serialize + DeserializeOwned + Send + 'a,
    E: Send + 'a,
    for<'r> F: AsyncFnOnce(&'r mut C) -> Result<T, E> + TxHandler<'r, C, Result<T, E>> + Send + 'a,
{
    // Boxed so the future is `Send` for the caller without the compiler having to see
    // through the higher-ranked closure (rust-lang/rust#100013).
    let run: Boxed<'a, Result<Outcome<T>, InboxError<E>>> = Box::pin(async move {
        check_length("consumer name", consumer, CONSUMER_MAX)?;
        check_length("message id", message_id, MESSAGE_ID_MAX)?;
        if in_transaction(conn) {
            return Err(InboxError::InTransaction);
        }
        // Taken only once the row is claimed: until then a failed attempt can start over.
        let mut handler = Some(handler);
        let mut attempt = 1;
        loop {
            let now = chrono::Utc::now().naive_utc();
            let slot = &mut handler;
            let ran = conn
                .transaction::<T, Abort<E>, _>(async move |tx| {
                    match tx.claim(consumer, message_id, now).await {
                        Ok(true) => {}
                        Ok(false) => return Err(Abort::Duplicate),
                        Err(e) if is_lock_conflict(&e) => return Err(Abort::Conflict(e)),
                        Err(e) => return Err(Abort::Database(e)),
                    }
                    let Some(handler) = slot.take() else {
                        // Unreachable: an attempt that took the handler is never repeated.
                        return Err(Abort::Database(diesel::result::Error::QueryBuilderError(
                            "inbox: the handler was already run".into(),
                        )));
                    };
                    let effect: Boxed<'_, Result<T, E>> = Box::pin(handler(tx));
                    let value = effect.await.map_err(Abort::Handler)?;
                    let json = serde_json::to_string(&value).map_err(Abort::Encode)?;
                    // A `()` (or any `null`) result needs no second statement: a missing
                    // result reads back as `null`.
                    if json != "null" {
                        tx.store_result(consumer, message_id, &json).await?;
                    }
                    Ok(value)
                })
                .await;
            let last = attempt >= CLAIM_ATTEMPTS;
            match ran {
                Ok(value) => return Ok(Outcome::Applied(value)),
                Err(Abort::Duplicate) => match duplicate(conn, consumer, message_id).await? {
                    Some(outcome) => return outcome,
                    None if last => return Err(InboxError::Vanished),
                    None => {
                        tracing::debug!(consumer, message_id, attempt, "inbox: row gone, again");
                    }
                },
                Err(Abort::Conflict(e)) if last => return Err(InboxError::Database(e)),
                Err(Abort::Conflict(e)) => {
                    tracing::debug!(consumer, message_id, attempt, error = %e,
                        "inbox: lock conflict on the inbox row, again");
                }
                Err(Abort::Database(e)) => return Err(InboxError::Database(e)),
                Err(Abort::Handler(e)) => return Err(InboxError::Handler(e)),
                Err(Abort::Encode(e)) => return Err(InboxError::Encode(e)),
            }
            attempt += 1;
        }
    });
    run
}

/// A deadlock victim (PostgreSQL 40P01, InnoDB 1213) or a serialization failure (40001):
/// the database rolled the transaction back and a new one may succeed.
fn is_lock_conflict(e: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    match e {
        Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => true,
        Error::DatabaseError(_, info) => {
            let message = info.message();
            message.contains("Deadlock found") || message.contains("deadlock detected")
        }
        _ => false,
    }
}

/// The stored result of the run that committed first, read outside the rolled-back
/// transaction so the read sees the latest committed row whatever the isolation level.
/// `None`: the row is gone (purged since the insert found it).
async fn duplicate<C: InboxConnection, T: DeserializeOwned, E>(
    conn: &mut C,
    consumer: &str,
    message_id: &str,
) -> Result<Option<Result<Outcome<T>, InboxError<E>>>, InboxError<E>> {
    Ok(conn
        .stored_result(consumer, message_id)
        .await?
        .map(|stored| {
            let json = stored.as_deref().unwrap_or("null");
            serde_json::from_str(json)
                .map(Outcome::Duplicate)
                .map_err(InboxError::Decode)
        }))
}

/// Whether `conn` is inside a transaction (or its transaction manager is in error).
fn in_transaction<C: AsyncConnection>(conn: &mut C) -> bool {
    use diesel_async::TransactionManager;
    !matches!(
        C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(None)
    )
}

fn check_length<E>(what: &'static str, value: &str, max: usize) -> Result<(), InboxError<E>> {
    if value.chars().count() > max {
        return Err(InboxError::TooLong { what, max });
    }
    Ok(())
}

/// Whether `message_id` was applied by `consumer` (and is still inside the window).
pub async fn seen<C: InboxConnection>(
    conn: &mut C,
    consumer: &str,
    message_id: &str,
) -> QueryResult<bool> {
    Ok(conn.stored_result(consumer, message_id).await?.is_some())
}

/// Deletes `consumer`'s rows processed more than `window` ago, in batches of 1,000 rows
/// (one short statement each, so the table is never locked long); returns how many.
/// Run it daily with [`DEFAULT_WINDOW`] or longer.
///
/// A purged message is forgotten: its redelivery runs the handler again and applies. So
/// the window must be longer than anything that can deliver a message again — the relay's
/// retries (about two hours) and any redrive of a dead letter — or the effect is applied
/// twice.
pub async fn purge<C: InboxConnection>(
    conn: &mut C,
    consumer: &str,
    window: Duration,
) -> QueryResult<u64> {
    let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    let before = chrono::Utc::now()
        .naive_utc()
        .checked_sub_signed(window)
        .unwrap_or(NaiveDateTime::MIN);
    let mut total = 0u64;
    loop {
        let deleted = conn.purge_batch(consumer, before, PURGE_BATCH).await?;
        total += deleted as u64;
        if (deleted as i64) < PURGE_BATCH {
            return Ok(total);
        }
    }
}

/// `CREATE TABLE IF NOT EXISTS processed_message …` (and its purge index) for this
/// backend: the DDL in `consumer/sql/{backend}.sql`.
pub async fn create_table<C: InboxConnection>(conn: &mut C) -> QueryResult<()> {
    conn.create_table().await
}
