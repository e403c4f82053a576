//! The bill tables: the lease of a run, the bill's detail rows while it is compared, the
//! set-based comparison with the ledger, and the reports and their items.
//!
//! The comparison is a few statements per account, whatever the bill's size: for payments
//! and for refunds, the bill's rows that the ledger lacks or disagrees with (an outer join on
//! the callback tables' keys) and the ledger's rows of the day that no bill row names (an
//! anti-join on `bill_line`'s key), and the ledger's totals of the day. Only the differences
//! come back to the process (at most a limit of them), and each is then looked up in the
//! other reports' items by its key.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Nullable};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::report::{Item, ItemType, OurTotals, Report, Resolution, Side, Status};
use crate::channel::bill::{BillLine, BillTotals, LineKind};
use crate::notice::ChannelId;
use crate::store::schema::{
    bill_item, bill_line, bill_report, bill_run, order_account, pay_callback, refund_callback,
};
use crate::store::types::UtcTs;
use crate::store::{Dialect, Pools, Store, StoreError, acquire, with_conn};
use crate::time::Timestamp;

/// The longest id a bill row may carry: the ledger's columns are this wide.
pub const MAX_ID: usize = 64;

/// Which ledger rows are an account's bill's: those of orders that name an account the bill
/// covers (`order_account`), and, for the channel's first account, those of orders that name
/// none.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub date: &'a str,
    pub channel: ChannelId,
    /// The account the bill was fetched for: its rows in `bill_line`, its report.
    pub account: &'a str,
    /// The accounts whose payments the bill lists: `account`, and an Alipay seller's other
    /// apps.
    pub covers: &'a [String],
    /// Orders that name no account count as this account's.
    pub unnamed: bool,
    /// The provider-local day, as `[start, end)`.
    pub start: Timestamp,
    pub end: Timestamp,
}

/// A bill row the ledger lacks, or records differently (amount, or another day).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BillSide {
    pub out_trade_no: String,
    /// `""` for a payment.
    pub out_refund_no: String,
    pub transaction_id: String,
    pub fen: i64,
    pub status: String,
    pub ours: Option<Recorded>,
}

/// The ledger's record of a payment or refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub fen: i64,
    /// When the provider says it happened (`occurred_at`), else when the ledger recorded it
    /// (`created_at`): what dates it.
    pub at: Timestamp,
    /// `PAID`, or the refund's status.
    pub status: String,
}

/// A ledger row of the day that no bill row of the day names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OursOnly {
    pub out_trade_no: String,
    /// `""` for a payment.
    pub out_refund_no: String,
    /// A payment's; a refund's row does not record it.
    pub transaction_id: Option<String>,
    pub fen: i64,
    pub at: Timestamp,
    pub status: String,
}

#[derive(Insertable)]
#[diesel(table_name = bill_line)]
struct NewLine<'a> {
    bill_date: &'a str,
    channel: &'a str,
    kind: &'a str,
    out_trade_no: &'a str,
    out_refund_no: &'a str,
    account: &'a str,
    transaction_id: &'a str,
    amount_fen: i64,
    status: &'a str,
}

#[derive(Queryable, Insertable)]
#[diesel(table_name = bill_report)]
struct ReportRow {
    bill_date: String,
    channel: String,
    account: String,
    status: String,
    reason: Option<String>,
    fetched_at: Timestamp,
    provider_count: i64,
    provider_amount_fen: i64,
    provider_refund_count: i64,
    provider_refund_fen: i64,
    provider_fee_fen: i64,
    ours_count: i64,
    ours_amount_fen: i64,
    ours_refund_count: i64,
    ours_refund_fen: i64,
}

#[derive(Clone, Queryable, Insertable)]
#[diesel(table_name = bill_item)]
struct ItemRow {
    bill_date: String,
    channel: String,
    account: String,
    item_type: String,
    out_trade_no: String,
    out_refund_no: String,
    transaction_id: Option<String>,
    provider_status: Option<String>,
    provider_fen: Option<i64>,
    ours_status: Option<String>,
    ours_fen: Option<i64>,
    resolution: String,
}

