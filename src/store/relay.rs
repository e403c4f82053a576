//! The outbox side of the relay and the other scheduled jobs: claim with a lease, mark sent,
//! back off, park dead, redrive; purge what the retry windows no longer need. (Expiry's
//! queries are in `reconcile/store.rs`.)

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::schema::local_message;
use super::types::{Payload, UtcTs};
use super::{Dialect, Store, StoreError, with_conn};
use crate::outbox::status;
use crate::time::Timestamp;

/// A claimed message, leased to one relay until it is marked or the lease runs out.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct Claimed {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = Text)]
    pub biz_key: String,
    #[diesel(sql_type = super::types::Json)]
    pub payload: Payload,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = UtcTs)]
    pub created_at: Timestamp,
}

/// PostgreSQL: the relay's own commits — its leases and its "sent" marks — do not wait for the
/// WAL to reach the disk (`synchronous_commit = off` for that statement's transaction only;
/// `set_config(…, true)` ends with it, so the pooled connection's next transaction, a payment
/// say, is as durable as ever). Losing one in a crash only sends a message again, which
/// at-least-once allows; and every flush a payment's commit waits for carries them anyway. So
/// the relay adds no flush of its own per batch for the payments' commits to queue behind.
/// The condition, always true, that says so: an uncorrelated subquery, evaluated once per
/// statement.
macro_rules! async_commit_postgres {
    () => {
        "(SELECT set_config('synchronous_commit', 'off', true)) = 'off'"
    };
}
const ASYNC_COMMIT_POSTGRES: &str = async_commit_postgres!();

/// Due pending rows without a live lease, oldest due first, leased to `owner`. The partial
/// index `local_message_pending_due (next_attempt_at, id) WHERE status = 0` serves it, so
/// sent rows are never re-read while a backlog drains. `SKIP LOCKED` lets several relays
/// claim side by side; SQLite has one writer and needs none.
const CLAIM_POSTGRES: &str = concat!(
    "UPDATE local_message SET locked_by = $1, locked_until = $2 \
     WHERE id IN (SELECT id FROM local_message \
       WHERE status = 0 AND next_attempt_at <= $3 AND (locked_until IS NULL OR locked_until < $4) \
       ORDER BY next_attempt_at, id LIMIT $5 FOR UPDATE SKIP LOCKED) AND ",
    async_commit_postgres!(),
    " RETURNING id, topic, biz_key, payload, attempts, created_at"
);
const CLAIM_SQLITE: &str = "UPDATE local_message SET locked_by = $1, locked_until = $2 \
     WHERE id IN (SELECT id FROM local_message \
       WHERE status = 0 AND next_attempt_at <= $3 AND (locked_until IS NULL OR locked_until < $4) \
       ORDER BY next_attempt_at, id LIMIT $5) \
     RETURNING id, topic, biz_key, payload, attempts, created_at";

/// MySQL has no `RETURNING` and refuses `LIMIT` in an `IN` subquery: the claim is a locking
/// read of the due ids (`SKIP LOCKED`, MySQL 8.0+ / MariaDB 10.6+), their lease, then a read
/// of those rows, in one transaction.
const CLAIM_IDS_MYSQL: &str = "SELECT id FROM local_message \
     WHERE status = 0 AND next_attempt_at <= ? AND (locked_until IS NULL OR locked_until < ?) \
     ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED";

