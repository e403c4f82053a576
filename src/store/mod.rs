//! Storage: connection pools per backend, embedded migrations, and the one dispatch macro that
//! lets every query be written once and compiled for each backend.
//!
//! Adding a backend (MySQL/MariaDB) means: a `migrations/<backend>` folder, one `Pools` variant,
//! and one arm in `with_conn!` (plus `insert_ignore!` where its SQL differs).

pub mod ledger;
pub mod orders;
pub mod outbox;
pub mod relay;
pub mod schema;
mod statements;
pub mod types;

use std::path::Path;
use std::time::Duration;

use diesel::sqlite::SqliteConnection;
use diesel::{Connection, ConnectionError, ConnectionResult};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::config::{DatabaseSettings, DatabaseUrl};

pub const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");
pub const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

pub type SqliteAsync = SyncConnectionWrapper<SqliteConnection>;

/// How long SQLite waits for the single writer before giving up with `SQLITE_BUSY`.
const SQLITE_BUSY_TIMEOUT_MS: u64 = 5000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection could be had (pool exhausted, server down): the caller answers 503.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A statement failed (including a statement timeout or a lost connection).
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
    #[error("migrations failed: {0}")]
    Migration(String),
}

pub(crate) enum Pools {
    Postgres(Pool<AsyncPgConnection>),
    Sqlite(Pool<SqliteAsync>),
}

/// The database behind paynotify; cheap to clone (the pools are shared).
#[derive(Clone)]
pub struct Store {
    pools: std::sync::Arc<Pools>,
    url: DatabaseUrl,
    acquire_timeout: Duration,
}

/// Opens every pooled connection on `runtime` (the one the store was built on), whichever
/// runtime asks the pool for it. A PostgreSQL connection's I/O task, and the blocking pool
/// an SQLite connection runs its statements on, belong to the runtime that opened it: one
/// opened on an HTTP worker's runtime would die with that worker at shutdown, and the relay,
/// which outlives the workers, would get `connection closed` or `task … was cancelled`
/// releasing its leases.
async fn establish_on<C>(
    runtime: Option<tokio::runtime::Handle>,
    url: String,
) -> ConnectionResult<C>
where
    C: AsyncConnection + Send + 'static,
{
    match runtime {
        Some(runtime) => runtime
            .spawn(async move { C::establish(&url).await })
            .await
            .map_err(|e| ConnectionError::BadConnection(format!("connection task ended: {e}")))?,
        None => C::establish(&url).await,
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

/// Runs `$body` with `$conn` bound to a pooled connection of whichever backend the store uses.
/// The body is compiled once per backend, so each query is written once.
/// The `$dialect` form also binds which backend it is, for the few statements whose SQL
/// text differs (see `Dialect`).
macro_rules! with_conn {
    ($store:expr, $conn:ident => $body:expr) => {
        $crate::store::with_conn!($store, $conn, _dialect => $body)
    };
    ($store:expr, $conn:ident, $dialect:ident => $body:expr) => {
        match &*$store.pools {
            $crate::store::Pools::Postgres(pool) => {
                let mut pooled = $crate::store::acquire(pool.get(), $store.acquire_timeout).await?;
                let $conn: &mut diesel_async::AsyncPgConnection = &mut pooled;
                let $dialect = $crate::store::Dialect::Postgres;
                $body
            }
            $crate::store::Pools::Sqlite(pool) => {
                let mut pooled = $crate::store::acquire(pool.get(), $store.acquire_timeout).await?;
                let $conn: &mut $crate::store::SqliteAsync = &mut pooled;
                let $dialect = $crate::store::Dialect::Sqlite;
                $body
            }
        }
    };
}

/// Which SQL dialect a connection speaks, for hand-written statements. Their placeholders
/// are `$1, $2, …`, each used once and in order: PostgreSQL reads them as positions and
/// SQLite as names numbered in order of appearance, so one bind list serves both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}
pub(crate) use with_conn;

/// Waits at most `timeout` for a pooled connection, so an exhausted pool or a dead server
/// is a quick 503 instead of a hang.
pub(crate) async fn acquire<T, E: std::fmt::Display>(
    checkout: impl Future<Output = Result<T, E>>,
    timeout: Duration,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, checkout).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no connection free within {} ms",
            timeout.as_millis()
        ))),
    }
}

