//! Which server is the database's writer, and noticing when that changes: a failover.
//!
//! Every new pooled connection reads the identity of the server it reached (one small query
//! per connection, none per notification): PostgreSQL's `system_identifier` and timeline
//! (a standby promoted from `pg_basebackup` keeps the identifier and starts a new timeline),
//! MySQL's `server_uuid`, MariaDB's `server_id`, host name and port (MariaDB has no
//! `server_uuid`). SQLite has one file and no writer to change.
//!
//! The first identity is only remembered. Another one later is a failover: logged once,
//! counted, the writer's tag ([`Writer::tag`], a stable hash every instance computes alike)
//! changes, and [`Writer::subscribe`] wakes whoever waits for it. Answers cached under the old
//! tag (the Redis gate, each instance's memory of recent answers) are no longer trusted, and
//! the orders this instance acknowledged in `database.failover_recheck_secs` before it are
//! checked again (`reconcile/failover.rs`), because an asynchronous standby may not have them.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use diesel::sql_types::Text;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection, SimpleAsyncConnection};
use prometheus::IntCounter;
use tokio::sync::watch;

use super::{Pools, Store, StoreError, with_conn};

/// Most acknowledged orders remembered for the recheck; beyond it the oldest are dropped (and
/// counted: [`Writer::dropped`]). About 80 bytes each.
pub const ACKNOWLEDGED_MAX: usize = 200_000;

/// How far the outbox's row ids jump on a failover: past every id the old writer could have
/// handed out that the new one never saw.
pub const OUTBOX_ID_JUMP: i64 = 1_000_000;

/// PostgreSQL: the cluster and its timeline (the first 8 hex digits of a WAL file name).
const PG_IDENTITY: &str = "SELECT (SELECT system_identifier::text FROM pg_control_system()) \
     || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS identity";
/// PostgreSQL, when `pg_control_system()` is not granted to this user: the server's address
/// and port, and the timeline.
const PG_IDENTITY_FALLBACK: &str = "SELECT coalesce(host(inet_server_addr()), 'local') || ':' \
     || coalesce(inet_server_port()::text, '') \
     || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS identity";
/// MySQL 5.6+: a UUID of its own per server.
const MYSQL_IDENTITY: &str = "SELECT CAST(@@server_uuid AS CHAR) AS identity";
/// MariaDB (no `server_uuid`): the replication id, unique among a primary and its replicas,
/// and where the server runs.
const MARIADB_IDENTITY: &str =
    "SELECT CAST(CONCAT(@@server_id, '@', @@hostname, ':', @@port) AS CHAR) AS identity";

/// Which identity statement a backend answers (learnt from the first connection).
const UNTRIED: u8 = 0;
const FIRST: u8 = 1;
const SECOND: u8 = 2;

#[derive(diesel::QueryableByName)]
struct Identity {
    #[diesel(sql_type = Text)]
    identity: String,
}

/// A change of writer, as this instance noticed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// The identity before, and after.
    pub from: String,
    pub to: String,
    /// When this instance noticed it (the first connection to the new writer).
    pub at: Instant,
    /// Failovers noticed since start-up, this one included.
    pub count: u64,
}

/// The writer this instance talks to, and what it acknowledged under it.
pub struct Writer {
    current: Mutex<Current>,
    /// [`tag_of`] the current identity; 0 before the first is known.
    tag: AtomicU64,
    failovers: AtomicU64,
    changes: watch::Sender<Option<Failover>>,
    /// Which of the two statements of a backend identifies its server ([`UNTRIED`], …).
    statement: AtomicU8,
    acknowledged: Mutex<VecDeque<(Instant, Box<str>)>>,
    /// `database.failover_recheck_secs`; zero: nothing is remembered.
    window: Duration,
    capacity: usize,
    dropped: AtomicU64,
    /// `paynotify_database_failovers_total` and `paynotify_failover_recheck_forgotten_total`,
    /// once the service's metrics exist.
    counters: OnceLock<(IntCounter, IntCounter)>,
}

