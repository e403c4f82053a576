//! The archive's statements: one batch of orders past their lifetime read with everything
//! recorded of them, handed to the writer, and deleted, so a row is deleted only once the
//! file holding it is on disk (`Store::archive_batch`).

use std::collections::HashMap;
use std::future::Future;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde::Serialize;

use crate::order::{OrderStatus, RefundStatus};
use crate::refunds::store::{RefundRow, in_flight};
use crate::store::orders::{PayCallback, RefundCallback, StatusCallback};
use crate::store::schema::{
    bill_item, bill_line, bill_run, order_account, orders, pay_callback, payment_anomaly,
    refund_callback, refund_request, status_callback,
};
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;
use diesel::dsl::{exists, not};

/// The statuses nothing moves any more but a refund, which the window leaves room for.
const FINAL: [OrderStatus; 3] = [
    OrderStatus::Paid,
    OrderStatus::Refunded,
    OrderStatus::Closed,
];

/// An order's row, every column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable, Selectable)]
#[diesel(table_name = orders)]
pub struct OrderRow {
    pub order_no: String,
    pub status: String,
    pub amount_fen: i64,
    pub refunded_fen: i64,
    pub currency: String,
    pub subject: String,
    pub channel: Option<String>,
    pub transaction_id: Option<String>,
    pub created_at: Timestamp,
    pub paid_at: Option<Timestamp>,
    pub closed_at: Option<Timestamp>,
    pub expire_at: Timestamp,
    pub next_query_at: Option<Timestamp>,
    pub close_attempts: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable, Selectable)]
#[diesel(table_name = order_account)]
pub struct AccountRow {
    pub order_no: String,
    pub channel: String,
    pub account: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Queryable, Selectable)]
#[diesel(table_name = payment_anomaly)]
pub struct AnomalyRow {
    pub biz_key: String,
    pub order_no: String,
    pub payload: Payload,
    pub created_at: Timestamp,
}

/// One archived order: a line of the archive (docs/operations.md, "The order archive").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArchivedOrder {
    /// The line's format; a reader refuses one it does not know.
    pub format: u32,
    pub order: OrderRow,
    pub accounts: Vec<AccountRow>,
    pub pay_callbacks: Vec<PayCallback>,
    pub refund_callbacks: Vec<RefundCallback>,
    pub status_callbacks: Vec<StatusCallback>,
    pub refund_requests: Vec<RefundRow>,
    pub anomalies: Vec<AnomalyRow>,
}

/// The format [`ArchivedOrder::format`] is written in.
pub const FORMAT: u32 = 1;

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchDone {
    pub orders: usize,
    /// Rows deleted, the orders' own included.
    pub rows: usize,
}

/// Why a batch was not archived; nothing of it was deleted.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The writer failed: the batch's rows stay and the next run writes them again.
    #[error("the archive could not be written: {0}")]
    Write(#[source] std::io::Error),
}

impl From<diesel::result::Error> for BatchError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Store(StoreError::Query(e))
    }
}

/// The orders of `$query` past their lifetime at `$cutoff`: final (`PAID`, `REFUNDED`,
/// `CLOSED`), created before the cutoff, and with no money moving since it — paid before it
/// (a refund may come up to a year after the payment, and an order may be paid up to a month
/// after it was created), no payment, refund or anomaly recorded since, and no refund request
/// in flight or changed since. The creation time alone leads to the index.
macro_rules! past_window {
    ($query:expr, $cutoff:expr) => {{
        let cutoff: Timestamp = $cutoff;
        $query
            .filter(orders::created_at.lt(cutoff))
            .filter(orders::status.eq_any(FINAL.map(OrderStatus::as_str)))
            .filter(orders::paid_at.is_null().or(orders::paid_at.lt(cutoff)))
            .filter(not(exists(
                pay_callback::table
                    .filter(pay_callback::out_trade_no.eq(orders::order_no))
                    .filter(pay_callback::created_at.ge(cutoff)),
            )))
            .filter(not(exists(
                refund_callback::table
                    .filter(refund_callback::out_trade_no.eq(orders::order_no))
                    .filter(refund_callback::created_at.ge(cutoff)),
            )))
            .filter(not(exists(
                refund_request::table
                    .filter(refund_request::order_no.eq(orders::order_no))
                    .filter(in_flight!().or(refund_request::updated_at.ge(cutoff))),
            )))
            .filter(not(exists(
                payment_anomaly::table
                    .filter(payment_anomaly::order_no.eq(orders::order_no))
                    .filter(payment_anomaly::created_at.ge(cutoff)),
            )))
    }};
}

