//! What `/readyz` and `/metrics` say about the database: whether a writer answers, which
//! host it is, whether commits wait too long for a synchronous standby, and MariaDB/MySQL
//! semi-sync replication's state.

use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl};

use super::connect::{distrust_pooled, listed_hosts, says_failing_over};
use super::{Pools, Store, StoreError, acquire};
use crate::config::db_hosts::HostPort;

/// `database` in `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseState {
    /// A writer answers.
    Up,
    /// Nothing answers (one server listed).
    Down,
    /// No writer answers while several servers are listed, or the server answers but is
    /// read-only, in recovery or shutting down.
    FailingOver,
    /// A commit has waited longer than `database.sync_wait_alert_ms` for a synchronous
    /// standby (PostgreSQL `SyncRep`) or a semi-sync acknowledgement.
    Degraded,
}

impl DatabaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
            Self::FailingOver => "failing_over",
            Self::Degraded => "degraded",
        }
    }
}

/// The database's state and the host:port in use (never credentials; `None` for SQLite or
/// when not known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseStatus {
    pub state: DatabaseState,
    pub host: Option<String>,
}

#[derive(diesel::QueryableByName)]
struct PgProbe {
    #[diesel(sql_type = Bool)]
    writable: bool,
    #[diesel(sql_type = Nullable<Text>)]
    host: Option<String>,
    #[diesel(sql_type = Nullable<Integer>)]
    port: Option<i32>,
    #[diesel(sql_type = BigInt)]
    sync_wait_ms: i64,
}

/// One round trip: writable, the server's address, and the longest wait of a commit for a
/// synchronous standby among the sessions this user may see (the service's own).
const PG_PROBE: &str = "SELECT NOT pg_is_in_recovery() \
       AND current_setting('transaction_read_only') = 'off' AS writable, \
     host(inet_server_addr()) AS host, inet_server_port() AS port, \
     CAST(COALESCE((SELECT max(EXTRACT(EPOCH FROM clock_timestamp() - query_start)) * 1000 \
        FROM pg_stat_activity WHERE wait_event = 'SyncRep'), 0) AS BIGINT) AS sync_wait_ms";

#[derive(diesel::QueryableByName)]
struct MysqlProbe {
    #[diesel(sql_type = Bool)]
    writable: bool,
    #[diesel(sql_type = BigInt)]
    sync_wait_ms: i64,
}

/// Writable, and the longest wait for a semi-sync acknowledgement among the sessions this
/// user may see (whole seconds: the process list has no finer time on MySQL).
const MYSQL_PROBE: &str = "SELECT @@global.read_only = 0 AS writable, \
     CAST(COALESCE((SELECT MAX(TIME) FROM information_schema.PROCESSLIST \
        WHERE STATE LIKE 'Waiting for semi-sync ACK%'), 0) * 1000 AS SIGNED) AS sync_wait_ms";

#[derive(diesel::QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text, column_name = Variable_name)]
    name: String,
    #[diesel(sql_type = Text, column_name = Value)]
    value: String,
}

/// What one probe found.
struct Probe {
    writable: bool,
    host: Option<String>,
    sync_wait_ms: i64,
}