#[derive(Default)]
struct Current {
    /// What the connections report.
    reported: Option<String>,
    /// Set by [`Writer::simulate_failover`]: appended to every identity reported.
    disguise: Option<String>,
    /// The identity in force (`reported`, and the disguise).
    identity: Option<String>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("tag", &self.tag())
            .field("failovers", &self.failovers())
            .finish_non_exhaustive()
    }
}

/// A stable 64-bit hash of an identity (FNV-1a), the same in every instance and every build,
/// never 0 (which means "not known yet").
pub fn tag_of(identity: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in identity.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash.max(1)
}

impl Writer {
    /// A writer not known yet, remembering acknowledged orders for `window`, at most
    /// `capacity` of them.
    pub fn new(window: Duration, capacity: usize) -> Self {
        Self {
            current: Mutex::new(Current::default()),
            tag: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            changes: watch::Sender::new(None),
            statement: AtomicU8::new(UNTRIED),
            acknowledged: Mutex::new(VecDeque::new()),
            window,
            capacity,
            dropped: AtomicU64::new(0),
            counters: OnceLock::new(),
        }
    }

    /// Counts failovers and forgotten acknowledgements into these counters from now on (and
    /// what was counted before).
    pub fn count_into(&self, failovers: IntCounter, forgotten: IntCounter) {
        failovers.inc_by(self.failovers());
        forgotten.inc_by(self.dropped());
        let _ = self.counters.set((failovers, forgotten));
    }

    /// The current writer's tag: answers cached under another one were written before a
    /// failover. 0 before the first connection.
    pub fn tag(&self) -> u64 {
        self.tag.load(Ordering::Acquire)
    }

    /// The current writer's identity, if a connection reported one.
    pub fn identity(&self) -> Option<String> {
        self.current.lock().ok().and_then(|c| c.identity.clone())
    }

    /// Which identity statement the server answered ([`UNTRIED`], [`FIRST`], [`SECOND`]).
    fn learnt(&self) -> u8 {
        self.statement.load(Ordering::Relaxed)
    }

    fn learn(&self, which: u8) {
        self.statement.store(which, Ordering::Relaxed);
    }

    /// Failovers noticed since start-up.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Acknowledged orders forgotten early because [`ACKNOWLEDGED_MAX`] were remembered.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The last failover, and every later one as it is noticed.
    pub fn subscribe(&self) -> watch::Receiver<Option<Failover>> {
        self.changes.subscribe()
    }

    /// What a new connection reported. Returns the failover when it names another writer
    /// than the last one.
    pub fn observe(&self, reported: &str) -> Option<Failover> {
        let Ok(mut current) = self.current.lock() else {
            return None;
        };
        current.reported = Some(reported.to_owned());
        self.settle(&mut current)
    }

    /// From now on the writer is the one reported with `/label` appended, as if every
    /// connection named another server: a failover without a second server, for drills and
    /// tests. Connections reporting the same server afterwards change nothing.
    #[doc(hidden)]
    pub fn simulate_failover(&self, label: &str) -> Option<Failover> {
        let Ok(mut current) = self.current.lock() else {
            return None;
        };
        if current.identity.is_none() {
            // Nothing reported yet (SQLite never does): the writer so far is "unknown".
            current.identity = Some("unknown".to_owned());
        }
        current.disguise = Some(label.to_owned());
        self.settle(&mut current)
    }

    fn settle(&self, current: &mut Current) -> Option<Failover> {
        let reported = current.reported.as_deref().unwrap_or("unknown");
        let identity = match &current.disguise {
            Some(label) => format!("{reported}/{label}"),
            None => reported.to_owned(),
        };
        let from = match &current.identity {
            Some(known) if *known == identity => return None,
            known => known.clone(),
        };
        self.tag.store(tag_of(&identity), Ordering::Release);
        current.identity = Some(identity.clone());
        let Some(from) = from else {
            tracing::info!(writer = %identity, "database writer");
            return None;
        };
        let count = self.failovers.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some((failovers, _)) = self.counters.get() {
            failovers.inc();
        }
        tracing::warn!(
            from = %from,
            to = %identity,
            "the database writer changed (a failover): answers cached before it are not \
             trusted, and orders acknowledged in database.failover_recheck_secs before it \
             are checked against the new writer and the provider"
        );
        let failover = Failover {
            from,
            to: identity,
            at: Instant::now(),
            count,
        };
        self.changes.send_replace(Some(failover.clone()));
        Some(failover)
    }