/// A pending item found in another report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingElsewhere {
    pub date: String,
    pub account: String,
    pub item: Item,
}

impl ItemRow {
    fn of(date: &str, channel: ChannelId, account: &str, item: &Item) -> Self {
        Self {
            bill_date: date.to_owned(),
            channel: channel.as_str().to_owned(),
            account: account.to_owned(),
            item_type: item.kind.as_str().to_owned(),
            out_trade_no: item.out_trade_no.clone(),
            out_refund_no: item.out_refund_no.clone().unwrap_or_default(),
            transaction_id: item.transaction_id.clone(),
            provider_status: item.provider.as_ref().map(|s| s.status.clone()),
            provider_fen: item.provider.as_ref().map(|s| s.amount_fen),
            ours_status: item.ours.as_ref().map(|s| s.status.clone()),
            ours_fen: item.ours.as_ref().map(|s| s.amount_fen),
            resolution: item.resolution.as_str().to_owned(),
        }
    }

    fn item(self) -> Option<Item> {
        let side = |status: Option<String>, fen: Option<i64>| match (status, fen) {
            (Some(status), Some(amount_fen)) => Some(Side { status, amount_fen }),
            _ => None,
        };
        Some(Item {
            kind: ItemType::parse(&self.item_type)?,
            out_trade_no: self.out_trade_no,
            out_refund_no: Some(self.out_refund_no).filter(|r| !r.is_empty()),
            transaction_id: self.transaction_id,
            provider: side(self.provider_status, self.provider_fen),
            ours: side(self.ours_status, self.ours_fen),
            resolution: Resolution::parse(&self.resolution)?,
        })
    }
}

/// Keeps the rows of orders that name an account of `scope.covers` on the channel
/// (`order_account`, left-joined), and for the channel's first account those of orders that
/// name none.
macro_rules! of_account {
    ($query:expr, $scope:expr) => {
        if $scope.unnamed {
            $query.filter(
                order_account::account
                    .nullable()
                    .eq_any($scope.covers)
                    .or(order_account::account.nullable().is_null()),
            )
        } else {
            $query.filter(order_account::account.nullable().eq_any($scope.covers))
        }
    };
}

/// A bill row and a ledger payment of one order are the same payment only with the same
/// transaction id, where both have one: a second payment of a paid order (through another
/// merchant of the channel) is another payment.
macro_rules! same_transaction {
    () => {
        bill_line::transaction_id
            .eq("")
            .or(pay_callback::transaction_id.eq(""))
            .or(pay_callback::transaction_id.eq(bill_line::transaction_id))
    };
}

/// The callback rows of the scope's day: dated by the provider's own time of the payment or
/// refund (`occurred_at`) where the notice carried it, else by when the ledger recorded it
/// (`created_at`). Two index ranges, one per column.
macro_rules! dated_in {
    ($table:ident, $scope:expr) => {
        $table::occurred_at
            .ge($scope.start)
            .and($table::occurred_at.lt($scope.end))
            .or($table::occurred_at
                .is_null()
                .and($table::created_at.ge($scope.start))
                .and($table::created_at.lt($scope.end)))
    };
}

/// What dates a callback row (see [`dated_in`]), as SQL.
fn dated(table: &str) -> String {
    format!("COALESCE({table}.occurred_at, {table}.created_at)")
}

