//! `transfer`: a transfer is recorded, its daily limit checked under its account's lock,
//! before its provider is called; the job takes the due ones one instance at a time. What a
//! provider says moves it through the ledger (`Store::apply_transfer`), never from here.

use chrono::{FixedOffset, TimeZone};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::store::outbox::StoredMessage;
use crate::store::schema::{local_message, transfer, transfer_account, transfer_anomaly};
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;
use crate::transfer::TransferStatus;

/// A transfer as stored.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = transfer)]
pub struct TransferRow {
    pub out_bill_no: String,
    pub channel: String,
    pub account: String,
    pub amount_fen: i64,
    pub remark: String,
    /// Who is paid, as shown (JSON, never a name).
    pub payee: String,
    /// The call exactly as it is sent (JSON, names included): never shown.
    pub request: String,
    pub request_digest: String,
    pub status: String,
    pub provider_state: Option<String>,
    pub provider_bill_no: Option<String>,
    pub package_info: Option<String>,
    pub fail_reason: Option<String>,
    pub attempts: i32,
    pub next_attempt_at: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
}

impl TransferRow {
    pub fn status(&self) -> TransferStatus {
        TransferStatus::parse(&self.status).unwrap_or(TransferStatus::Processing)
    }

    /// Whether the provider ever answered about it: until then the job sends it again, after
    /// that it queries.
    pub fn answered(&self) -> bool {
        self.provider_state.is_some()
    }
}

/// A `TRANSFER_ANOMALY` as recorded (`transfer_anomaly`).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = transfer_anomaly)]
pub struct TransferAnomaly {
    pub biz_key: String,
    pub out_bill_no: String,
    pub payload: Payload,
    pub created_at: Timestamp,
}

/// A transfer to record.
#[derive(Debug, Clone)]
pub struct NewTransfer<'a> {
    pub out_bill_no: &'a str,
    pub channel: &'a str,
    pub account: &'a str,
    pub amount_fen: i64,
    pub remark: &'a str,
    pub payee: &'a str,
    pub request: &'a str,
    pub request_digest: &'a str,
    /// The account's cap for the Beijing day of `now`.
    pub daily_limit_fen: i64,
    pub now: Timestamp,
    /// When the job sends it again if this call gets no answer.
    pub retry_at: Timestamp,
}

/// What recording a transfer found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded now: it is to be sent.
    Send(TransferRow),
    /// The same request again: the stored transfer, nothing sent.
    Same(TransferRow),
    /// The number is another request's.
    OtherRequest,
    /// The account's transfers today, this one included, would pass the daily limit.
    OverDailyLimit { used_fen: i64 },
}

/// The statuses that count against the daily limit: all but `FAIL` and `CANCELLED`.
const COUNTED: [TransferStatus; 3] = [
    TransferStatus::Processing,
    TransferStatus::WaitUserConfirm,
    TransferStatus::Success,
];

/// The statuses the job follows.
const NOT_FINAL: [&str; 2] = ["PROCESSING", "WAIT_USER_CONFIRM"];

/// Beijing midnight of the day `now` falls on (China keeps UTC+8 all year).
pub fn beijing_midnight(now: Timestamp) -> Timestamp {
    let Some(beijing) = FixedOffset::east_opt(8 * 3600) else {
        return now;
    };
    let local = now.as_datetime().with_timezone(&beijing);
    let midnight = local
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .and_then(|m| beijing.from_local_datetime(&m).single())
        .map_or_else(|| now.as_datetime(), |m| m.to_utc());
    Timestamp::new(midnight)
}

/// Is `row` the same request as the one whose body digest is `digest`?
fn same_or_other(row: TransferRow, digest: &str) -> Recorded {
    if row.request_digest == digest {
        Recorded::Same(row)
    } else {
        Recorded::OtherRequest
    }
}