/// "Still pending", for a statement that finds its messages by id: an expression of the
/// column, which the partial index `local_message_pending_due` (`WHERE status = 0`) cannot
/// serve, so the primary key is the only way to the rows. A day partition new since the last
/// `ANALYZE` has no statistics, and reading its whole pending index for a few ids looked as
/// cheap (docs/design.md, "Plans that do not depend on statistics").
const STILL_PENDING: &str = "COALESCE(status, -1) = 0";

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// A failed delivery: one more attempt, the error, and the next attempt 2^attempts seconds
/// after `now` (capped at 10 minutes) with ±25 % jitter, all computed in SQL from the row's
/// own `attempts`; at `max_attempts` the message is parked dead (status 2) with the error.
/// "Still pending" is [`STILL_PENDING`]'s expression, so the row is found by its key.
const FAIL_POSTGRES: &str = "UPDATE local_message SET attempts = attempts + 1, last_error = $1, \
     status = CASE WHEN attempts + 1 >= $2 THEN 2 ELSE 0 END, \
     next_attempt_at = $3 + make_interval(secs => LEAST(600, 1 << LEAST(attempts, 10)) * (0.75 + random() / 2)), \
     locked_by = NULL, locked_until = NULL \
     WHERE id = $4 AND locked_by = $5 AND COALESCE(status, -1) = 0";
const FAIL_SQLITE: &str = "UPDATE local_message SET attempts = attempts + 1, last_error = $1, \
     status = CASE WHEN attempts + 1 >= $2 THEN 2 ELSE 0 END, \
     next_attempt_at = strftime('%Y-%m-%dT%H:%M:%f', $3, \
       '+' || (MIN(600, 1 << MIN(attempts, 10)) * (0.75 + (abs(random()) % 1000) / 2000.0)) || ' seconds') || '000Z', \
     locked_by = NULL, locked_until = NULL \
     WHERE id = $4 AND locked_by = $5 AND COALESCE(status, -1) = 0";
/// MySQL assigns left to right, each assignment seeing the ones before it: `attempts` is
/// incremented last so the others read its old value, as the other backends do.
const FAIL_MYSQL: &str = "UPDATE local_message SET last_error = ?, \
     status = CASE WHEN attempts + 1 >= ? THEN 2 ELSE 0 END, \
     next_attempt_at = DATE_ADD(?, INTERVAL ROUND(LEAST(600, 1 << LEAST(attempts, 10)) * (0.75 + RAND() / 2) * 1000000) MICROSECOND), \
     locked_by = NULL, locked_until = NULL, attempts = attempts + 1 \
     WHERE id = ? AND locked_by = ? AND COALESCE(status, -1) = 0";

/// Rows the retry windows no longer need, at most `$2` per statement: sent messages created
/// before `$1`, idempotency keys. Callback rows are not among them: they are what makes a
/// late repeat of a payment or refund a duplicate, so they live as long as their order; nor
/// are `payment_anomaly` rows, which do the same for a second payment under a recorded key.
/// On the partitioned backends the outbox's day partitions are dropped whole first
/// ([`partitions`](super::partitions)), so the statement here finds only what a kept
/// partition or the future partition still holds.
const PURGE: [(&str, &str, &str); 2] = [
    (
        "local_message",
        "DELETE FROM local_message WHERE id IN (\
           SELECT id FROM local_message WHERE status = 1 AND created_at < $1 LIMIT $2)",
        // MySQL: no LIMIT in an IN subquery, but a single-table DELETE takes one.
        "DELETE FROM local_message WHERE status = 1 AND created_at < ? LIMIT ?",
    ),
    (
        "idempotency_key",
        "DELETE FROM idempotency_key WHERE idem_key IN (\
           SELECT idem_key FROM idempotency_key WHERE created_at < $1 LIMIT $2)",
        "DELETE FROM idempotency_key WHERE created_at < ? LIMIT ?",
    ),
];

/// Receipts (`notify_receipt`) received before `$1`, at most `$2` per statement; their
/// window is `receipts.keep_days`, not the retry windows'.
const PURGE_RECEIPTS: (&str, &str) = (
    "DELETE FROM notify_receipt WHERE id IN (\
       SELECT id FROM notify_receipt WHERE received_at < $1 LIMIT $2)",
    "DELETE FROM notify_receipt WHERE received_at < ? LIMIT ?",
);

/// What the relay metrics report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxStats {
    pub pending: i64,
    pub dead: i64,
    /// `created_at` of the oldest pending message (relay lag).
    pub oldest_pending: Option<Timestamp>,
}