/// `(count, sum of $amount)` of the account's rows of a callback table recorded on the
/// scope's day: one statement.
macro_rules! day_totals {
    ($store:expr, $scope:expr, $table:ident, $amount:literal) => {{
        let totals: (i64, i64) = with_conn!($store, conn, dialect => {
            let mut query = $table::table
                .left_join(
                    order_account::table.on(order_account::order_no
                        .eq($table::out_trade_no)
                        .and(order_account::channel.eq($table::channel))),
                )
                .filter($table::channel.eq($scope.channel.as_str()))
                .filter(dated_in!($table, $scope))
                .into_boxed();
            query = of_account!(query, $scope);
            query
                .select((sql::<BigInt>("COUNT(*)"), sql::<BigInt>(&sum_of(dialect, $amount))))
                .first(conn)
                .await?
        });
        totals
    }};
}

/// `CAST(COALESCE(SUM(column), 0) AS …)`: PostgreSQL sums a BIGINT as NUMERIC, MySQL as
/// DECIMAL; each is cast back.
fn sum_of(dialect: Dialect, column: &str) -> String {
    let target = match dialect {
        Dialect::Mysql => "SIGNED",
        Dialect::Postgres | Dialect::Sqlite => "BIGINT",
    };
    format!("CAST(COALESCE(SUM({column}), 0) AS {target})")
}

impl Store {
    /// Takes the lease of the run of (`date`, `channel`) for `owner` until `until`, unless
    /// another owner holds it unexpired. Whether it was taken.
    pub async fn claim_bill_run(
        &self,
        date: &str,
        channel: ChannelId,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError> {
        let taken = with_conn!(self, conn => {
            diesel::update(
                bill_run::table
                    .filter(bill_run::bill_date.eq(date))
                    .filter(bill_run::channel.eq(channel.as_str()))
                    .filter(bill_run::locked_until.lt(now).or(bill_run::locked_by.eq(owner))),
            )
            .set((bill_run::locked_by.eq(owner), bill_run::locked_until.eq(until)))
            .execute(conn)
            .await?
        });
        if taken > 0 {
            return Ok(true);
        }
        let inserted: Result<usize, Error> = with_conn!(self, conn => {
            diesel::insert_into(bill_run::table)
                .values((
                    bill_run::bill_date.eq(date),
                    bill_run::channel.eq(channel.as_str()),
                    bill_run::locked_by.eq(owner),
                    bill_run::locked_until.eq(until),
                ))
                .execute(conn)
                .await
        });
        match inserted {
            Ok(_) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the lease back and empties the run's bill rows, if `owner` still holds it
    /// (whether it did): a run whose lease ran out leaves the rows to whoever took it over.
    pub async fn release_bill_run(
        &self,
        date: &str,
        channel: ChannelId,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let released = with_conn!(self, conn => {
            diesel::delete(
                bill_run::table
                    .filter(bill_run::bill_date.eq(date))
                    .filter(bill_run::channel.eq(channel.as_str()))
                    .filter(bill_run::locked_by.eq(owner)),
            )
            .execute(conn)
            .await?
        });
        if released > 0 {
            self.clear_bill_lines(date, channel).await?;
        }
        Ok(released > 0)
    }

    /// Removes one account's bill rows of (`date`, `channel`): a bill that failed a check
    /// after some of its rows were stored.
    pub async fn clear_account_lines(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
    ) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::delete(
                bill_line::table
                    .filter(bill_line::bill_date.eq(date))
                    .filter(bill_line::channel.eq(channel.as_str()))
                    .filter(bill_line::account.eq(account)),
            )
            .execute(conn)
            .await?;
        });
        Ok(())
    }