    /// Remembers that this instance answered a notification of `order_no` 2xx.
    pub fn acknowledged(&self, order_no: &str) {
        if self.window.is_zero() || self.capacity == 0 {
            return;
        }
        let now = Instant::now();
        let Ok(mut remembered) = self.acknowledged.lock() else {
            return;
        };
        if let Some(last) = remembered.back_mut()
            && *last.1 == *order_no
        {
            last.0 = now;
            return;
        }
        while remembered
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > self.window)
        {
            remembered.pop_front();
        }
        if remembered.len() >= self.capacity {
            remembered.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
            if let Some((_, forgotten)) = self.counters.get() {
                forgotten.inc();
            }
        }
        remembered.push_back((now, order_no.into()));
    }

    /// Every order acknowledged from `database.failover_recheck_secs` before `at` on, once
    /// each, oldest first.
    pub fn acknowledged_since_window_before(&self, at: Instant) -> Vec<String> {
        let from = at.checked_sub(self.window);
        let Ok(remembered) = self.acknowledged.lock() else {
            return Vec::new();
        };
        let mut seen = HashSet::new();
        remembered
            .iter()
            .filter(|(when, _)| from.is_none_or(|from| *when >= from))
            .filter(|(_, order)| seen.insert(order.clone()))
            .map(|(_, order)| order.to_string())
            .collect()
    }
}

/// Reads a PostgreSQL connection's server identity into `writer`. A server that cannot say
/// (a standby, whose WAL position is not its own) is left out.
pub(crate) async fn observe_pg(writer: &Writer, conn: &mut AsyncPgConnection) {
    use diesel_async::RunQueryDsl;
    let order = writer.learnt();
    let statements = if order == SECOND {
        [PG_IDENTITY_FALLBACK, PG_IDENTITY_FALLBACK]
    } else {
        [PG_IDENTITY, PG_IDENTITY_FALLBACK]
    };
    for (i, statement) in statements.into_iter().enumerate() {
        match diesel::sql_query(statement)
            .get_result::<Identity>(conn)
            .await
        {
            Ok(found) => {
                if i == 1 && order != SECOND {
                    tracing::info!(
                        "pg_control_system() is not granted to this user: the writer is \
                         identified by its address, port and timeline"
                    );
                    writer.learn(SECOND);
                } else if order == UNTRIED {
                    writer.learn(FIRST);
                }
                writer.observe(&found.identity);
                return;
            }
            Err(e) => tracing::debug!(error = %e, "writer identity not read"),
        }
    }
}

/// Reads a MySQL/MariaDB connection's server identity into `writer`.
pub(crate) async fn observe_mysql(writer: &Writer, conn: &mut AsyncMysqlConnection) {
    use diesel_async::RunQueryDsl;
    let order = writer.learnt();
    let statements = if order == SECOND {
        [MARIADB_IDENTITY, MARIADB_IDENTITY]
    } else {
        [MYSQL_IDENTITY, MARIADB_IDENTITY]
    };
    for (i, statement) in statements.into_iter().enumerate() {
        match diesel::sql_query(statement)
            .get_result::<Identity>(conn)
            .await
        {
            Ok(found) => {
                let learnt = if i == 1 { SECOND } else { FIRST };
                if order == UNTRIED || learnt == SECOND {
                    writer.learn(learnt);
                }
                writer.observe(&found.identity);
                return;
            }
            Err(e) => tracing::debug!(error = %e, "writer identity not read"),
        }
    }
}

impl Store {
    /// The database's writer: its tag, its failovers, and the orders acknowledged under it.
    pub fn writer(&self) -> &std::sync::Arc<Writer> {
        &self.writer
    }

