//! Day partitions of the tables the retention job empties (PostgreSQL, MySQL/MariaDB):
//! created ahead, dropped whole once wholly past their window (docs/design.md, "Partitions").
//! SQLite has none; its rows go by batched deletes.
//!
//! A partition's name carries its bounds, set by the migration or by this job and read back
//! here, so no bound is parsed out of the catalog:
//! - `<table>_before_YYYYMMDD`: everything before that day (the rows there at the migration);
//! - `<table>_YYYYMMDD`: up to the end of that UTC day (on PostgreSQL from its start; on MySQL
//!   from the previous partition's end, as `RANGE COLUMNS … LESS THAN` reads);
//! - `<table>_future`: the default (PostgreSQL) or `LESS THAN (MAXVALUE)` (MySQL): rows no day
//!   covers yet, moved into their day when it is created. No insert ever fails for want of
//!   a partition.
//!
//! On PostgreSQL each change is one multi-statement query, which the server runs as one
//! implicit transaction: it commits whole or not at all. DDL waits at most
//! [`LOCK_TIMEOUT_MS`] ([`LOCK_WAIT_SECS`] on MySQL) for its lock (a `DROP` or
//! `CREATE … PARTITION OF` takes a brief exclusive lock on the parent, and writes queue behind
//! it meanwhile); one that times out is tried again next run. One instance at a time does the
//! work (an advisory lock, `GET_LOCK` on MySQL); another finding it taken does nothing.

use chrono::{Days, NaiveDate};
use diesel::sql_types::{BigInt, Text};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

use super::{Dialect, Store, StoreError, with_conn};
use crate::time::Timestamp;

/// A table kept in day partitions of `column`.
#[derive(Debug, Clone, Copy)]
pub struct Partitioned {
    pub table: &'static str,
    pub column: &'static str,
    /// Rows that must outlive their partition's window (the outbox's pending and dead
    /// messages): a partition holding some is never dropped; on PostgreSQL it is rebuilt with
    /// only those, on MySQL kept while the batched delete empties its other rows.
    pub held: Option<&'static str>,
}

/// The outbox: sent messages go with their day; pending and dead ones stay until sent.
pub const OUTBOX: Partitioned = Partitioned {
    table: "local_message",
    column: "created_at",
    held: Some("status <> 1"),
};

/// What arrived at the notify URLs.
pub const RECEIPTS: Partitioned = Partitioned {
    table: "notify_receipt",
    column: "received_at",
    held: None,
};

/// Days of partitions kept ready beyond today.
pub const AHEAD_DAYS: u64 = 3;
/// How long a partition's DDL waits for its lock on PostgreSQL: new writes to the table queue
/// behind a waiting `LOCK`/`DROP`/`CREATE … PARTITION OF`, so at most this long.
pub const LOCK_TIMEOUT_MS: u32 = 200;
/// The same on MySQL (`lock_wait_timeout`, whole seconds).
pub const LOCK_WAIT_SECS: u32 = 1;

/// What one run did to one table's partitions.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Maintained {
    pub created: Vec<String>,
    pub dropped: Vec<String>,
    /// Past their window but holding rows that must stay: rebuilt with only those.
    pub compacted: Vec<String>,
    /// Past their window, holding only rows that must stay: left as they are.
    pub kept: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Before(NaiveDate),
    Day(NaiveDate),
    Future,
}

impl Part {
    /// The partition's end (exclusive), as a day: `None` for the future partition.
    fn end(self) -> Option<NaiveDate> {
        match self {
            Part::Before(d) => Some(d),
            Part::Day(d) => d.checked_add_days(Days::new(1)),
            Part::Future => None,
        }
    }
}

