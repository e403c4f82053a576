//! Storage: connection pools per backend, embedded migrations, and the one dispatch macro that
//! lets every query be written once and compiled for each backend.
//!
//! Adding a backend (MySQL/MariaDB) means: a `migrations/<backend>` folder, one `Pools` variant,
//! one arm in `with_conn!`, and a `Dialect` value for the few statements whose SQL differs;
//! for failovers, its connect and checkout rules (`connect.rs`), its `/readyz` probe
//! (`readiness.rs`) and the statement naming its writer (`writer.rs`).

mod connect;
mod group;
mod readiness;
pub use connect::PgTarget;
pub use readiness::{DatabaseState, DatabaseStatus};
pub mod partitions;
pub use group::GroupCounts;
pub mod ledger;
pub mod orders;
pub mod outbox;
pub mod relay;
pub mod schema;
pub(crate) mod statements;
pub mod writer;

/// "The order is still waiting", for a by-key statement written with diesel's DSL: an
/// expression no partial index can serve ([`statements::WAITING`]).
pub(crate) fn still_waiting() -> diesel::expression::SqlLiteral<diesel::sql_types::Bool> {
    diesel::dsl::sql(statements::WAITING)
}
pub mod types;

use std::path::Path;
use std::time::Duration;

use diesel::sqlite::SqliteConnection;
use diesel::{Connection, ConnectionError};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::{BuildError, Pool, PoolError};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::config::{ConfigError, DatabaseSettings, DatabaseUrl};
use connect::establish_on;

pub const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");
pub const MYSQL_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/mysql");
pub const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

pub type SqliteAsync = SyncConnectionWrapper<SqliteConnection>;