    /// After a failover: moves the outbox's id sequence [`OUTBOX_ID_JUMP`] past what the new
    /// writer has handed out, so no row id the old writer gave (and a consumer may have seen)
    /// is given again. Returns the next id. SQLite: nothing (`None`).
    pub async fn advance_outbox_ids(&self) -> Result<Option<i64>, StoreError> {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Next {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            next: i64,
        }
        match &*self.pools {
            Pools::Sqlite(_) => Ok(None),
            Pools::Postgres(_) => {
                let found: Next = with_conn!(self, conn => {
                    diesel::sql_query(format!(
                        "SELECT setval('local_message_id_seq', \
                         nextval('local_message_id_seq') + {OUTBOX_ID_JUMP}) + 1 AS next"
                    ))
                    .get_result(conn)
                    .await?
                });
                Ok(Some(found.next))
            }
            Pools::Mysql(_) => {
                let next = with_conn!(self, conn => {
                    let found: Next = diesel::sql_query(
                        "SELECT CAST(COALESCE(MAX(id), 0) AS SIGNED) AS next FROM local_message",
                    )
                    .get_result(conn)
                    .await?;
                    let next = found.next.saturating_add(OUTBOX_ID_JUMP + 1);
                    // The text protocol: DDL takes no bound values.
                    conn.batch_execute(&format!(
                        "ALTER TABLE local_message AUTO_INCREMENT = {next}"
                    ))
                    .await?;
                    next
                });
                Ok(Some(next))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_identity_is_remembered_and_another_is_a_failover() {
        let writer = Writer::new(Duration::from_secs(600), 10);
        let mut changes = writer.subscribe();
        assert_eq!(writer.tag(), 0);
        assert!(writer.observe("7715209407193585815/00000001").is_none());
        let first = writer.tag();
        assert_ne!(first, 0);
        assert!(writer.observe("7715209407193585815/00000001").is_none());
        assert_eq!(writer.failovers(), 0);
        assert!(!changes.has_changed().unwrap_or(true));

        // A standby promoted from a base backup: the same cluster, a new timeline.
        let failover = writer
            .observe("7715209407193585815/00000002")
            .expect("a new timeline is a failover");
        assert_eq!(failover.from, "7715209407193585815/00000001");
        assert_eq!(failover.to, "7715209407193585815/00000002");
        assert_eq!(failover.count, 1);
        assert_ne!(writer.tag(), first);
        assert_eq!(writer.failovers(), 1);
        assert!(changes.has_changed().unwrap_or(false));
        assert_eq!(
            changes.borrow_and_update().as_ref().map(|f| f.count),
            Some(1)
        );
    }

    #[test]
    fn tags_are_stable_and_never_zero() {
        assert_eq!(tag_of("a"), tag_of("a"));
        assert_ne!(tag_of("a"), tag_of("b"));
        // FNV-1a of the empty string: the offset basis, the same in every build.
        assert_eq!(tag_of(""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(tag_of(""), 0);
    }

    #[test]
    fn a_simulated_failover_holds_while_connections_report_the_same_server() {
        let writer = Writer::new(Duration::from_secs(600), 10);
        writer.observe("1@db1:3306");
        let before = writer.tag();
        let failover = writer.simulate_failover("drill").expect("a failover");
        assert_eq!(failover.to, "1@db1:3306/drill");
        let after = writer.tag();
        assert_ne!(before, after);
        assert!(writer.observe("1@db1:3306").is_none());
        assert_eq!((writer.tag(), writer.failovers()), (after, 1));
    }

    #[test]
    fn acknowledged_orders_are_bounded_oldest_dropped_and_listed_once() {
        let writer = Writer::new(Duration::from_secs(600), 3);
        for order in ["a", "b", "b", "a", "c", "d"] {
            writer.acknowledged(order);
        }
        // a, b, a, c, d: two dropped for the bound of 3.
        assert_eq!(writer.dropped(), 2);
        assert_eq!(
            writer.acknowledged_since_window_before(Instant::now()),
            vec!["a", "c", "d"]
        );
    }

    #[test]
    fn acknowledged_orders_older_than_the_window_are_not_listed() {
        let writer = Writer::new(Duration::from_millis(20), 10);
        writer.acknowledged("old");
        std::thread::sleep(Duration::from_millis(40));
        writer.acknowledged("new");
        assert_eq!(
            writer.acknowledged_since_window_before(Instant::now()),
            vec!["new"]
        );
        let off = Writer::new(Duration::ZERO, 10);
        off.acknowledged("x");
        assert!(
            off.acknowledged_since_window_before(Instant::now())
                .is_empty()
        );
    }
}
