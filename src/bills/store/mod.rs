//! The bill tables: the lease of a run, the bill's detail rows while it is compared, the
//! set-based comparison with the ledger, and the reports and their items.
//!
//! The comparison is a few statements per account, whatever the bill's size: for payments
//! and for refunds, the bill's rows that the ledger lacks or disagrees with (an outer join on
//! the callback tables' keys) and the ledger's rows of the day that no bill row names (an
//! anti-join on `bill_line`'s key), and the ledger's totals of the day. Only the differences
//! come back to the process (at most a limit of them), and each is then looked up in the
//! other reports' items by its key.

mod comparison;
mod lines;
mod reports;

use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::RunQueryDsl;

use super::report::Item;
use crate::notice::ChannelId;
use crate::store::schema::bill_run;
use crate::store::{Store, StoreError, with_conn};
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

/// A pending item found in another report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingElsewhere {
    pub date: String,
    pub account: String,
    pub item: Item,
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
}
