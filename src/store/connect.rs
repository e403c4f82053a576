//! Opening connections and keeping them across a failover.
//!
//! - PostgreSQL: the driver takes a URL listing several hosts and, with
//!   `target_session_attrs=read-write`, connects to the first that accepts writes
//!   (`config/db_hosts.rs` checks the URL and adds a default `connect_timeout`).
//! - MySQL/MariaDB: the driver takes one host; [`establish_mysql`] tries each host of the URL
//!   in order and keeps the first whose `@@global.read_only` is 0.
//! - A pooled connection to a server that became read-only or is going away is dropped, not
//!   handed out again: MySQL connections are checked on every checkout (one round trip, as the
//!   ping it replaces); PostgreSQL connections that the driver knows closed are dropped at
//!   checkout, and after any error saying the server refuses writes or is leaving
//!   ([`refuses_writes_or_leaving`]) every checkout for [`DISTRUST_FOR`] checks its connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::{ConnectionError, ConnectionResult};
use diesel_async::pooled_connection::RecyclingMethod;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl};

use super::{Store, StoreError, with_conn};
use crate::config::DatabaseUrl;
use crate::config::db_hosts::{HostPort, MysqlTargets, parse_hosts};

/// How long after an error saying a server refuses writes or is leaving every PostgreSQL
/// checkout checks its connection: long enough for every idle connection of the pool to be
/// checked out once under load.
pub const DISTRUST_FOR: Duration = Duration::from_secs(10);

/// Until when (milliseconds after [`epoch`]) PostgreSQL checkouts check their connection.
/// Process-wide: an error on one store costs another store of the process (tests run
/// several) at most one round trip per checkout for [`DISTRUST_FOR`].
static DISTRUST_UNTIL_MS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Pooled PostgreSQL connections are checked on checkout for the next [`DISTRUST_FOR`].
pub(crate) fn distrust_pooled() {
    let until = now_ms().saturating_add(u64::try_from(DISTRUST_FOR.as_millis()).unwrap_or(0));
    DISTRUST_UNTIL_MS.fetch_max(until, Ordering::Relaxed);
}

fn distrusting() -> bool {
    now_ms() < AtomicU64::load(&DISTRUST_UNTIL_MS, Ordering::Relaxed)
}

/// Whether `message` (a driver's or server's) says the server refuses writes or is going
/// away: the connection is not to be used again, and a writer may answer elsewhere.
pub(crate) fn says_failing_over(message: &str) -> bool {
    // PostgreSQL 25006 (read-only transaction), 57P01/57P02 (this connection ended by an
    // administrator or a crash), 57P03 (starting up, shutting down, in recovery, not
    // accepting connections).
    message.contains("read-only transaction")
        || message.starts_with("terminating connection")
        || message.contains("the database system is")
        // MariaDB/MySQL 1290 (`--read-only`, `--super-read-only`), 1836 (read-only mode),
        // 1792 (a READ ONLY transaction), and a server shutting down.
        || message.contains("--read-only")
        || message.contains("--super-read-only")
        || message.contains("read-only mode")
        || message.contains("READ ONLY transaction")
        || message.contains("Server shutdown in progress")
}

/// Whether a statement's error says the server refuses writes, is leaving, or the
/// connection is lost: see [`says_failing_over`]; I/O errors too.
pub(crate) fn refuses_writes_or_leaving(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(kind, info) => {
            matches!(
                kind,
                DatabaseErrorKind::ReadOnlyTransaction
                    | DatabaseErrorKind::ClosedConnection
                    | DatabaseErrorKind::UnableToSendCommand
            ) || says_failing_over(info.message())
                || super::is_mysql_connection_lost(info.message())
        }
        _ => false,
    }
}

#[derive(diesel::QueryableByName)]
struct Writable {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    writable: bool,
}

/// The error a recycling check returns for a connection to a server that refuses writes.
fn read_only_server() -> DieselError {
    DieselError::DatabaseError(
        DatabaseErrorKind::ReadOnlyTransaction,
        Box::new("the server is read-only or in recovery".to_owned()),
    )
}