/// How long SQLite waits for the single writer before giving up with `SQLITE_BUSY`.
const SQLITE_BUSY_TIMEOUT_MS: u64 = 5000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No pooled connection within `database.acquire_timeout_ms` (pool exhausted, server
    /// slow to accept).
    #[error("no database connection free within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// A connection could not be opened (server down, refused, bad credentials).
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] PoolError),
    /// A statement failed; [`StoreError::is_unavailable`] tells a lost or busy database from
    /// a statement that is wrong.
    #[error("database statement failed: {0}")]
    Query(#[source] diesel::result::Error),
    /// `database.url` does not name a database this build can use.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot build the connection pool: {0}")]
    Pool(#[from] BuildError),
    #[error("cannot create the SQLite directory {}: {source}", path.display())]
    Directory {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the database to migrate it: {0}")]
    MigrationConnect(#[source] ConnectionError),
    #[error("migrations failed: {0}")]
    Migration(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A database server older than this build needs.
    #[error(
        "database server {0} is not supported: MySQL 8.0+ or MariaDB 10.6+ is needed (FOR UPDATE SKIP LOCKED)"
    )]
    UnsupportedServer(String),
    /// The task running the work ended before it did (a panic, or the runtime stopping).
    #[error("database task ended early: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The database was away or too busy for a group of payments (see `group.rs`).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The work was handed on and not answered in time: it may still commit (a group of
    /// payments still queued or running). The caller answers 503 and must not say what
    /// happened; the provider's retry finds out.
    #[error("outcome not known yet: {0}")]
    Undecided(String),
}

impl From<diesel::result::Error> for StoreError {
    /// Every statement's error passes here: one saying the server refuses writes or is
    /// leaving makes the pool check its connections before handing them out again.
    fn from(error: diesel::result::Error) -> Self {
        if connect::refuses_writes_or_leaving(&error) {
            connect::distrust_pooled();
        }
        Self::Query(error)
    }
}

impl StoreError {
    /// A deadlock victim (PostgreSQL 40P01, InnoDB 1213): retrying at once succeeds.
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Self::Query(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains("deadlock detected") || info.message().contains("Deadlock found"))
    }

    /// Whether the database could not be reached or was too busy (the caller answers 503),
    /// as opposed to a statement that failed on a working database (500). Providers retry
    /// both; operators tell them apart in the logs and in `paynotify_notifications_total`.
    pub fn is_unavailable(&self) -> bool {
        use diesel::result::{DatabaseErrorKind, Error};
        match self {
            Self::Timeout(_)
            | Self::Connect(_)
            | Self::MigrationConnect(_)
            | Self::Task(_)
            | Self::Unavailable(_)
            | Self::Undecided(_) => true,
            Self::Query(Error::DatabaseError(kind, info)) => {
                matches!(
                    kind,
                    DatabaseErrorKind::ClosedConnection
                        | DatabaseErrorKind::UnableToSendCommand
                        // PostgreSQL 25006, MySQL 1792: the server was made read-only.
                        | DatabaseErrorKind::ReadOnlyTransaction
                ) || connect::says_failing_over(info.message())
                    || {
                        // PostgreSQL's statement_timeout (57014), SQLite's busy timeout and
                        // InnoDB's lock waits carry no kind of their own.
                        let message = info.message();
                        message.contains("statement timeout")
                        // PostgreSQL: a deadlock victim (40P01); the provider's retry succeeds.
                        || message.contains("deadlock detected")
                        // PostgreSQL ended this connection mid-statement (57P01
                        // pg_terminate_backend or a fast shutdown, 57P02 a crash of another
                        // backend), or is starting up or shutting down (57P03): whatever the
                        // statement did was rolled back or is found by the retry.
                        || message.starts_with("terminating connection")
                        || message.starts_with("the database system is")
                        || message.contains("database is locked")
                        || message.contains("database is busy")
                        // MySQL/MariaDB: a row lock not granted in time, or a deadlock victim.
                        || message.contains("Lock wait timeout exceeded")
                        || message.contains("Deadlock found")
                        || is_mysql_connection_lost(message)
                    }
            }
            _ => false,
        }
    }
}

/// The MySQL driver reports a lost connection as a database error of no particular kind:
/// a socket error (`Input/output error: …`), a connection it knows is gone, or the server
/// going away (shutting down, or this connection killed).
pub(crate) fn is_mysql_connection_lost(message: &str) -> bool {
    message.starts_with("Input/output error")
        || message.contains("Connection to the server is closed")
        || message.contains("Server shutdown in progress")
        || message.contains("Connection was killed")
}

pub(crate) enum Pools {
    Postgres(Pool<AsyncPgConnection>),
    Mysql(Pool<AsyncMysqlConnection>),
    Sqlite(Pool<SqliteAsync>),
}

/// The database behind paynotify; cheap to clone (the pools are shared).
#[derive(Clone)]
pub struct Store {
    /// Crate-visible for [`with_conn!`], which the feature rooms that own their SQL
    /// (`receipts/store.rs`, `reconcile/store.rs`) use as the ledger does.
    pub(crate) pools: std::sync::Arc<Pools>,
    url: DatabaseUrl,
    pub(crate) acquire_timeout: Duration,
    /// `database.statement_timeout_ms`.
    statement_timeout: Duration,
    /// The runtime the store was built on, where the group applier runs.
    runtime: Option<tokio::runtime::Handle>,
    /// The host:port the newest MySQL connection went to (`/readyz`).
    mysql_host: connect::ChosenHost,
    /// `database.sync_wait_alert_ms`.
    sync_wait_alert: Duration,
    /// `database.group_apply_max`; 0: every payment on its own.
    group_max: usize,
    /// The group applier, started by the first payment (see `group.rs`).
    group: std::sync::Arc<
        std::sync::OnceLock<crate::batch::Batcher<group::Payment, group::GroupResult>>,
    >,
    /// The writer every new connection reports (`writer.rs`).
    writer: std::sync::Arc<writer::Writer>,
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
            $crate::store::Pools::Mysql(pool) => {
                let mut pooled = $crate::store::acquire(pool.get(), $store.acquire_timeout).await?;
                let $conn: &mut diesel_async::AsyncMysqlConnection = &mut pooled;
                let $dialect = $crate::store::Dialect::Mysql;
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
    Mysql,
    Sqlite,
}
pub(crate) use with_conn;

/// Waits at most `timeout` for a pooled connection, so an exhausted pool or a dead server
/// is a quick 503 instead of a hang.
pub(crate) async fn acquire<T>(
    checkout: impl Future<Output = Result<T, PoolError>>,
    timeout: Duration,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, checkout).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(StoreError::Connect(e)),
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

impl Store {
    /// Builds the pool for the backend that `database.url` names. Connections are opened
    /// lazily; call [`Store::ping`] to find out whether the database answers.
    pub fn connect(settings: &DatabaseSettings) -> Result<Self, StoreError> {
        let url = DatabaseUrl::parse(settings.url.expose())?;
        let statement_timeout_ms = settings.statement_timeout_ms;
        let size = settings.pool_size as usize;
        let runtime = tokio::runtime::Handle::try_current().ok();
        let store_runtime = runtime.clone();
        let mysql_host = connect::ChosenHost::default();
        let writer = std::sync::Arc::new(writer::Writer::new(
            Duration::from_secs(settings.failover_recheck_secs),
            writer::ACKNOWLEDGED_MAX,
        ));
        let pools = match &url {
            DatabaseUrl::Postgres(pg_url) => {
                let mut config = ManagerConfig::<AsyncPgConnection>::default();
                // A dead connection is noticed by `is_broken`; a ping per checkout would cost
                // a round trip on every notification, so connections are only checked for a
                // while after a server refused writes or left (see `connect.rs`).
                config.recycling_method = connect::pg_recycling();
                let pg_runtime = runtime.clone();
                let pg_writer = writer.clone();
                config.custom_setup = Box::new(move |url| {
                    let (runtime, url) = (pg_runtime.clone(), url.to_owned());
                    let writer = pg_writer.clone();
                    Box::pin(async move {
                        let mut conn: AsyncPgConnection = establish_on(runtime, url).await?;
                        // enable_seqscan = off: on a table the planner believes tiny (new,
                        // never analysed, or analysed while small) a sequential scan is the
                        // cheapest read of one page, and every pooled connection's prepared
                        // statements keep that plan while the table grows. Off, every
                        // statement with an index to use uses it; one with none still scans.
                        // jit = off: such a scan's inflated cost would cross every JIT
                        // threshold, and compiling costs more than any short statement.
                        // (docs/design.md, "Plans that do not depend on statistics".)
                        conn.batch_execute(&format!(
                            "SET statement_timeout = {statement_timeout_ms}; \
                             SET TIME ZONE 'UTC'; SET application_name = 'paynotify'; \
                             SET enable_seqscan = off; SET jit = off"
                        ))
                        .await
                        .map_err(ConnectionError::CouldntSetupConfiguration)?;
                        writer::observe_pg(&writer, &mut conn).await;
                        Ok(conn)
                    })
                });
                let manager = AsyncDieselConnectionManager::new_with_config(pg_url, config);
                Pools::Postgres(Pool::builder(manager).max_size(size).build()?)
            }
            DatabaseUrl::Mysql(my_url) => {
                let mut config = ManagerConfig::<AsyncMysqlConnection>::default();
                // Unlike PostgreSQL's, a MySQL connection never reports itself broken
                // (diesel-async has no `is_broken` for it): with `Fast`, connections to a
                // server that restarted stay pooled and fail every statement until the
                // service restarts. Each one is checked on checkout (one round trip): the
                // dead and those to a server made read-only are dropped.
                config.recycling_method = connect::mysql_recycling();
                let lock_wait_secs = statement_timeout_ms.div_ceil(1000).max(1);
                let my_runtime = runtime.clone();
                let chosen = mysql_host.clone();
                let my_writer = writer.clone();
                config.custom_setup = Box::new(move |url| {
                    let (runtime, url) = (my_runtime.clone(), url.to_owned());
                    let chosen = chosen.clone();
                    let writer = my_writer.clone();
                    Box::pin(async move {
                        let mut conn = connect::establish_mysql(runtime, url, chosen).await?;
                        // UTC for DATETIME(6); READ COMMITTED so a statement after a
                        // duplicate-key error sees the winner's committed row (under
                        // REPEATABLE READ the transaction's snapshot could hide it); a row
                        // lock is waited for no longer than a statement may run.
                        conn.batch_execute(&format!(
                            "SET time_zone = '+00:00'; \
                             SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                             SET SESSION innodb_lock_wait_timeout = {lock_wait_secs}"
                        ))
                        .await
                        .map_err(ConnectionError::CouldntSetupConfiguration)?;
                        writer::observe_mysql(&writer, &mut conn).await;
                        Ok(conn)
                    })
                });
                let manager = AsyncDieselConnectionManager::new_with_config(my_url, config);
                Pools::Mysql(Pool::builder(manager).max_size(size).build()?)
            }
            DatabaseUrl::Sqlite(path) => {
                if let Some(dir) = Path::new(path)
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                {
                    std::fs::create_dir_all(dir).map_err(|source| StoreError::Directory {
                        path: dir.to_path_buf(),
                        source,
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
                Pools::Sqlite(Pool::builder(manager).max_size(size).build()?)
            }
        };
        Ok(Self {
            pools: std::sync::Arc::new(pools),
            url,
            acquire_timeout: Duration::from_millis(settings.acquire_timeout_ms),
            statement_timeout: Duration::from_millis(statement_timeout_ms),
            mysql_host,
            sync_wait_alert: Duration::from_millis(settings.sync_wait_alert_ms),
            runtime: store_runtime,
            group_max: settings.group_apply_max as usize,
            group: Default::default(),
            writer,
        })
    }

    pub fn backend(&self) -> &'static str {
        self.url.backend()
    }

    /// Applies pending migrations of this backend; returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<String>, StoreError> {
        let url = match &self.url {
            // The driver takes one host: the writer's.
            DatabaseUrl::Mysql(url) => DatabaseUrl::Mysql(
                connect::mysql_writer_url(self.runtime.clone(), url)
                    .await
                    .map_err(StoreError::MigrationConnect)?,
            ),
            url => url.clone(),
        };
        let run = move || -> Result<Vec<String>, StoreError> {
            let applied = match url {
                DatabaseUrl::Postgres(url) => {
                    let mut conn =
                        <AsyncConnectionWrapper<AsyncPgConnection> as Connection>::establish(&url)
                            .map_err(StoreError::MigrationConnect)?;
                    conn.run_pending_migrations(POSTGRES_MIGRATIONS)
                        .map_err(StoreError::Migration)?
                        .iter()
                        .map(ToString::to_string)
                        .collect()
                }
                DatabaseUrl::Mysql(url) => {
                    let mut conn =
                        <AsyncConnectionWrapper<AsyncMysqlConnection> as Connection>::establish(
                            &url,
                        )
                        .map_err(StoreError::MigrationConnect)?;
                    conn.run_pending_migrations(MYSQL_MIGRATIONS)
                        .map_err(StoreError::Migration)?
                        .iter()
                        .map(ToString::to_string)
                        .collect()
                }
                DatabaseUrl::Sqlite(path) => {
                    let mut conn =
                        SqliteConnection::establish(&path).map_err(StoreError::MigrationConnect)?;
                    conn.run_pending_migrations(SQLITE_MIGRATIONS)
                        .map_err(StoreError::Migration)?
                        .iter()
                        .map(ToString::to_string)
                        .collect()
                }
            };
            Ok(applied)
        };
        tokio::task::spawn_blocking(run).await?
    }

    /// Connections `(in use, idle, callers waiting)` of the pool.
    pub fn pool_status(&self) -> (usize, usize, usize) {
        let s = match &*self.pools {
            Pools::Postgres(pool) => pool.status(),
            Pools::Mysql(pool) => pool.status(),
            Pools::Sqlite(pool) => pool.status(),
        };
        (s.size.saturating_sub(s.available), s.available, s.waiting)
    }

    /// What group apply did since start-up (all zero when it is off).
    pub fn group_stats(&self) -> GroupCounts {
        self.group.get().map_or_else(GroupCounts::default, |group| {
            GroupCounts::from(&*group.stats)
        })
    }

    /// `SELECT 1` on a pooled connection: does the database answer?
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::sql_query("SELECT 1").execute(conn).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    /// A database error of no particular kind, as the drivers report many of them.
    fn db_error(message: &str) -> StoreError {
        StoreError::Query(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new(message.to_owned()),
        ))
    }

    /// Each of `unavailable` is a 503 (the database is away), each of `failed` a 500.
    fn assert_classified(unavailable: &[&str], failed: &[&str]) {
        for message in unavailable {
            assert!(db_error(message).is_unavailable(), "{message}");
        }
        for message in failed {
            assert!(!db_error(message).is_unavailable(), "{message}");
        }
    }

    /// What the MySQL driver said while a MariaDB of its own restarted, crashed and had the
    /// service's connections killed (scripts/chaos/mariadb-faults.sh): the database is away,
    /// a 503, never a 500.
    #[test]
    fn a_lost_mysql_connection_is_unavailable_not_an_error() {
        assert_classified(
            &[
                "Input/output error: Input/output error: Broken pipe (os error 32)",
                "Input/output error: Input/output error: Connection reset by peer (os error 104)",
                "Input/output error: Input/output error: Driver error: `Connection to the server is closed.'",
                "Server shutdown in progress",
                "Connection was killed",
            ],
            &[
                "Table 'paynotify.nope' doesn't exist",
                "You have an error in your SQL syntax",
                "Duplicate entry 'x' for key 'PRIMARY'",
            ],
        );
    }

    /// A server made read-only under the service (demoted, fenced): PostgreSQL 25006,
    /// MariaDB 1290 and 1836, a 503 (the provider retries; a writer may answer by then).
    #[test]
    fn a_server_made_read_only_is_unavailable_not_an_error() {
        assert_classified(
            &[
                "The MariaDB server is running with the --read-only option so it cannot execute this statement",
                "Running in read-only mode",
            ],
            &["Unknown column 'x' in 'field list'"],
        );
        let read_only = StoreError::Query(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ReadOnlyTransaction,
            Box::new("cannot execute INSERT in a read-only transaction".to_owned()),
        ));
        assert!(read_only.is_unavailable());
    }

    /// What PostgreSQL says when it ends a connection mid-statement
    /// (scripts/chaos/db-faults.sh: pg_terminate_backend, restarts).
    #[test]
    fn a_postgres_connection_ended_by_the_server_is_unavailable_not_an_error() {
        assert_classified(
            &[
                "terminating connection due to administrator command",
                "terminating connection because of crash of another server process",
                "the database system is starting up",
                "the database system is shutting down",
            ],
            &[
                "relation \"nope\" does not exist",
                "duplicate key value violates unique constraint \"local_message_topic_biz_key\"",
            ],
        );
    }
}