impl Store {
    /// Whether a writer answers, and where. A connection found on a read-only server is
    /// dropped from the pool; with several servers listed, a second connection is tried once
    /// (it goes to the writer, if one answers).
    pub async fn readiness(&self) -> DatabaseStatus {
        let hosts = listed_hosts(&self.url);
        let several = hosts.len() > 1;
        let mut last = None;
        for _attempt in 0..2 {
            let probe = match &*self.pools {
                Pools::Postgres(pool) => match acquire(pool.get(), self.acquire_timeout).await {
                    Ok(conn) => probe_pg(conn, &hosts).await,
                    Err(e) => Err(e),
                },
                Pools::Mysql(pool) => match acquire(pool.get(), self.acquire_timeout).await {
                    Ok(conn) => {
                        let host = self.mysql_host.lock().ok().and_then(|h| h.clone());
                        probe_mysql(conn, host).await
                    }
                    Err(e) => Err(e),
                },
                Pools::Sqlite(_) => {
                    return match self.ping().await {
                        Ok(()) => DatabaseStatus {
                            state: DatabaseState::Up,
                            host: None,
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, "readiness: database down");
                            DatabaseStatus {
                                state: DatabaseState::Down,
                                host: None,
                            }
                        }
                    };
                }
            };
            let status = match probe {
                Ok(probe) if !probe.writable => DatabaseStatus {
                    state: DatabaseState::FailingOver,
                    host: probe.host,
                },
                Ok(probe) => {
                    let waited = u64::try_from(probe.sync_wait_ms).unwrap_or(0);
                    let degraded = u128::from(waited) > self.sync_wait_alert.as_millis();
                    if degraded {
                        tracing::warn!(
                            waited_ms = waited,
                            "readiness: a commit waits for a synchronous standby"
                        );
                    }
                    return DatabaseStatus {
                        state: if degraded {
                            DatabaseState::Degraded
                        } else {
                            DatabaseState::Up
                        },
                        host: probe.host,
                    };
                }
                Err(e) => {
                    tracing::warn!(error = %e, "readiness: no writer answers");
                    let leaving = says_failing_over(&e.to_string());
                    DatabaseStatus {
                        state: if several || leaving {
                            DatabaseState::FailingOver
                        } else {
                            DatabaseState::Down
                        },
                        host: None,
                    }
                }
            };
            let retry = several && status.state == DatabaseState::FailingOver && last.is_none();
            last = Some(status);
            if !retry {
                break;
            }
        }
        last.unwrap_or(DatabaseStatus {
            state: DatabaseState::Down,
            host: None,
        })
    }

    /// MariaDB/MySQL semi-sync replication on this server: `Some(true)` while the primary
    /// waits for a replica's acknowledgement, `Some(false)` when it fell back to
    /// asynchronous replication, `None` when semi-sync is not enabled (or not MySQL).
    pub async fn semi_sync_active(&self) -> Result<Option<bool>, StoreError> {
        let Pools::Mysql(pool) = &*self.pools else {
            return Ok(None);
        };
        let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
        let conn: &mut AsyncMysqlConnection = &mut conn;
        let on = |s: &Setting, names: [&str; 2]| {
            names.iter().any(|n| s.name.eq_ignore_ascii_case(n))
                && s.value.eq_ignore_ascii_case("ON")
        };
        // MySQL 8.0.26+ says source where MariaDB and older MySQL say master.
        let variables: Vec<Setting> =
            diesel::sql_query("SHOW GLOBAL VARIABLES LIKE 'rpl_semi_sync_%enabled'")
                .load(conn)
                .await?;
        let enabled = [
            "rpl_semi_sync_master_enabled",
            "rpl_semi_sync_source_enabled",
        ];
        if !variables.iter().any(|s| on(s, enabled)) {
            return Ok(None);
        }
        let status: Vec<Setting> =
            diesel::sql_query("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_%status'")
                .load(conn)
                .await?;
        let active = ["Rpl_semi_sync_master_status", "Rpl_semi_sync_source_status"];
        Ok(Some(status.iter().any(|s| on(s, active))))
    }
}

async fn probe_pg(
    mut conn: Object<AsyncPgConnection>,
    hosts: &[HostPort],
) -> Result<Probe, StoreError> {
    let found: PgProbe = diesel::sql_query(PG_PROBE).get_result(&mut *conn).await?;
    // A Unix socket has no address: the one host listed, if only one.
    let host = match (found.host, found.port.and_then(|p| u16::try_from(p).ok())) {
        (Some(host), Some(port)) => Some(HostPort { host, port }.to_string()),
        _ if hosts.len() == 1 => Some(hosts[0].to_string()),
        _ => None,
    };
    if !found.writable {
        // Not handed out again; the other pooled connections are checked at checkout.
        drop(Object::take(conn));
        distrust_pooled();
    }
    Ok(Probe {
        writable: found.writable,
        host,
        sync_wait_ms: found.sync_wait_ms,
    })
}

async fn probe_mysql(
    mut conn: Object<AsyncMysqlConnection>,
    host: Option<String>,
) -> Result<Probe, StoreError> {
    let found: MysqlProbe = diesel::sql_query(MYSQL_PROBE)
        .get_result(&mut *conn)
        .await?;
    if !found.writable {
        drop(Object::take(conn));
    }
    Ok(Probe {
        writable: found.writable,
        host,
        sync_wait_ms: found.sync_wait_ms,
    })
}