/// PostgreSQL: no round trip on checkout (a closed connection is dropped by `is_broken`),
/// except while distrusting ([`distrust_pooled`]): then a connection to a server in recovery
/// or read-only is dropped.
pub(super) fn pg_recycling() -> RecyclingMethod<AsyncPgConnection> {
    RecyclingMethod::CustomFunction(Box::new(|conn| {
        Box::pin(async move {
            if !distrusting() {
                return Ok(());
            }
            let found: Writable = diesel::sql_query(
                "SELECT NOT pg_is_in_recovery() \
                 AND current_setting('transaction_read_only') = 'off' AS writable",
            )
            .get_result(conn)
            .await?;
            if found.writable {
                Ok(())
            } else {
                Err(read_only_server())
            }
        })
    }))
}

/// `@@global.read_only` is 0 (MySQL's `super_read_only` sets `read_only` too).
const MYSQL_WRITABLE: &str = "SELECT @@global.read_only = 0 AS writable";

async fn mysql_writable(conn: &mut AsyncMysqlConnection) -> Result<bool, DieselError> {
    let found: Writable = diesel::sql_query(MYSQL_WRITABLE).get_result(conn).await?;
    Ok(found.writable)
}

/// MySQL: one round trip on every checkout, as the ping it replaces, which also fails when
/// the server is read-only: a dead connection or one to a demoted server is dropped.
pub(super) fn mysql_recycling() -> RecyclingMethod<AsyncMysqlConnection> {
    RecyclingMethod::CustomFunction(Box::new(|conn| {
        Box::pin(async move {
            if mysql_writable(conn).await? {
                Ok(())
            } else {
                Err(read_only_server())
            }
        })
    }))
}

/// The host:port the newest MySQL connection went to, for `/readyz`.
pub(super) type ChosenHost = Arc<Mutex<Option<String>>>;

/// A MySQL connection to the first host of `url` that accepts writes, each tried within the
/// URL's `connect_timeout`; the read-only ones are closed. A URL with one host is used as
/// before, read-only or not (its statements then fail and are answered 503).
pub(super) async fn establish_mysql(
    runtime: Option<tokio::runtime::Handle>,
    url: String,
    chosen: ChosenHost,
) -> ConnectionResult<AsyncMysqlConnection> {
    let targets = MysqlTargets::parse(&url)
        .map_err(|e| ConnectionError::InvalidConnectionUrl(e.to_string()))?;
    let several = targets.servers.len() > 1;
    let mut failures = Vec::new();
    for (host, one) in targets.servers {
        let attempt = tokio::time::timeout(
            targets.connect_timeout,
            establish_on::<AsyncMysqlConnection>(runtime.clone(), one),
        )
        .await;
        let mut conn = match attempt {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) if !several => return Err(e),
            Ok(Err(e)) => {
                failures.push(format!("{host}: {e}"));
                continue;
            }
            Err(_) => {
                failures.push(format!(
                    "{host}: no answer within {} s",
                    targets.connect_timeout.as_secs()
                ));
                continue;
            }
        };
        if several {
            match mysql_writable(&mut conn).await {
                Ok(true) => {}
                Ok(false) => {
                    failures.push(format!("{host}: read-only"));
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{host}: {e}"));
                    continue;
                }
            }
        }
        if let Ok(mut slot) = chosen.lock() {
            *slot = Some(host.to_string());
        }
        return Ok(conn);
    }
    Err(ConnectionError::BadConnection(format!(
        "no MySQL server accepts writes: {}",
        failures.join("; ")
    )))
}

/// The one-host URL of the first server of `url` that accepts writes (for the migrations,
/// which open a connection of their own).
pub(super) async fn mysql_writer_url(
    runtime: Option<tokio::runtime::Handle>,
    url: &str,
) -> ConnectionResult<String> {
    let chosen = ChosenHost::default();
    drop(establish_mysql(runtime, url.to_owned(), chosen.clone()).await?);
    let host = chosen.lock().ok().and_then(|h| h.clone());
    let targets = MysqlTargets::parse(url)
        .map_err(|e| ConnectionError::InvalidConnectionUrl(e.to_string()))?;
    targets
        .servers
        .into_iter()
        .find(|(h, _)| Some(h.to_string()) == host)
        .map(|(_, one)| one)
        .ok_or_else(|| ConnectionError::BadConnection("no MySQL server accepts writes".into()))
}