/// The partition a name of `table`'s stands for; `None` for a name not of this scheme.
fn parse(table: &str, name: &str) -> Option<Part> {
    let rest = name.strip_prefix(table)?.strip_prefix('_')?;
    let day = |s: &str| NaiveDate::parse_from_str(s, "%Y%m%d").ok();
    match rest {
        "future" => Some(Part::Future),
        _ => match rest.strip_prefix("before_") {
            Some(d) => day(d).map(Part::Before),
            None => day(rest).map(Part::Day),
        },
    }
}

fn day_name(table: &str, day: NaiveDate) -> String {
    format!("{table}_{}", day.format("%Y%m%d"))
}

/// A day's start as a literal both backends read as UTC (sessions run in UTC).
fn literal(day: NaiveDate, dialect: Dialect) -> String {
    match dialect {
        Dialect::Postgres => format!("'{} 00:00:00+00'", day.format("%Y-%m-%d")),
        _ => format!("'{} 00:00:00'", day.format("%Y-%m-%d")),
    }
}

#[derive(diesel::QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

const LIST_POSTGRES: &str = "SELECT c.relname::text AS name FROM pg_inherits i \
     JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)";
/// The lock that lets one instance at a time keep the partitions (released at the end of
/// each run, held by that connection's session meanwhile; PostgreSQL's advisory locks are
/// the database's own).
const LOCK_POSTGRES: &str = "SELECT CASE WHEN pg_try_advisory_lock(hashtext('paynotify.partitions')) THEN 1 ELSE 0 END::bigint AS n";
const UNLOCK_POSTGRES: &str = "SELECT pg_advisory_unlock(hashtext('paynotify.partitions'))";
/// MySQL's lock names are server-wide: this one names the database.
const LOCK_MYSQL: &str = "SELECT CAST(COALESCE(GET_LOCK(CONCAT('paynotify.partitions.', DATABASE()), 0), 0) AS SIGNED) AS n";
const UNLOCK_MYSQL: &str = "DO RELEASE_LOCK(CONCAT('paynotify.partitions.', DATABASE()))";
const LIST_MYSQL: &str = "SELECT PARTITION_NAME AS name FROM information_schema.PARTITIONS \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL";