/// The orders of `$keys` still past their window at `$cutoff`, oldest first, each with
/// everything recorded of it (`list: table by column, oldest first by column => Row`: the
/// rows of `table` whose `column` names the order, into the record's `list`).
macro_rules! records_of {
    (@lists $conn:expr, $keys:expr, $archived:expr, $index:expr;
     $($list:ident: $table:ident by $column:ident, oldest first by $order:ident => $row:ty),+ $(,)?) => {
        $(
            let found: Vec<$row> = $table::table
                .filter($table::$column.eq_any($keys))
                .order($table::$order)
                .select(<$row>::as_select())
                .load($conn)
                .await?;
            for row in found {
                if let Some(&i) = $index.get(&row.$column) {
                    $archived[i].$list.push(row);
                }
            }
        )+
    };
    ($conn:expr, $keys:expr, $cutoff:expr) => {{
        let keys: &[String] = $keys;
        let found: Vec<OrderRow> = past_window!(orders::table, $cutoff)
            .filter(orders::order_no.eq_any(keys))
            .order((orders::created_at, orders::order_no))
            .select(OrderRow::as_select())
            .load($conn)
            .await?;
        let (mut archived, index) = records(found);
        records_of!(@lists $conn, keys, archived, index;
            accounts: order_account by order_no, oldest first by order_no => AccountRow,
            pay_callbacks: pay_callback by out_trade_no, oldest first by created_at => PayCallback,
            refund_callbacks: refund_callback by out_trade_no, oldest first by created_at => RefundCallback,
            status_callbacks: status_callback by out_trade_no, oldest first by created_at => StatusCallback,
            refund_requests: refund_request by order_no, oldest first by created_at => RefundRow,
            anomalies: payment_anomaly by order_no, oldest first by created_at => AnomalyRow,
        );
        archived
    }};
}

/// Deletes the orders of `$keys` and every row naming them; the rows deleted.
macro_rules! delete_orders {
    (@each $conn:expr, $keys:expr, $rows:ident; $($table:ident by $column:ident),+) => {
        $(
            $rows += diesel::delete($table::table.filter($table::$column.eq_any($keys)))
                .execute($conn)
                .await?;
        )+
    };
    ($conn:expr, $keys:expr) => {{
        let keys: &[String] = $keys;
        let mut rows = 0;
        delete_orders!(@each $conn, keys, rows;
            order_account by order_no, pay_callback by out_trade_no,
            refund_callback by out_trade_no, status_callback by out_trade_no,
            refund_request by order_no, payment_anomaly by order_no, orders by order_no);
        rows
    }};
}

/// The numbers of at most `$limit` orders past their window, oldest first.
macro_rules! candidates {
    ($conn:expr, $cutoff:expr, $limit:expr) => {{
        let keys: Vec<String> = past_window!(orders::table, $cutoff)
            .order((orders::created_at, orders::order_no))
            .select(orders::order_no)
            .limit($limit)
            .load($conn)
            .await?;
        keys
    }};
}

/// Locks the orders of `$keys` still past their window: an update of their rows that
/// changes nothing (PostgreSQL and MySQL row locks; SQLite's write lock, taken by the
/// transaction's first statement, so it waits for another writer instead of failing).
macro_rules! lock_orders {
    ($conn:expr, $keys:expr, $cutoff:expr) => {
        diesel::update(past_window!(orders::table, $cutoff).filter(orders::order_no.eq_any($keys)))
            .set(orders::close_attempts.eq(orders::close_attempts))
            .execute($conn)
            .await?
    };
}