impl OutboxStats {
    /// How long the oldest pending message has waited at `now` (0 with none pending).
    pub fn oldest_pending_secs(&self, now: Timestamp) -> i64 {
        self.oldest_pending.map_or(0, |oldest| {
            (now.unix_seconds() - oldest.unix_seconds()).max(0)
        })
    }
}

impl Store {
    /// Leases up to `limit` due messages to `owner` until `lease_until`.
    pub async fn claim_messages(
        &self,
        owner: &str,
        now: Timestamp,
        lease_until: Timestamp,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        with_conn!(self, conn, dialect => {
            let sql = match dialect {
                Dialect::Postgres => CLAIM_POSTGRES,
                Dialect::Sqlite => CLAIM_SQLITE,
                Dialect::Mysql => {
                    return conn
                        .transaction::<_, diesel::result::Error, _>(async |conn| {
                            let ids: Vec<Id> = diesel::sql_query(CLAIM_IDS_MYSQL)
                                .bind::<UtcTs, _>(now)
                                .bind::<UtcTs, _>(now)
                                .bind::<BigInt, _>(limit)
                                .load(conn)
                                .await?;
                            let ids: Vec<i64> = ids.into_iter().map(|r| r.id).collect();
                            if ids.is_empty() {
                                return Ok(Vec::new());
                            }
                            diesel::update(local_message::table.filter(local_message::id.eq_any(&ids)))
                                .set((
                                    local_message::locked_by.eq(owner),
                                    local_message::locked_until.eq(lease_until),
                                ))
                                .execute(conn)
                                .await?;
                            let rows = local_message::table
                                .filter(local_message::id.eq_any(&ids))
                                .order(local_message::id)
                                .select((
                                    local_message::id,
                                    local_message::topic,
                                    local_message::biz_key,
                                    local_message::payload,
                                    local_message::attempts,
                                    local_message::created_at,
                                ))
                                .load::<(i64, String, String, Payload, i32, Timestamp)>(conn)
                                .await?;
                            Ok(rows
                                .into_iter()
                                .map(|(id, topic, biz_key, payload, attempts, created_at)| Claimed {
                                    id,
                                    topic,
                                    biz_key,
                                    payload,
                                    attempts,
                                    created_at,
                                })
                                .collect())
                        })
                        .await
                        .map_err(StoreError::from);
                }
            };
            let mut rows: Vec<Claimed> = diesel::sql_query(sql)
                .bind::<Text, _>(owner)
                .bind::<UtcTs, _>(lease_until)
                .bind::<UtcTs, _>(now)
                .bind::<UtcTs, _>(now)
                .bind::<BigInt, _>(limit)
                .load(conn)
                .await?;
            rows.sort_by_key(|r| r.id);
            Ok(rows)
        })
    }