impl Store {
    /// Keeps `spec`'s day partitions: every day from today through [`AHEAD_DAYS`] ahead
    /// created (with the rows the future partition holds for it), and, when `cutoff` is
    /// given, every partition that ends at or before it dropped — or, if it holds rows that
    /// must stay, rebuilt with only those. Nothing on a backend or table without partitions.
    pub async fn maintain_partitions(
        &self,
        spec: Partitioned,
        now: Timestamp,
        cutoff: Option<Timestamp>,
    ) -> Result<Maintained, StoreError> {
        let mut done = Maintained::default();
        let today = now.as_datetime().date_naive();
        with_conn!(self, conn, dialect => {
            let (lock, unlock) = match dialect {
                Dialect::Postgres => (LOCK_POSTGRES, UNLOCK_POSTGRES),
                Dialect::Mysql => (LOCK_MYSQL, UNLOCK_MYSQL),
                Dialect::Sqlite => return Ok(done),
            };
            // One instance at a time: another one at it now does this run's work.
            let held: Vec<Count> = diesel::sql_query(lock).load(conn).await?;
            if !held.iter().any(|c| c.n > 0) {
                return Ok(done);
            }
            let result: Result<Maintained, StoreError> = async {
            let names: Vec<Name> = match dialect {
                Dialect::Postgres => diesel::sql_query(LIST_POSTGRES).bind::<Text, _>(spec.table).load(conn).await?,
                _ => diesel::sql_query(LIST_MYSQL).bind::<Text, _>(spec.table).load(conn).await?,
            };
            let mut parts: Vec<(String, Part)> = names
                .into_iter()
                .filter_map(|n| parse(spec.table, &n.name).map(|p| (n.name, p)))
                .collect();
            if !parts.iter().any(|(_, p)| *p == Part::Future) {
                return Ok(done);
            }
            parts.sort_by_key(|(_, p)| p.end().unwrap_or(NaiveDate::MAX));

            // Ahead: the days from the last partition's end (or from the window's start, or
            // today when no window is given, if later) through AHEAD_DAYS after today.
            let last_end = parts.iter().filter_map(|(_, p)| p.end()).max();
            let first = cutoff.map_or(today, |c| c.as_datetime().date_naive().min(today));
            let mut day = last_end.map_or(first, |e| e.max(first));
            let until = today.checked_add_days(Days::new(AHEAD_DAYS)).unwrap_or(today);
            let mut days = Vec::new();
            while day <= until {
                days.push(day);
                match day.checked_add_days(Days::new(1)) {
                    Some(next) => day = next,
                    None => break,
                }
            }
            if !days.is_empty() {
                let (table, column) = (spec.table, spec.column);
                match dialect {
                    Dialect::Postgres => {
                        for &day in &days {
                            let (name, lo) = (day_name(table, day), literal(day, dialect));
                            let hi = literal(day.checked_add_days(Days::new(1)).unwrap_or(day), dialect);
                            let sql = format!(
                                "SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'; \
                                 LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE; \
                                 CREATE TEMP TABLE moving (LIKE {table}) ON COMMIT DROP; \
                                 WITH m AS (DELETE FROM {table}_future WHERE {column} >= {lo} AND {column} < {hi} RETURNING *) \
                                   INSERT INTO moving SELECT * FROM m; \
                                 CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} FOR VALUES FROM ({lo}) TO ({hi}); \
                                 INSERT INTO {table} SELECT * FROM moving;"
                            );
                            conn.batch_execute(&sql).await?;
                            done.created.push(name);
                        }
                    }
                    _ => {
                        let mut into: Vec<String> = days
                            .iter()
                            .map(|&day| {
                                let hi = literal(day.checked_add_days(Days::new(1)).unwrap_or(day), dialect);
                                format!("PARTITION {} VALUES LESS THAN ({hi})", day_name(table, day))
                            })
                            .collect();
                        into.push(format!("PARTITION {table}_future VALUES LESS THAN (MAXVALUE)"));
                        mysql_ddl(conn, &format!(
                            "ALTER TABLE {table} REORGANIZE PARTITION {table}_future INTO ({})",
                            into.join(", ")
                        )).await?;
                        done.created.extend(days.iter().map(|&d| day_name(table, d)));
                    }
                }
            }

            // Past: partitions that end at or before the cutoff.
            let Some(cutoff) = cutoff else { return Ok(done) };
            for (name, part) in parts {
                let Some(end) = part.end() else { continue };
                if end.and_hms_opt(0, 0, 0).map(|e| e.and_utc()) > Some(cutoff.as_datetime()) {
                    continue;
                }
                let from = match dialect {
                    Dialect::Mysql => format!("{} PARTITION ({name})", spec.table),
                    _ => name.clone(),
                };
                let holds = |filter: &str| {
                    format!("SELECT count(*) AS n FROM (SELECT 1 FROM {from} WHERE {filter} LIMIT 1) x")
                };
                let Some(held) = spec.held else {
                    drop_partition(conn, dialect, spec.table, &name).await?;
                    done.dropped.push(name);
                    continue;
                };
                let has = |rows: Vec<Count>| rows.iter().any(|c| c.n > 0);
                if !has(diesel::sql_query(holds(held)).load(conn).await?) {
                    drop_partition(conn, dialect, spec.table, &name).await?;
                    done.dropped.push(name);
                } else if dialect == Dialect::Postgres
                    && has(diesel::sql_query(holds(&format!("NOT ({held})"))).load(conn).await?)
                {
                    compact(conn, spec, &name, part, held).await?;
                    done.compacted.push(name);
                } else {
                    done.kept.push(name);
                }
            }
            Ok(done)
            }
            .await;
            conn.batch_execute(unlock).await?;
            result
        })
    }
}