impl Store {
    /// Archives at most `limit` orders past their window at `cutoff` (see `past_window!`),
    /// oldest first, each with its accounts, callback rows, refund requests and anomalies:
    /// the batch is read, handed to `write` (which gzips it and syncs it to disk) outside any
    /// transaction, and then deleted in a short one that locks the orders first (an update
    /// of their rows that changes nothing: PostgreSQL and MySQL row locks, SQLite's write
    /// lock, which a transaction beginning with a write waits for rather than fails) and
    /// reads each record again: only an order whose rows are still as written is deleted;
    /// one that changed meanwhile (a refund came) stays for the next run, its line holding
    /// the state before. No lock is held while the file is written: on SQLite the lock is
    /// the whole file's, and on MySQL the batch's deleted index records held up another order's
    /// payment.
    /// `write` failing deletes nothing.
    pub async fn archive_batch<W, F>(
        &self,
        cutoff: Timestamp,
        limit: i64,
        write: W,
    ) -> Result<BatchDone, BatchError>
    where
        W: FnOnce(Vec<ArchivedOrder>) -> F + Send,
        F: Future<Output = std::io::Result<()>> + Send,
    {
        with_conn!(self, conn => {
            // One snapshot where the backend gives one (MySQL, SQLite): a batch read across
            // a change is no loss either way, as the deletion compares.
            let read = conn
                .transaction::<_, diesel::result::Error, _>(async |conn| {
                    let keys = candidates!(conn, cutoff, limit);
                    Ok(records_of!(conn, &keys, cutoff))
                })
                .await?;
            if read.is_empty() {
                return Ok(BatchDone::default());
            }
            write(read.clone()).await.map_err(BatchError::Write)?;
            let keys: Vec<String> = read.iter().map(|r| r.order.order_no.clone()).collect();
            conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                lock_orders!(conn, &keys, cutoff);
                let now = records_of!(conn, &keys, cutoff);
                let written: HashMap<&str, &ArchivedOrder> =
                    read.iter().map(|r| (r.order.order_no.as_str(), r)).collect();
                let unchanged: Vec<String> = now
                    .iter()
                    .filter(|r| {
                        written
                            .get(r.order.order_no.as_str())
                            .is_some_and(|w| *w == *r)
                    })
                    .map(|r| r.order.order_no.clone())
                    .collect();
                if unchanged.is_empty() {
                    return Ok(BatchDone::default());
                }
                let rows = delete_orders!(conn, &unchanged);
                Ok(BatchDone {
                    orders: unchanged.len(),
                    rows,
                })
            })
            .await
            .map_err(BatchError::from)
        })
    }
}

/// The records of `orders`, in their order, each with its lists still empty, and where each
/// order's record is.
fn records(orders: Vec<OrderRow>) -> (Vec<ArchivedOrder>, HashMap<String, usize>) {
    let index = orders
        .iter()
        .enumerate()
        .map(|(i, o)| (o.order_no.clone(), i))
        .collect();
    let archived = orders
        .into_iter()
        .map(|order| ArchivedOrder {
            format: FORMAT,
            order,
            accounts: Vec::new(),
            pay_callbacks: Vec::new(),
            refund_callbacks: Vec::new(),
            status_callbacks: Vec::new(),
            refund_requests: Vec::new(),
            anomalies: Vec::new(),
        })
        .collect();
    (archived, index)
}

/// An anomaly of an order not here (never created, or archived before the anomaly came: a
/// bill's difference about a payment this ledger never saw): a line of the anomalies' archive
/// (docs/operations.md, "The order archive").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArchivedAnomaly {
    /// The line's format, as [`ArchivedOrder::format`].
    pub format: u32,
    pub anomaly: AnomalyRow,
}