/// The servers `database.url` lists (none for SQLite, or a PostgreSQL URL without a host).
pub(super) fn listed_hosts(url: &DatabaseUrl) -> Vec<HostPort> {
    let hosts_of = |url: &str, default_port| {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if hosts.is_empty() {
            Vec::new()
        } else {
            parse_hosts(hosts, default_port).unwrap_or_default()
        }
    };
    match url {
        DatabaseUrl::Postgres(url) => hosts_of(url, 5432),
        DatabaseUrl::Mysql(url) => hosts_of(url, 3306),
        DatabaseUrl::Sqlite(_) => Vec::new(),
    }
}

/// Opens every pooled connection on `runtime` (the one the store was built on), whichever
/// runtime asks the pool for it. A PostgreSQL connection's I/O task, and the blocking pool
/// an SQLite connection runs its statements on, belong to the runtime that opened it: one
/// opened on an HTTP worker's runtime would die with that worker at shutdown, and the relay,
/// which outlives the workers, would get `connection closed` or `task … was cancelled`
/// releasing its leases.
pub(super) async fn establish_on<C>(
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

/// Where a PostgreSQL URL points, for messages: never its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
}

impl PgTarget {
    /// Reads `postgres://[user[:password]@][host][:port][/database][?…]`; what is missing
    /// takes libpq's default (localhost, 5432, the user's name as the database).
    pub fn of(url: &str) -> Self {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let rest = rest.split(['?', '#']).next().unwrap_or("");
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = authority.rsplit_once('@').unwrap_or(("", authority));
        let user = userinfo.split(':').next().unwrap_or("");
        let (host, port) = match hostport.strip_prefix('[') {
            // [IPv6]:port
            Some(v6) => {
                let (h, p) = v6.split_once(']').unwrap_or((v6, ""));
                (h, p.strip_prefix(':').unwrap_or(""))
            }
            None => hostport.rsplit_once(':').unwrap_or((hostport, "")),
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let user = if user.is_empty() {
            "postgres".to_owned()
        } else {
            decode(user)
        };
        Self {
            host: if host.is_empty() {
                "localhost".to_owned()
            } else {
                decode(host)
            },
            port: port.parse().unwrap_or(5432),
            database: if path.is_empty() {
                user.clone()
            } else {
                decode(path)
            },
            user,
        }
    }
}

impl std::fmt::Display for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "host {}, port {}, database \"{}\", user \"{}\"",
            self.host, self.port, self.database, self.user
        )
    }
}

impl Store {
    /// One line for an operator when the database cannot be reached at start-up: where
    /// (host, port, database and user; never the password) and why. The PostgreSQL driver
    /// reports only "error connecting to server", so the cause of a failed connection is
    /// taken from a TCP connection attempt of our own (refused, no route, unknown host);
    /// when that succeeds the driver's message is the cause (authentication, missing
    /// database). `None` when `error` is not a connection failure.
    pub async fn unreachable_message(&self, error: &StoreError) -> Option<String> {
        let driver = match error {
            StoreError::Connect(e) => e.to_string(),
            StoreError::MigrationConnect(e) => e.to_string(),
            StoreError::Timeout(_) => error.to_string(),
            _ => return None,
        };
        Some(match &self.url {
            DatabaseUrl::Postgres(url) if listed_hosts(&self.url).len() > 1 => {
                let target = PgTarget::of(url);
                let hosts: Vec<String> = listed_hosts(&self.url)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!(
                    "cannot connect to a PostgreSQL server that accepts writes among {} \
                     (database \"{}\", user \"{}\"): {driver} (database.url)",
                    hosts.join(", "),
                    target.database,
                    target.user
                )
            }
            DatabaseUrl::Postgres(url) => {
                let target = PgTarget::of(url);
                let probe = tokio::time::timeout(
                    Duration::from_secs(3),
                    tokio::net::TcpStream::connect((target.host.as_str(), target.port)),
                )
                .await;
                let cause = match probe {
                    Ok(Ok(_)) => driver,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "no answer within 3 s".to_owned(),
                };
                format!("cannot connect to PostgreSQL at {target}: {cause} (database.url)")
            }
            DatabaseUrl::Mysql(_) => {
                let hosts: Vec<String> = listed_hosts(&self.url)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!(
                    "cannot connect to MySQL at {}: {driver} (database.url)",
                    hosts.join(", ")
                )
            }
            DatabaseUrl::Sqlite(path) => {
                format!("cannot open the SQLite database {path}: {driver} (database.url)")
            }
        })
    }