    /// Removes the bill rows of (`date`, `channel`): before a run reads its bills (a run
    /// that died left them), and after it.
    pub async fn clear_bill_lines(&self, date: &str, channel: ChannelId) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::delete(
                bill_line::table
                    .filter(bill_line::bill_date.eq(date))
                    .filter(bill_line::channel.eq(channel.as_str())),
            )
            .execute(conn)
            .await?;
        });
        Ok(())
    }

    /// Stores a batch of one account's bill rows in one statement. A row whose key is in
    /// the account's bill already (the same payment or refund twice in one bill)
    /// is `Ok(Err(..))`: the bill is refused, not the statement retried.
    pub async fn insert_bill_lines(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
        lines: &[BillLine],
    ) -> Result<Result<(), String>, StoreError> {
        let rows: Vec<NewLine<'_>> = lines
            .iter()
            .map(|l| NewLine {
                bill_date: date,
                channel: channel.as_str(),
                kind: l.kind.as_str(),
                out_trade_no: &l.out_trade_no,
                out_refund_no: l.out_refund_no.as_deref().unwrap_or(""),
                account,
                transaction_id: &l.transaction_id,
                amount_fen: l.amount_fen,
                status: &l.status,
            })
            .collect();
        // One multi-row statement; SQLite (no batch insert in diesel's SQLite backend) one
        // row after another in a transaction, which costs it no round trips.
        let inserted: Result<(), Error> = match &*self.pools {
            Pools::Postgres(pool) => {
                let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
                diesel::insert_into(bill_line::table)
                    .values(&rows)
                    .execute(&mut conn)
                    .await
                    .map(drop)
            }
            Pools::Mysql(pool) => {
                let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
                diesel::insert_into(bill_line::table)
                    .values(&rows)
                    .execute(&mut conn)
                    .await
                    .map(drop)
            }
            Pools::Sqlite(pool) => {
                let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
                conn.transaction::<_, Error, _>(async |conn| {
                    for row in &rows {
                        diesel::insert_into(bill_line::table)
                            .values(row)
                            .execute(conn)
                            .await?;
                    }
                    Ok(())
                })
                .await
            }
        };
        match inserted {
            Ok(_) => Ok(Ok(())),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, info)) => {
                Ok(Err(format!(
                    "a payment or refund appears twice in the bill ({})",
                    info.message()
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The account's bill rows of `kind` the ledger lacks, records with another amount, or
    /// records on another day: at most `limit` + 1 (one more says there are too many).
    pub async fn bill_differences(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        limit: usize,
    ) -> Result<Vec<BillSide>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
        let channel = scope.channel.as_str();
        let lines = bill_line::table
            .filter(bill_line::bill_date.eq(scope.date))
            .filter(bill_line::channel.eq(channel))
            .filter(bill_line::account.eq(scope.account))
            .filter(bill_line::kind.eq(kind.as_str()));
        type Row = (
            String,
            String,
            String,
            i64,
            String,
            Option<i64>,
            Option<Timestamp>,
            Option<String>,
        );
        let rows: Vec<Row> = match kind {
            LineKind::Payment => with_conn!(self, conn => {
                lines
                    .left_join(
                        pay_callback::table.on(pay_callback::out_trade_no
                            .eq(bill_line::out_trade_no)
                            .and(pay_callback::channel.eq(bill_line::channel))
                            .and(same_transaction!())),
                    )
                    .filter(
                        pay_callback::out_trade_no
                            .nullable()
                            .is_null()
                            .or(pay_callback::amount_fen.nullable().ne(bill_line::amount_fen.nullable()))
                            .or(sql::<Nullable<UtcTs>>(&dated("pay_callback")).lt(scope.start))
                            .or(sql::<Nullable<UtcTs>>(&dated("pay_callback")).ge(scope.end)),
                    )
                    .select((
                        bill_line::out_trade_no,
                        bill_line::out_refund_no,
                        bill_line::transaction_id,
                        bill_line::amount_fen,
                        bill_line::status,
                        pay_callback::amount_fen.nullable(),
                        sql::<Nullable<UtcTs>>(&dated("pay_callback")),
                        sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>("NULL"),
                    ))
                    .limit(limit)
                    .load(conn)
                    .await?
            }),
            LineKind::Refund => with_conn!(self, conn => {
                lines
                    .left_join(
                        refund_callback::table.on(refund_callback::out_refund_no
                            .eq(bill_line::out_refund_no)
                            .and(refund_callback::out_trade_no.eq(bill_line::out_trade_no))
                            .and(refund_callback::channel.eq(bill_line::channel))),
                    )
                    .filter(
                        refund_callback::out_refund_no
                            .nullable()
                            .is_null()
                            .or(refund_callback::refund_fen.nullable().ne(bill_line::amount_fen.nullable()))
                            .or(sql::<Nullable<UtcTs>>(&dated("refund_callback")).lt(scope.start))
                            .or(sql::<Nullable<UtcTs>>(&dated("refund_callback")).ge(scope.end)),
                    )
                    .select((
                        bill_line::out_trade_no,
                        bill_line::out_refund_no,
                        bill_line::transaction_id,
                        bill_line::amount_fen,
                        bill_line::status,
                        refund_callback::refund_fen.nullable(),
                        sql::<Nullable<UtcTs>>(&dated("refund_callback")),
                        refund_callback::status.nullable(),
                    ))
                    .limit(limit)
                    .load(conn)
                    .await?
            }),
        };
        Ok(rows
            .into_iter()
            .map(
                |(
                    out_trade_no,
                    out_refund_no,
                    transaction_id,
                    fen,
                    status,
                    our_fen,
                    our_at,
                    our_status,
                )| BillSide {
                    out_trade_no,
                    out_refund_no,
                    transaction_id,
                    fen,
                    status,
                    ours: our_fen.zip(our_at).map(|(fen, at)| Recorded {
                        fen,
                        at,
                        status: our_status.unwrap_or_else(|| "PAID".to_owned()),
                    }),
                },
            )
            .collect())
    }

    /// The account's ledger rows of `kind` recorded that day that no bill row of the day
    /// (of any account of the channel) names: at most `limit` + 1.
    pub async fn ours_only(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        limit: usize,
    ) -> Result<Vec<OursOnly>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
        let channel = scope.channel.as_str();
        let rows: Vec<(String, String, String, i64, Timestamp, String)> = match kind {
            LineKind::Payment => with_conn!(self, conn => {
                let mut query = pay_callback::table
                    .left_join(
                        order_account::table.on(order_account::order_no
                            .eq(pay_callback::out_trade_no)
                            .and(order_account::channel.eq(pay_callback::channel))),
                    )
                    .left_join(
                        bill_line::table.on(bill_line::bill_date
                            .eq(scope.date)
                            .and(bill_line::channel.eq(pay_callback::channel))
                            .and(bill_line::kind.eq(LineKind::Payment.as_str()))
                            .and(bill_line::out_trade_no.eq(pay_callback::out_trade_no))
                            .and(bill_line::out_refund_no.eq(""))
                            .and(same_transaction!())),
                    )
                    .filter(pay_callback::channel.eq(channel))
                    .filter(dated_in!(pay_callback, scope))
                    .filter(bill_line::out_trade_no.nullable().is_null())
                    .into_boxed();
                query = of_account!(query, scope);
                query
                    .select((
                        pay_callback::out_trade_no,
                        sql::<diesel::sql_types::Text>("''"),
                        pay_callback::transaction_id,
                        pay_callback::amount_fen,
                        sql::<UtcTs>(&dated("pay_callback")),
                        sql::<diesel::sql_types::Text>("'PAID'"),
                    ))
                    .limit(limit)
                    .load(conn)
                    .await?
            }),
            LineKind::Refund => with_conn!(self, conn => {
                let mut query = refund_callback::table
                    .left_join(
                        order_account::table.on(order_account::order_no
                            .eq(refund_callback::out_trade_no)
                            .and(order_account::channel.eq(refund_callback::channel))),
                    )
                    .left_join(
                        bill_line::table.on(bill_line::bill_date
                            .eq(scope.date)
                            .and(bill_line::channel.eq(refund_callback::channel))
                            .and(bill_line::kind.eq(LineKind::Refund.as_str()))
                            .and(bill_line::out_trade_no.eq(refund_callback::out_trade_no))
                            .and(bill_line::out_refund_no.eq(refund_callback::out_refund_no))),
                    )
                    .filter(refund_callback::channel.eq(channel))
                    .filter(dated_in!(refund_callback, scope))
                    .filter(bill_line::out_trade_no.nullable().is_null())
                    .into_boxed();
                query = of_account!(query, scope);
                query
                    .select((
                        refund_callback::out_trade_no,
                        refund_callback::out_refund_no,
                        refund_callback::refund_id,
                        refund_callback::refund_fen,
                        sql::<UtcTs>(&dated("refund_callback")),
                        refund_callback::status,
                    ))
                    .limit(limit)
                    .load(conn)
                    .await?
            }),
        };
        Ok(rows
            .into_iter()
            .map(
                |(out_trade_no, out_refund_no, transaction_id, fen, at, status)| OursOnly {
                    // A refund's row holds its refund id there, not the payment's.
                    transaction_id: (kind == LineKind::Payment).then_some(transaction_id),
                    out_trade_no,
                    out_refund_no,
                    fen,
                    at,
                    status,
                },
            )
            .collect())
    }

    /// The ledger's payments and refunds of the account that day: counts and sums.
    pub async fn ours_totals(&self, scope: &Scope<'_>) -> Result<OurTotals, StoreError> {
        let (count, amount_fen) = day_totals!(self, scope, pay_callback, "pay_callback.amount_fen");
        let (refund_count, refund_fen) =
            day_totals!(self, scope, refund_callback, "refund_callback.refund_fen");
        Ok(OurTotals {
            count,
            amount_fen,
            refund_count,
            refund_fen,
        })
    }

    /// Replaces the report of its (date, channel, account) and its items, in one transaction.
    pub async fn save_bill_report(&self, report: &Report) -> Result<(), StoreError> {
        let date = report.date.as_str();
        let channel = report.channel.as_str();
        let account = report.account.as_str();
        let row = ReportRow {
            bill_date: report.date.clone(),
            channel: channel.to_owned(),
            account: account.to_owned(),
            status: report.status.as_str().to_owned(),
            reason: report.reason.clone(),
            fetched_at: report.fetched_at,
            provider_count: report.provider.count,
            provider_amount_fen: report.provider.amount_fen,
            provider_refund_count: report.provider.refund_count,
            provider_refund_fen: report.provider.refund_fen,
            provider_fee_fen: report.provider.fee_fen,
            ours_count: report.ours.count,
            ours_amount_fen: report.ours.amount_fen,
            ours_refund_count: report.ours.refund_count,
            ours_refund_fen: report.ours.refund_fen,
        };
        let items: Vec<ItemRow> = report
            .items
            .iter()
            .map(|i| ItemRow::of(date, report.channel, account, i))
            .collect();
        with_conn!(self, conn => {
            conn.transaction::<_, Error, _>(async |conn| {
                diesel::delete(
                    bill_item::table
                        .filter(bill_item::bill_date.eq(date))
                        .filter(bill_item::channel.eq(channel))
                        .filter(bill_item::account.eq(account)),
                )
                .execute(conn)
                .await?;
                diesel::delete(
                    bill_report::table
                        .filter(bill_report::bill_date.eq(date))
                        .filter(bill_report::channel.eq(channel))
                        .filter(bill_report::account.eq(account)),
                )
                .execute(conn)
                .await?;
                diesel::insert_into(bill_report::table)
                    .values(&row)
                    .execute(conn)
                    .await?;
                for item in &items {
                    diesel::insert_into(bill_item::table)
                        .values(item)
                        .execute(conn)
                        .await?;
                }
                Ok(())
            })
            .await?;
        });
        Ok(())
    }

    /// The stored reports of `date` (of one channel, or all), with their items.
    pub async fn bill_reports(
        &self,
        date: &str,
        channel: Option<ChannelId>,
    ) -> Result<Vec<Report>, StoreError> {
        let (rows, items): (Vec<ReportRow>, Vec<ItemRow>) = with_conn!(self, conn => {
            let mut reports = bill_report::table
                .filter(bill_report::bill_date.eq(date))
                .order((bill_report::channel.asc(), bill_report::account.asc()))
                .into_boxed();
            let mut items = bill_item::table
                .filter(bill_item::bill_date.eq(date))
                .order((
                    bill_item::item_type.asc(),
                    bill_item::out_trade_no.asc(),
                    bill_item::out_refund_no.asc(),
                ))
                .into_boxed();
            if let Some(c) = channel {
                reports = reports.filter(bill_report::channel.eq(c.as_str()));
                items = items.filter(bill_item::channel.eq(c.as_str()));
            }
            (reports.load(conn).await?, items.load(conn).await?)
        });
        let mut reports = Vec::new();
        for r in rows {
            let Some(channel) = ChannelId::parse(&r.channel) else {
                continue;
            };
            let mine = items
                .iter()
                .filter(|i| i.channel == r.channel && i.account == r.account)
                .filter_map(|i| i.clone().item())
                .collect();
            reports.push(Report {
                date: r.bill_date,
                channel,
                account: r.account,
                integrity: crate::channel::bill::Integrity::of(channel),
                status: Status::parse(&r.status).unwrap_or(Status::Unavailable),
                reason: r.reason,
                fetched_at: r.fetched_at,
                provider: BillTotals {
                    count: r.provider_count,
                    amount_fen: r.provider_amount_fen,
                    refund_count: r.provider_refund_count,
                    refund_fen: r.provider_refund_fen,
                    fee_fen: r.provider_fee_fen,
                },
                ours: OurTotals {
                    count: r.ours_count,
                    amount_fen: r.ours_amount_fen,
                    refund_count: r.ours_refund_count,
                    refund_fen: r.ours_refund_fen,
                },
                items: mine,
            });
        }
        Ok(reports)
    }

    /// The items of `channel` of the `kinds` for one payment or refund, in the reports of
    /// every date but `except`, whatever their resolution.
    pub async fn items_elsewhere(
        &self,
        channel: ChannelId,
        kinds: &[ItemType],
        out_trade_no: &str,
        out_refund_no: &str,
        except: &str,
    ) -> Result<Vec<PendingElsewhere>, StoreError> {
        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let rows: Vec<ItemRow> = with_conn!(self, conn => {
            bill_item::table
                .filter(bill_item::channel.eq(channel.as_str()))
                .filter(bill_item::out_trade_no.eq(out_trade_no))
                .filter(bill_item::out_refund_no.eq(out_refund_no))
                .filter(bill_item::item_type.eq_any(&kinds))
                .filter(bill_item::bill_date.ne(except))
                .load(conn)
                .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let (date, account) = (r.bill_date.clone(), r.account.clone());
                r.item().map(|item| PendingElsewhere {
                    date,
                    account,
                    item,
                })
            })
            .collect())
    }

    /// The stored item of the scope's report of `kind` for one payment or refund, if any.
    pub async fn item_of(
        &self,
        scope: &Scope<'_>,
        kind: ItemType,
        out_trade_no: &str,
        out_refund_no: &str,
    ) -> Result<Option<Item>, StoreError> {
        let row: Option<ItemRow> = with_conn!(self, conn => {
            bill_item::table
                .filter(bill_item::bill_date.eq(scope.date))
                .filter(bill_item::channel.eq(scope.channel.as_str()))
                .filter(bill_item::account.eq(scope.account))
                .filter(bill_item::item_type.eq(kind.as_str()))
                .filter(bill_item::out_trade_no.eq(out_trade_no))
                .filter(bill_item::out_refund_no.eq(out_refund_no))
                .first(conn)
                .await
                .optional()?
        });
        Ok(row.and_then(ItemRow::item))
    }

    /// The status of the report of (`date`, `channel`, `account`), if there is one.
    pub async fn report_status(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
    ) -> Result<Option<Status>, StoreError> {
        let status: Option<String> = with_conn!(self, conn => {
            bill_report::table
                .filter(bill_report::bill_date.eq(date))
                .filter(bill_report::channel.eq(channel.as_str()))
                .filter(bill_report::account.eq(account))
                .select(bill_report::status)
                .first(conn)
                .await
                .optional()?
        });
        Ok(status.as_deref().and_then(Status::parse))
    }

    /// Whether `channel` has a report of a date before `date` (the daily job ran then).
    pub async fn reported_before(
        &self,
        channel: ChannelId,
        date: &str,
    ) -> Result<bool, StoreError> {
        let earlier: i64 = with_conn!(self, conn => {
            bill_report::table
                .filter(bill_report::channel.eq(channel.as_str()))
                .filter(bill_report::bill_date.lt(date))
                .count()
                .get_result(conn)
                .await?
        });
        Ok(earlier > 0)
    }

    /// The pending items of `channel` in reports dated `until` or before.
    pub async fn pending_until(
        &self,
        channel: ChannelId,
        until: &str,
    ) -> Result<Vec<PendingElsewhere>, StoreError> {
        let rows: Vec<ItemRow> = with_conn!(self, conn => {
            bill_item::table
                .filter(bill_item::channel.eq(channel.as_str()))
                .filter(bill_item::resolution.eq(Resolution::Pending.as_str()))
                .filter(bill_item::bill_date.le(until))
                .load(conn)
                .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let (date, account) = (r.bill_date.clone(), r.account.clone());
                r.item().map(|item| PendingElsewhere {
                    date,
                    account,
                    item,
                })
            })
            .collect())
    }

    /// Settles a pending item of another report: removed (`None`: the other day's bill
    /// matched it) or given a new resolution; that report's status follows its items.
    pub async fn settle_item(
        &self,
        channel: ChannelId,
        pending: &PendingElsewhere,
        resolution: Option<Resolution>,
    ) -> Result<(), StoreError> {
        let c = channel.as_str();
        let key = bill_item::table
            .filter(bill_item::bill_date.eq(&pending.date))
            .filter(bill_item::channel.eq(c))
            .filter(bill_item::account.eq(&pending.account))
            .filter(bill_item::item_type.eq(pending.item.kind.as_str()))
            .filter(bill_item::out_trade_no.eq(&pending.item.out_trade_no))
            .filter(
                bill_item::out_refund_no.eq(pending.item.out_refund_no.clone().unwrap_or_default()),
            );
        with_conn!(self, conn => {
            conn.transaction::<_, Error, _>(async |conn| {
                match resolution {
                    None => {
                        diesel::delete(key).execute(conn).await?;
                    }
                    Some(r) => {
                        diesel::update(key)
                            .set(bill_item::resolution.eq(r.as_str()))
                            .execute(conn)
                            .await?;
                    }
                }
                let open: i64 = bill_item::table
                    .filter(bill_item::bill_date.eq(&pending.date))
                    .filter(bill_item::channel.eq(c))
                    .filter(bill_item::account.eq(&pending.account))
                    .filter(bill_item::resolution.eq(Resolution::Open.as_str()))
                    .count()
                    .get_result(conn)
                    .await?;
                let status = if open > 0 { Status::Mismatched } else { Status::Balanced };
                diesel::update(
                    bill_report::table
                        .filter(bill_report::bill_date.eq(&pending.date))
                        .filter(bill_report::channel.eq(c))
                        .filter(bill_report::account.eq(&pending.account))
                        .filter(bill_report::status.ne(Status::Unavailable.as_str())),
                )
                .set(bill_report::status.eq(status.as_str()))
                .execute(conn)
                .await?;
                Ok(())
            })
            .await?;
        });
        Ok(())
    }
}