impl Store {
    /// At most `limit` anomalies recorded before `cutoff` whose order is not here, oldest
    /// first, handed to `write`, then deleted (unless their order appeared meanwhile: they
    /// are its anomalies again). An anomaly is never changed once recorded, so the rows
    /// deleted are the rows written. Returns how many were written and how many deleted;
    /// `write` failing deletes nothing.
    pub async fn archive_orphan_anomalies<W, F>(
        &self,
        cutoff: Timestamp,
        limit: i64,
        write: W,
    ) -> Result<(usize, usize), BatchError>
    where
        W: FnOnce(Vec<ArchivedAnomaly>) -> F + Send,
        F: Future<Output = std::io::Result<()>> + Send,
    {
        with_conn!(self, conn => {
            let orphan = |at: Timestamp| {
                payment_anomaly::created_at.lt(at).and(not(exists(
                    orders::table.filter(orders::order_no.eq(payment_anomaly::order_no)),
                )))
            };
            let found: Vec<AnomalyRow> = payment_anomaly::table
                .filter(orphan(cutoff))
                .order((payment_anomaly::created_at, payment_anomaly::biz_key))
                .select(AnomalyRow::as_select())
                .limit(limit)
                .load(conn)
                .await
                .map_err(StoreError::Query)?;
            if found.is_empty() {
                return Ok((0, 0));
            }
            let keys: Vec<String> = found.iter().map(|a| a.biz_key.clone()).collect();
            let written = found.len();
            let lines = found
                .into_iter()
                .map(|anomaly| ArchivedAnomaly { format: FORMAT, anomaly })
                .collect();
            write(lines).await.map_err(BatchError::Write)?;
            let deleted = diesel::delete(
                payment_anomaly::table
                    .filter(payment_anomaly::biz_key.eq_any(&keys))
                    .filter(orphan(cutoff)),
            )
            .execute(conn)
            .await
            .map_err(StoreError::Query)?;
            Ok((written, deleted))
        })
    }

    /// Deletes the differences the daily bill runs found (`bill_item`) of the oldest bill
    /// date before `before` (`YYYY-MM-DD`): a date's in one statement (a date holds at most
    /// 10,000 per account). The rows deleted; 0 when no date is left before `before`.
    pub async fn purge_bill_items_of_a_date(&self, before: &str) -> Result<usize, StoreError> {
        with_conn!(self, conn => {
            let oldest: Option<String> = bill_item::table
                .filter(bill_item::bill_date.lt(before))
                .select(diesel::dsl::min(bill_item::bill_date))
                .first(conn)
                .await?;
            let Some(date) = oldest else { return Ok(0) };
            Ok(diesel::delete(bill_item::table.filter(bill_item::bill_date.eq(date)))
                .execute(conn)
                .await?)
        })
    }

    /// Deletes the bill rows (`bill_line`) a run left behind of the oldest (bill date,
    /// channel) before `before` (`YYYY-MM-DD`) that no run holds at `now` (a run empties
    /// them when it ends; one that died does not). The rows deleted; `None` when no such
    /// (date, channel) is left.
    pub async fn purge_bill_lines_of_a_date(
        &self,
        before: &str,
        now: Timestamp,
    ) -> Result<Option<usize>, StoreError> {
        with_conn!(self, conn => {
            let left = |before: &str| {
                bill_line::bill_date.lt(before.to_owned()).and(not(exists(
                    bill_run::table
                        .filter(bill_run::bill_date.eq(bill_line::bill_date))
                        .filter(bill_run::channel.eq(bill_line::channel))
                        .filter(bill_run::locked_until.gt(now)),
                )))
            };
            let next: Option<(String, String)> = bill_line::table
                .filter(left(before))
                .select((bill_line::bill_date, bill_line::channel))
                .order((bill_line::bill_date, bill_line::channel))
                .first(conn)
                .await
                .optional()?;
            let Some((date, channel)) = next else { return Ok(None) };
            // The lease again: a run of that (date, channel) may have started meanwhile.
            let deleted = diesel::delete(
                bill_line::table
                    .filter(bill_line::bill_date.eq(&date))
                    .filter(bill_line::channel.eq(&channel))
                    .filter(left(before)),
            )
            .execute(conn)
            .await?;
            Ok(Some(deleted))
        })
    }
}