    /// Marks delivered messages sent, only while `owner` still holds their lease. Returns
    /// how many it marked. `written_since` is the oldest `created_at` among them: on the
    /// partitioned backends it keeps the update to the partitions that can hold them.
    pub async fn mark_sent(
        &self,
        owner: &str,
        ids: &[i64],
        written_since: Timestamp,
        now: Timestamp,
    ) -> Result<usize, StoreError> {
        with_conn!(self, conn, dialect => {
            let durability = match dialect {
                Dialect::Postgres => ASYNC_COMMIT_POSTGRES,
                // MySQL's flush is a server setting; SQLite's writes are local.
                Dialect::Mysql | Dialect::Sqlite => "1 = 1",
            };
            Ok(diesel::update(
                local_message::table
                    .filter(local_message::id.eq_any(ids))
                    .filter(local_message::created_at.ge(written_since))
                    .filter(local_message::locked_by.eq(owner))
                    .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(STILL_PENDING))
                    .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(durability)),
            )
            .set((
                local_message::status.eq(status::SENT),
                local_message::sent_at.eq(now),
                local_message::locked_by.eq(None::<String>),
                local_message::locked_until.eq(None::<Timestamp>),
            ))
            .execute(conn)
            .await?)
        })
    }

    /// Records a failed delivery (backoff or dead, see `FAIL_POSTGRES`).
    pub async fn mark_failed(
        &self,
        owner: &str,
        id: i64,
        error: &str,
        max_attempts: i32,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        with_conn!(self, conn, dialect => {
            let sql = match dialect {
                Dialect::Postgres => FAIL_POSTGRES,
                Dialect::Mysql => FAIL_MYSQL,
                Dialect::Sqlite => FAIL_SQLITE,
            };
            diesel::sql_query(sql)
                .bind::<Text, _>(error)
                .bind::<Integer, _>(max_attempts)
                .bind::<UtcTs, _>(now)
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(owner)
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    /// Gives back every lease `owner` still holds (shutdown); those rows are claimable at once.
    pub async fn release_leases(&self, owner: &str) -> Result<usize, StoreError> {
        with_conn!(self, conn => {
            Ok(diesel::update(
                local_message::table
                    .filter(local_message::locked_by.eq(owner))
                    .filter(local_message::status.eq(status::PENDING)),
            )
            .set((
                local_message::locked_by.eq(None::<String>),
                local_message::locked_until.eq(None::<Timestamp>),
            ))
            .execute(conn)
            .await?)
        })
    }

    /// A dead message back to pending with `attempts = 0`; false when it is not dead.
    pub async fn redrive(&self, id: i64, now: Timestamp) -> Result<bool, StoreError> {
        with_conn!(self, conn => {
            let moved = diesel::update(
                local_message::table
                    .filter(local_message::id.eq(id))
                    .filter(local_message::status.eq(status::DEAD)),
            )
            .set((
                local_message::status.eq(status::PENDING),
                local_message::attempts.eq(0),
                local_message::next_attempt_at.eq(now),
                local_message::locked_by.eq(None::<String>),
                local_message::locked_until.eq(None::<Timestamp>),
            ))
            .execute(conn)
            .await?;
            Ok(moved == 1)
        })
    }

    pub async fn outbox_stats(&self) -> Result<OutboxStats, StoreError> {
        with_conn!(self, conn => {
            let count = |s: i16| local_message::table.filter(local_message::status.eq(s)).count();
            let pending: i64 = count(status::PENDING).get_result(conn).await?;
            let dead: i64 = count(status::DEAD).get_result(conn).await?;
            let oldest_pending: Option<Timestamp> = local_message::table
                .filter(local_message::status.eq(status::PENDING))
                .order(local_message::created_at.asc())
                .select(local_message::created_at)
                .first(conn)
                .await
                .optional()?;
            Ok(OutboxStats { pending, dead, oldest_pending })
        })
    }

    /// Deletes up to `batch` rows older than `cutoff` from each table the retention job
    /// purges; returns `(table, rows deleted)`. Pending and dead messages are never touched.
    pub async fn purge_batch(
        &self,
        cutoff: Timestamp,
        batch: i64,
    ) -> Result<Vec<(&'static str, usize)>, StoreError> {
        with_conn!(self, conn, dialect => {
            let mut deleted = Vec::with_capacity(PURGE.len());
            for (table, ansi, mysql) in PURGE {
                let sql = if dialect == Dialect::Mysql { mysql } else { ansi };
                let n = diesel::sql_query(sql)
                    .bind::<UtcTs, _>(cutoff)
                    .bind::<BigInt, _>(batch)
                    .execute(conn)
                    .await?;
                deleted.push((table, n));
            }
            Ok(deleted)
        })
    }

    /// Deletes up to `batch` receipts received before `cutoff`; returns how many.
    pub async fn purge_receipts_batch(
        &self,
        cutoff: Timestamp,
        batch: i64,
    ) -> Result<usize, StoreError> {
        with_conn!(self, conn, dialect => {
            let (ansi, mysql) = PURGE_RECEIPTS;
            let sql = if dialect == Dialect::Mysql { mysql } else { ansi };
            Ok(diesel::sql_query(sql)
                .bind::<UtcTs, _>(cutoff)
                .bind::<BigInt, _>(batch)
                .execute(conn)
                .await?)
        })
    }
}