/// Runs one MySQL DDL statement waiting at most [`LOCK_WAIT_SECS`] for its metadata
/// lock, then gives the pooled session its default wait back.
async fn mysql_ddl<C: SimpleAsyncConnection + Send>(
    conn: &mut C,
    sql: &str,
) -> Result<(), diesel::result::Error> {
    conn.batch_execute(&format!("SET SESSION lock_wait_timeout = {LOCK_WAIT_SECS}"))
        .await?;
    let result = conn.batch_execute(sql).await;
    conn.batch_execute("SET SESSION lock_wait_timeout = DEFAULT")
        .await?;
    result
}

async fn drop_partition<C>(
    conn: &mut C,
    dialect: Dialect,
    table: &str,
    name: &str,
) -> Result<(), diesel::result::Error>
where
    C: SimpleAsyncConnection + Send,
{
    match dialect {
        Dialect::Mysql => {
            mysql_ddl(conn, &format!("ALTER TABLE {table} DROP PARTITION {name}")).await
        }
        _ => {
            let sql = format!(
                "SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'; \
                 ALTER TABLE {table} DETACH PARTITION {name}; DROP TABLE {name};"
            );
            conn.batch_execute(&sql).await
        }
    }
}

/// Rebuilds partition `name` with only its `held` rows, on PostgreSQL, in one transaction:
/// the table and the partition locked first (so no change made meanwhile is undone), the rows
/// copied aside, the partition dropped and created again, the rows put back. (MySQL keeps such
/// a partition as it is, and the batched delete empties its sent rows: a copy and an
/// `EXCHANGE PARTITION` would undo what changed in between, a redrive among it.)
async fn compact<C>(
    conn: &mut C,
    spec: Partitioned,
    name: &str,
    part: Part,
    held: &str,
) -> Result<(), diesel::result::Error>
where
    C: SimpleAsyncConnection + Send,
{
    let table = spec.table;
    let dialect = Dialect::Postgres;
    let bounds = match part {
        Part::Before(end) => format!("FROM (MINVALUE) TO ({})", literal(end, dialect)),
        Part::Day(day) => format!(
            "FROM ({}) TO ({})",
            literal(day, dialect),
            literal(part.end().unwrap_or(day), dialect)
        ),
        Part::Future => return Ok(()),
    };
    let sql = format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'; \
         LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE; \
         CREATE TEMP TABLE held (LIKE {table}) ON COMMIT DROP; \
         INSERT INTO held SELECT * FROM {name} WHERE {held}; \
         ALTER TABLE {table} DETACH PARTITION {name}; DROP TABLE {name}; \
         CREATE TABLE {name} PARTITION OF {table} FOR VALUES {bounds}; \
         INSERT INTO {table} SELECT * FROM held;"
    );
    conn.batch_execute(&sql).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap_or(NaiveDate::MIN)
    }

    #[test]
    fn names_carry_their_bounds() {
        let t = "local_message";
        assert_eq!(parse(t, "local_message_future"), Some(Part::Future));
        assert_eq!(
            parse(t, "local_message_before_20261203"),
            Some(Part::Before(d("2026-12-03")))
        );
        assert_eq!(
            parse(t, "local_message_20261130"),
            Some(Part::Day(d("2026-11-30")))
        );
        assert_eq!(Part::Day(d("2026-12-31")).end(), Some(d("2027-01-01")));
        assert_eq!(Part::Before(d("2026-12-03")).end(), Some(d("2026-12-03")));
        assert_eq!(Part::Future.end(), None);
        // Not of this scheme, or of another table.
        assert_eq!(parse(t, "local_message_hold"), None);
        assert_eq!(parse(t, "local_message_20261340"), None);
        assert_eq!(parse(t, "notify_receipt_20261130"), None);
        assert_eq!(
            parse("notify_receipt", "notify_receipt_20261130").map(|p| p.end()),
            Some(Some(d("2026-12-01")))
        );
    }
}