impl Store {
    pub async fn transfer(&self, out_bill_no: &str) -> Result<Option<TransferRow>, StoreError> {
        with_conn!(self, conn => {
            Ok(transfer::table
                .find(out_bill_no)
                .select(TransferRow::as_select())
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// Records a transfer in one transaction under its account's lock (its
    /// `transfer_account` row, locked by an update that changes nothing: a row lock on
    /// PostgreSQL and MySQL, the write lock on SQLite), so of two requests that together pass
    /// the daily limit exactly one is recorded. A deadlock victim is tried again.
    pub async fn record_transfer(&self, new: &NewTransfer<'_>) -> Result<Recorded, StoreError> {
        let mut retried = 0;
        loop {
            match self.record_transfer_once(new).await {
                Err(e) if e.is_deadlock() && retried < 3 => retried += 1,
                result => return result,
            }
        }
    }

    async fn record_transfer_once(&self, new: &NewTransfer<'_>) -> Result<Recorded, StoreError> {
        let since = beijing_midnight(new.now);
        with_conn!(self, conn => {
            conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                let account_row = transfer_account::table
                    .find((new.channel, new.account));
                // The lock, when the row exists (the usual case: no insert, so no shared
                // lock two transactions could both hold and then both want to upgrade).
                diesel::update(account_row)
                    .set(transfer_account::account.eq(transfer_account::account))
                    .execute(conn)
                    .await?;
                let exists: Option<String> = account_row
                    .select(transfer_account::account)
                    .first(conn)
                    .await
                    .optional()?;
                if exists.is_none() {
                    // The account's first transfer: its row, then its lock. A concurrent first
                    // transfer's insert waits for this one and finds the row.
                    let inserted = conn
                        .transaction::<_, diesel::result::Error, _>(async |conn| {
                            diesel::insert_into(transfer_account::table)
                                .values((
                                    transfer_account::channel.eq(new.channel),
                                    transfer_account::account.eq(new.account),
                                ))
                                .execute(conn)
                                .await
                        })
                        .await;
                    match inserted {
                        Ok(_)
                        | Err(diesel::result::Error::DatabaseError(
                            diesel::result::DatabaseErrorKind::UniqueViolation,
                            _,
                        )) => {}
                        Err(e) => return Err(e),
                    }
                    diesel::update(account_row)
                        .set(transfer_account::account.eq(transfer_account::account))
                        .execute(conn)
                        .await?;
                }
                let existing: Option<TransferRow> = transfer::table
                    .find(new.out_bill_no)
                    .select(TransferRow::as_select())
                    .first(conn)
                    .await
                    .optional()?;
                if let Some(row) = existing {
                    return Ok(same_or_other(row, new.request_digest));
                }
                // An account sends a few transfers a day: their amounts, summed here.
                let today: Vec<i64> = transfer::table
                    .filter(transfer::channel.eq(new.channel))
                    .filter(transfer::account.eq(new.account))
                    .filter(transfer::created_at.ge(since))
                    .filter(transfer::status.eq_any(COUNTED.map(TransferStatus::as_str)))
                    .select(transfer::amount_fen)
                    .load(conn)
                    .await?;
                let used_fen = today.iter().sum::<i64>();
                if used_fen.saturating_add(new.amount_fen) > new.daily_limit_fen {
                    return Ok(Recorded::OverDailyLimit { used_fen });
                }
                // The same number may be recorded for another account at this moment (that
                // account's lock is not this one's): its primary key says so.
                let inserted = conn
                    .transaction::<_, diesel::result::Error, _>(async |conn| {
                        diesel::insert_into(transfer::table)
                            .values((
                                transfer::out_bill_no.eq(new.out_bill_no),
                                transfer::channel.eq(new.channel),
                                transfer::account.eq(new.account),
                                transfer::amount_fen.eq(new.amount_fen),
                                transfer::remark.eq(new.remark),
                                transfer::payee.eq(new.payee),
                                transfer::request.eq(new.request),
                                transfer::request_digest.eq(new.request_digest),
                                transfer::status.eq(TransferStatus::Processing.as_str()),
                                transfer::attempts.eq(0),
                                transfer::next_attempt_at.eq(new.retry_at),
                                transfer::created_at.eq(new.now),
                                transfer::updated_at.eq(new.now),
                            ))
                            .execute(conn)
                            .await
                    })
                    .await;
                let mine = match inserted {
                    Ok(_) => true,
                    Err(diesel::result::Error::DatabaseError(
                        diesel::result::DatabaseErrorKind::UniqueViolation,
                        _,
                    )) => false,
                    Err(e) => return Err(e),
                };
                let row: TransferRow = transfer::table
                    .find(new.out_bill_no)
                    .select(TransferRow::as_select())
                    .first(conn)
                    .await?;
                Ok(if mine {
                    Recorded::Send(row)
                } else {
                    same_or_other(row, new.request_digest)
                })
            })
            .await
            .map_err(StoreError::from)
        })
    }

    /// Transfers, newest first, of one status or all.
    pub async fn transfers(
        &self,
        status: Option<TransferStatus>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, StoreError> {
        with_conn!(self, conn => {
            let mut query = transfer::table
                .select(TransferRow::as_select())
                .order((transfer::created_at.desc(), transfer::out_bill_no.desc()))
                .limit(limit)
                .into_boxed();
            if let Some(status) = status {
                query = query.filter(transfer::status.eq(status.as_str()));
            }
            Ok(query.load(conn).await?)
        })
    }

    /// When the oldest transfer of `channel` in `status` was recorded (`transfer_status`
    /// reads it as one index entry per status).
    pub async fn oldest_open_transfer(
        &self,
        channel: &str,
        status: TransferStatus,
    ) -> Result<Option<Timestamp>, StoreError> {
        with_conn!(self, conn => {
            Ok(transfer::table
                .filter(transfer::status.eq(status.as_str()))
                .filter(transfer::channel.eq(channel))
                .order(transfer::created_at.asc())
                .select(transfer::created_at)
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// The outbox messages of one transfer, oldest first: its final event
    /// (`{out_bill_no}:{channel}`) and its anomalies (that, then `:` and the provider's bill
    /// number). None is written before the transfer was recorded at `since` (an hour earlier
    /// is read, for another instance's clock), so only the day partitions from then on are
    /// read; sent ones are gone after `retention.keep_days`.
    pub async fn transfer_events(
        &self,
        out_bill_no: &str,
        channel: &str,
        since: Timestamp,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let key = format!("{out_bill_no}:{channel}");
        // `out_bill_no` is letters and digits only: nothing in it is a LIKE wildcard. SQLite's
        // LIKE ignores case, so what it finds is checked again here.
        let anomalies = format!("{key}:%");
        let prefix = format!("{key}:");
        let found: Vec<StoredMessage> = with_conn!(self, conn => {
            local_message::table
                .filter(local_message::created_at.ge(since.plus_seconds(-3600)))
                .filter(
                    local_message::biz_key
                        .eq(&key)
                        .or(local_message::biz_key.like(&anomalies)),
                )
                .order(local_message::id.asc())
                .limit(100)
                .select(StoredMessage::as_select())
                .load(conn)
                .await?
        });
        Ok(found
            .into_iter()
            .filter(|m| m.biz_key == key || m.biz_key.starts_with(&prefix))
            .collect())
    }

    /// The newest transfer anomalies; `UNKNOWN_TRANSFER` ones have no transfer to be shown
    /// with. The table holds one row per anomaly: few.
    pub async fn recent_transfer_anomalies(
        &self,
        limit: i64,
    ) -> Result<Vec<TransferAnomaly>, StoreError> {
        with_conn!(self, conn => {
            Ok(transfer_anomaly::table
                .select(TransferAnomaly::as_select())
                .order(transfer_anomaly::created_at.desc())
                .limit(limit)
                .load(conn)
                .await?)
        })
    }

    /// The transfers not final whose next call is due, oldest due first.
    pub async fn transfers_due(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> Result<Vec<TransferRow>, StoreError> {
        with_conn!(self, conn => {
            Ok(transfer::table
                .filter(transfer::status.eq_any(NOT_FINAL))
                .filter(transfer::next_attempt_at.le(now))
                .order(transfer::next_attempt_at.asc())
                .limit(limit)
                .select(TransferRow::as_select())
                .load(conn)
                .await?)
        })
    }

    /// Takes a due transfer for one call: its next call moved to `next` and counted, if it is
    /// still as `row` read it (another instance's job did not take it first).
    pub async fn claim_transfer(
        &self,
        row: &TransferRow,
        next: Timestamp,
    ) -> Result<bool, StoreError> {
        with_conn!(self, conn => {
            let taken = diesel::update(
                transfer::table
                    .find(&row.out_bill_no)
                    .filter(transfer::status.eq(&row.status))
                    .filter(transfer::next_attempt_at.eq(row.next_attempt_at)),
            )
            .set((
                transfer::next_attempt_at.eq(next),
                transfer::attempts.eq(transfer::attempts + 1),
            ))
            .execute(conn)
            .await?;
            Ok(taken == 1)
        })
    }

    /// The next call of a transfer that is not final, at `at`.
    pub async fn schedule_transfer(
        &self,
        out_bill_no: &str,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::update(
                transfer::table
                    .find(out_bill_no)
                    .filter(transfer::status.eq_any(NOT_FINAL)),
            )
            .set(transfer::next_attempt_at.eq(at))
            .execute(conn)
            .await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> Timestamp {
        Timestamp::new(
            chrono::DateTime::parse_from_rfc3339(rfc3339)
                .expect("time")
                .to_utc(),
        )
    }

    #[test]
    fn the_day_starts_at_beijing_midnight() {
        // 15:59 UTC is 23:59 in Beijing: the day began at 16:00 UTC the day before.
        assert_eq!(
            beijing_midnight(at("2026-12-03T15:59:00Z")),
            at("2026-12-02T16:00:00Z")
        );
        // 16:00 UTC is midnight in Beijing: a new day.
        assert_eq!(
            beijing_midnight(at("2026-12-03T16:00:00Z")),
            at("2026-12-03T16:00:00Z")
        );
    }
}
