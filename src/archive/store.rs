//! The archive's statements: one batch of orders past their lifetime locked, read with
//! everything recorded of them, handed to the writer, and deleted — in one transaction, so
//! a row is deleted only once the file holding it is on disk.

use std::collections::HashMap;
use std::future::Future;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde::Serialize;

use crate::order::{OrderStatus, RefundStatus};
use crate::refunds::store::{RefundRow, in_flight};
use crate::store::orders::{PayCallback, RefundCallback, StatusCallback};
use crate::store::schema::{
    order_account, orders, pay_callback, payment_anomaly, refund_callback, refund_request,
    status_callback,
};
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

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

/// Inside the batch's transaction: a statement failed, or the writer did.
#[derive(Debug)]
enum InTx {
    Query(diesel::result::Error),
    Write(std::io::Error),
}

impl From<diesel::result::Error> for InTx {
    fn from(e: diesel::result::Error) -> Self {
        Self::Query(e)
    }
}

impl From<InTx> for BatchError {
    fn from(e: InTx) -> Self {
        match e {
            InTx::Query(e) => Self::Store(StoreError::Query(e)),
            InTx::Write(e) => Self::Write(e),
        }
    }
}

/// For each table whose rows name an archived order (`list: table by column, oldest first by
/// column => Row`): its rows of the batch's orders read into each record's `list`, then
/// deleted, counted in `rows`. The column naming the order is the row's field of that name.
macro_rules! rows_naming {
    ($conn:expr, $keys:expr, $archived:expr, $index:expr, $rows:expr;
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
            $rows += diesel::delete($table::table.filter($table::$column.eq_any($keys)))
                .execute($conn)
                .await?;
        )+
    };
}

impl Store {
    /// Archives at most `limit` orders created before `cutoff` that are final and have no
    /// refund in flight, oldest first: each is locked (an update of its row that changes
    /// nothing: PostgreSQL and MySQL row locks, SQLite's write lock), read with its accounts,
    /// callback rows, refund requests and anomalies, handed to `write`, and deleted with them
    /// once `write` returned — all in one transaction. A refund recorded meanwhile waits for
    /// the lock and then finds no order. `write` failing deletes nothing.
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
            conn.transaction::<_, InTx, _>(async |conn| {
                let in_flight = refund_request::table
                    .filter(refund_request::order_no.eq(orders::order_no))
                    .filter(in_flight!());
                let finals = FINAL.map(OrderStatus::as_str);
                let candidates: Vec<String> = orders::table
                    .filter(orders::created_at.lt(cutoff))
                    .filter(orders::status.eq_any(finals))
                    .filter(diesel::dsl::not(diesel::dsl::exists(in_flight.clone())))
                    .order(orders::created_at)
                    .select(orders::order_no)
                    .limit(limit)
                    .load(conn)
                    .await?;
                if candidates.is_empty() {
                    return Ok(BatchDone::default());
                }
                // The lock; the conditions again, as a concurrent change may have moved one.
                diesel::update(
                    orders::table
                        .filter(orders::order_no.eq_any(&candidates))
                        .filter(orders::created_at.lt(cutoff))
                        .filter(orders::status.eq_any(finals))
                        .filter(diesel::dsl::not(diesel::dsl::exists(in_flight.clone()))),
                )
                .set(orders::close_attempts.eq(orders::close_attempts))
                .execute(conn)
                .await?;
                let locked: Vec<OrderRow> = orders::table
                    .filter(orders::order_no.eq_any(&candidates))
                    .filter(orders::created_at.lt(cutoff))
                    .filter(orders::status.eq_any(finals))
                    .filter(diesel::dsl::not(diesel::dsl::exists(in_flight.clone())))
                    .order(orders::created_at)
                    .select(OrderRow::as_select())
                    .load(conn)
                    .await?;
                let keys: Vec<String> = locked.iter().map(|o| o.order_no.clone()).collect();
                if keys.is_empty() {
                    return Ok(BatchDone::default());
                }
                let (mut archived, index) = records(locked);
                let mut rows = 0;
                rows_naming!(conn, &keys, archived, index, rows;
                    accounts: order_account by order_no, oldest first by order_no => AccountRow,
                    pay_callbacks: pay_callback by out_trade_no, oldest first by created_at => PayCallback,
                    refund_callbacks: refund_callback by out_trade_no, oldest first by created_at => RefundCallback,
                    status_callbacks: status_callback by out_trade_no, oldest first by created_at => StatusCallback,
                    refund_requests: refund_request by order_no, oldest first by created_at => RefundRow,
                    anomalies: payment_anomaly by order_no, oldest first by created_at => AnomalyRow,
                );
                rows += diesel::delete(orders::table.filter(orders::order_no.eq_any(&keys)))
                    .execute(conn)
                    .await?;
                let orders = archived.len();
                // Last, before the commit: a row is gone only once its line is on disk.
                write(archived).await.map_err(InTx::Write)?;
                Ok(BatchDone { orders, rows })
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