    /// Refuses a server this build cannot run on: the relay claims with
    /// `FOR UPDATE SKIP LOCKED`, which needs MySQL 8.0+ or MariaDB 10.6+.
    pub async fn check_server(&self) -> Result<(), StoreError> {
        #[derive(diesel::QueryableByName)]
        struct Version {
            #[diesel(sql_type = diesel::sql_types::Text)]
            version: String,
        }
        if !matches!(self.url, DatabaseUrl::Mysql(_)) {
            return Ok(());
        }
        let found: Version = with_conn!(self, conn => {
            diesel::sql_query("SELECT VERSION() AS version").get_result(conn).await?
        });
        if mysql_version_supported(&found.version) {
            Ok(())
        } else {
            Err(StoreError::UnsupportedServer(found.version))
        }
    }
}

/// Whether `SELECT VERSION()` names MySQL 8.0+ or MariaDB 10.6+.
fn mysql_version_supported(version: &str) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    if version.to_ascii_lowercase().contains("mariadb") {
        (major, minor) >= (10, 6)
    } else {
        major >= 8
    }
}

#[cfg(test)]
mod tests {
    use super::{PgTarget, mysql_version_supported, says_failing_over};

    #[test]
    fn a_postgres_target_names_host_port_database_and_user_but_never_the_password() {
        let t = PgTarget::of("postgres://app:pw-SECRET@db.internal:6543/pay?sslmode=disable");
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.database.as_str(),
                t.user.as_str()
            ),
            ("db.internal", 6543, "pay", "app")
        );
        let shown = t.to_string();
        assert!(!shown.contains("SECRET"), "{shown}");
        assert_eq!(
            shown,
            "host db.internal, port 6543, database \"pay\", user \"app\""
        );
        let t = PgTarget::of("postgresql://[::1]/x");
        assert_eq!(
            (t.host.as_str(), t.port, t.database.as_str()),
            ("::1", 5432, "x")
        );
        let t = PgTarget::of("postgres://bob@h");
        assert_eq!((t.port, t.database.as_str()), (5432, "bob"));
        let t = PgTarget::of("postgres://p%40ss:x@h:1/d");
        assert_eq!(t.user, "p@ss");
    }

    #[test]
    fn only_servers_with_skip_locked_are_supported() {
        for ok in [
            "10.11.19-MariaDB-0+deb12u1",
            "10.6.0-MariaDB",
            "11.4.2-MariaDB",
            "8.0.36",
            "8.4.0",
        ] {
            assert!(mysql_version_supported(ok), "{ok}");
        }
        for old in [
            "10.5.23-MariaDB",
            "5.7.44-log",
            "10.3.39-MariaDB",
            "garbage",
        ] {
            assert!(!mysql_version_supported(old), "{old}");
        }
    }

    /// What PostgreSQL and MariaDB say when a server is demoted, fenced or stopping: the
    /// connection is dropped from the pool and a writer is looked for.
    #[test]
    fn a_server_refusing_writes_or_leaving_is_recognised() {
        for message in [
            "cannot execute INSERT in a read-only transaction",
            "terminating connection due to administrator command",
            "the database system is shutting down",
            "the database system is in recovery mode",
            "The MariaDB server is running with the --read-only option so it cannot execute this statement",
            "The MySQL server is running with the --super-read-only option so it cannot execute this statement",
            "Running in read-only mode",
            "Cannot execute statement in a READ ONLY transaction.",
            "Server shutdown in progress",
        ] {
            assert!(says_failing_over(message), "{message}");
        }
        for message in [
            "relation \"nope\" does not exist",
            "Duplicate entry 'x' for key 'PRIMARY'",
            "canceling statement due to statement timeout",
        ] {
            assert!(!says_failing_over(message), "{message}");
        }
    }
}