impl Store {
    /// Builds the pool for the backend that `database.url` names. Connections are opened
    /// lazily; call [`Store::ping`] to find out whether the database answers.
    pub fn connect(settings: &DatabaseSettings) -> Result<Self, StoreError> {
        let url = DatabaseUrl::parse(settings.url.expose())
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let statement_timeout_ms = settings.statement_timeout_ms;
        let size = settings.pool_size as usize;
        let runtime = tokio::runtime::Handle::try_current().ok();
        let pools = match &url {
            DatabaseUrl::Postgres(pg_url) => {
                let mut config = ManagerConfig::<AsyncPgConnection>::default();
                // A dead connection is noticed by `is_broken`; a ping per checkout would cost
                // a round trip on every notification.
                config.recycling_method = RecyclingMethod::Fast;
                let pg_runtime = runtime.clone();
                config.custom_setup = Box::new(move |url| {
                    let (runtime, url) = (pg_runtime.clone(), url.to_owned());
                    Box::pin(async move {
                        let mut conn: AsyncPgConnection = establish_on(runtime, url).await?;
                        conn.batch_execute(&format!(
                            "SET statement_timeout = {statement_timeout_ms}; \
                             SET TIME ZONE 'UTC'; SET application_name = 'paynotify'"
                        ))
                        .await
                        .map_err(ConnectionError::CouldntSetupConfiguration)?;
                        Ok(conn)
                    })
                });
                let manager = AsyncDieselConnectionManager::new_with_config(pg_url, config);
                Pools::Postgres(
                    Pool::builder(manager)
                        .max_size(size)
                        .build()
                        .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                )
            }
            DatabaseUrl::Sqlite(path) => {
                if let Some(dir) = Path::new(path)
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
                let mut config = ManagerConfig::<SqliteAsync>::default();
                config.recycling_method = RecyclingMethod::Fast;
                config.custom_setup = Box::new(move |path| {
                    let (runtime, path) = (runtime.clone(), path.to_owned());
                    Box::pin(async move {
                        let mut conn: SqliteAsync = establish_on(runtime, path).await?;
                        // The busy timeout first: the journal-mode pragma itself takes a lock,
                        // and a connection opened while another one writes must wait for it,
                        // not fail. WAL lets readers run beside the one writer; synchronous
                        // stays FULL so an acknowledged notification survives a power cut.
                        conn.batch_execute(&format!(
                            "PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}; PRAGMA journal_mode = WAL; \
                             PRAGMA foreign_keys = ON;"
                        ))
                        .await
                        .map_err(ConnectionError::CouldntSetupConfiguration)?;
                        Ok(conn)
                    })
                });
                let manager = AsyncDieselConnectionManager::new_with_config(path, config);
                Pools::Sqlite(
                    Pool::builder(manager)
                        .max_size(size)
                        .build()
                        .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                )
            }
        };
        Ok(Self {
            pools: std::sync::Arc::new(pools),
            url,
            acquire_timeout: Duration::from_millis(settings.acquire_timeout_ms),
        })
    }

    pub fn backend(&self) -> &'static str {
        self.url.backend()
    }

    /// Applies pending migrations of this backend; returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<String>, StoreError> {
        let url = self.url.clone();
        let run = move || -> Result<Vec<String>, StoreError> {
            let failed = |e: &dyn std::fmt::Display| StoreError::Migration(e.to_string());
            let applied = match url {
                DatabaseUrl::Postgres(url) => {
                    let mut conn =
                        <AsyncConnectionWrapper<AsyncPgConnection> as Connection>::establish(&url)
                            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
                    conn.run_pending_migrations(POSTGRES_MIGRATIONS)
                        .map_err(|e| failed(&e))?
                        .iter()
                        .map(ToString::to_string)
                        .collect()
                }
                DatabaseUrl::Sqlite(path) => {
                    let mut conn = SqliteConnection::establish(&path)
                        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
                    conn.run_pending_migrations(SQLITE_MIGRATIONS)
                        .map_err(|e| failed(&e))?
                        .iter()
                        .map(ToString::to_string)
                        .collect()
                }
            };
            Ok(applied)
        };
        tokio::task::spawn_blocking(run)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?
    }

    /// Connections `(in use, idle, callers waiting)` of the pool.
    pub fn pool_status(&self) -> (usize, usize, usize) {
        let s = match &*self.pools {
            Pools::Postgres(pool) => pool.status(),
            Pools::Sqlite(pool) => pool.status(),
        };
        (s.size.saturating_sub(s.available), s.available, s.waiting)
    }

    /// `SELECT 1` on a pooled connection: does the database answer?
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::sql_query("SELECT 1").execute(conn).await?;
            Ok(())
        })
    }
}
