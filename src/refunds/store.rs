//! `refund_request`: a refund is recorded, with the remainder checked under the order's row
//! lock, before its provider is called; then each answer moves it, never backwards.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::order::{Order, OrderStatus, RefundStatus};
use crate::store::schema::{order_account, orders, refund_request};
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// A refund request as stored; `GET /orders/{no}/refunds` shows it through [`super::View`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Queryable, Selectable)]
#[diesel(table_name = refund_request)]
pub struct RefundRow {
    pub out_refund_no: String,
    pub order_no: String,
    pub channel: String,
    pub account: String,
    pub transaction_id: String,
    pub amount_fen: i64,
    pub total_fen: i64,
    pub reason: Option<String>,
    pub status: String,
    pub refund_id: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub attempts: i32,
    pub next_attempt_at: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl RefundRow {
    pub fn status(&self) -> RefundStatus {
        RefundStatus::parse(&self.status).unwrap_or(RefundStatus::Abnormal)
    }

    /// Refused by the provider: nothing exists under its number, so it is final and not in
    /// flight; the same request again sends it again.
    pub fn refused(&self) -> bool {
        self.status() == RefundStatus::Abnormal && self.error_code.is_some()
    }
}

/// A refund to record: its order's payment as the order row says, checked again under lock.
#[derive(Debug, Clone)]
pub struct NewRefund<'a> {
    pub out_refund_no: &'a str,
    pub order_no: &'a str,
    pub account: &'a str,
    pub amount_fen: i64,
    pub reason: Option<&'a str>,
    pub now: Timestamp,
    /// When the job sends it again if this call gets no answer.
    pub retry_at: Timestamp,
}

/// What recording a refund found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded now (or a refused request sent again): it is to be sent.
    Send(RefundRow),
    /// The same request again: the stored refund, nothing sent.
    Same(RefundRow),
    /// The refund number is another order's or another amount's.
    OtherRequest,
    UnknownOrder,
    /// Not `PAID` (or paid through another channel than the one it names now).
    NotRefundable(OrderStatus),
    /// More than is left: paid − refunded − refunds in flight.
    OverRemainder {
        left_fen: i64,
    },
}

/// The statuses whose money may still move: counted against the remainder. Also what keeps
/// an order out of the archive (`crate::archive`).
pub(crate) use crate::store::ledger::refund_in_flight as in_flight;

impl Store {
    /// The account an order names on `channel` (`POST /orders`), if any.
    pub async fn order_account(
        &self,
        order_no: &str,
        channel: &str,
    ) -> Result<Option<String>, StoreError> {
        with_conn!(self, conn => {
            Ok(order_account::table
                .find((order_no, channel))
                .select(order_account::account)
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// Records a refund request in one transaction that first locks the order's row (an
    /// update that changes nothing: a row lock on PostgreSQL and MySQL, the write lock on
    /// SQLite), so two requests for the last fen cannot both pass the remainder check.
    pub async fn record_refund(&self, new: &NewRefund<'_>) -> Result<Recorded, StoreError> {
        with_conn!(self, conn => {
            conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                diesel::update(orders::table.find(new.order_no))
                    .set(orders::refunded_fen.eq(orders::refunded_fen))
                    .execute(conn)
                    .await?;
                let existing: Option<RefundRow> = refund_request::table
                    .find(new.out_refund_no)
                    .select(RefundRow::as_select())
                    .first(conn)
                    .await
                    .optional()?;
                if let Some(row) = &existing {
                    if row.order_no != new.order_no || row.amount_fen != new.amount_fen {
                        return Ok(Recorded::OtherRequest);
                    }
                    if !row.refused() {
                        return Ok(Recorded::Same(row.clone()));
                    }
                }
                let Some(order): Option<Order> = orders::table
                    .find(new.order_no)
                    .select(Order::as_select())
                    .first(conn)
                    .await
                    .optional()?
                else {
                    return Ok(Recorded::UnknownOrder);
                };
                let (Some(channel), Some(transaction_id)) = (&order.channel, &order.transaction_id)
                else {
                    return Ok(Recorded::NotRefundable(order.status));
                };
                if order.status != OrderStatus::Paid {
                    return Ok(Recorded::NotRefundable(order.status));
                }
                // An order has a few refunds: their amounts, summed here.
                let flying: Vec<i64> = refund_request::table
                    .filter(refund_request::order_no.eq(new.order_no))
                    .filter(in_flight!())
                    .select(refund_request::amount_fen)
                    .load(conn)
                    .await?;
                let left_fen = order.amount_fen - order.refunded_fen - flying.iter().sum::<i64>();
                if new.amount_fen > left_fen {
                    return Ok(Recorded::OverRemainder { left_fen: left_fen.max(0) });
                }
                if existing.is_some() {
                    diesel::update(refund_request::table.find(new.out_refund_no))
                        .set((
                            refund_request::status.eq(RefundStatus::Submitting.as_str()),
                            refund_request::error_code.eq(None::<String>),
                            refund_request::error_message.eq(None::<String>),
                            refund_request::account.eq(new.account),
                            refund_request::reason.eq(new.reason),
                            refund_request::next_attempt_at.eq(new.retry_at),
                            refund_request::updated_at.eq(new.now),
                        ))
                        .execute(conn)
                        .await?;
                } else {
                    // The same number may be recorded for another order at this moment (that
                    // order's lock is not this one's): the insert then waits for it, and its
                    // primary key says so. Inside a savepoint, so the transaction goes on.
                    let inserted = conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                        diesel::insert_into(refund_request::table)
                            .values((
                                refund_request::out_refund_no.eq(new.out_refund_no),
                                refund_request::order_no.eq(new.order_no),
                                refund_request::channel.eq(channel),
                                refund_request::account.eq(new.account),
                                refund_request::transaction_id.eq(transaction_id),
                                refund_request::amount_fen.eq(new.amount_fen),
                                refund_request::total_fen.eq(order.amount_fen),
                                refund_request::reason.eq(new.reason),
                                refund_request::status.eq(RefundStatus::Submitting.as_str()),
                                refund_request::attempts.eq(0),
                                refund_request::next_attempt_at.eq(new.retry_at),
                                refund_request::created_at.eq(new.now),
                                refund_request::updated_at.eq(new.now),
                            ))
                            .execute(conn)
                            .await
                    })
                    .await;
                    match inserted {
                        Ok(_) => {}
                        Err(diesel::result::Error::DatabaseError(
                            diesel::result::DatabaseErrorKind::UniqueViolation,
                            _,
                        )) => {
                            let row: RefundRow = refund_request::table
                                .find(new.out_refund_no)
                                .select(RefundRow::as_select())
                                .first(conn)
                                .await?;
                            let same = row.order_no == new.order_no
                                && row.amount_fen == new.amount_fen;
                            return Ok(if same {
                                Recorded::Same(row)
                            } else {
                                Recorded::OtherRequest
                            });
                        }
                        Err(e) => return Err(e),
                    }
                }
                let row = refund_request::table
                    .find(new.out_refund_no)
                    .select(RefundRow::as_select())
                    .first(conn)
                    .await?;
                Ok(Recorded::Send(row))
            })
            .await
            .map_err(StoreError::from)
        })
    }

    pub async fn refund_request(
        &self,
        out_refund_no: &str,
    ) -> Result<Option<RefundRow>, StoreError> {
        with_conn!(self, conn => {
            Ok(refund_request::table
                .find(out_refund_no)
                .select(RefundRow::as_select())
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// An order's refund requests, oldest first.
    pub async fn refunds_of(&self, order_no: &str) -> Result<Vec<RefundRow>, StoreError> {
        with_conn!(self, conn => {
            Ok(refund_request::table
                .filter(refund_request::order_no.eq(order_no))
                .order((refund_request::created_at.asc(), refund_request::out_refund_no.asc()))
                .select(RefundRow::as_select())
                .load(conn)
                .await?)
        })
    }

    /// The requests not final whose next call is due, oldest due first.
    pub async fn refunds_due(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> Result<Vec<RefundRow>, StoreError> {
        with_conn!(self, conn => {
            Ok(refund_request::table
                .filter(in_flight!())
                .filter(refund_request::next_attempt_at.le(now))
                .order(refund_request::next_attempt_at.asc())
                .limit(limit)
                .select(RefundRow::as_select())
                .load(conn)
                .await?)
        })
    }

    /// Takes a due request for one call: its next call moved to `next` and counted, if it is
    /// still as `row` read it (another instance's job did not take it first).
    pub async fn claim_refund(&self, row: &RefundRow, next: Timestamp) -> Result<bool, StoreError> {
        with_conn!(self, conn => {
            let taken = diesel::update(
                refund_request::table
                    .find(&row.out_refund_no)
                    .filter(refund_request::status.eq(&row.status))
                    .filter(refund_request::next_attempt_at.eq(row.next_attempt_at)),
            )
            .set((
                refund_request::next_attempt_at.eq(next),
                refund_request::attempts.eq(refund_request::attempts + 1),
            ))
            .execute(conn)
            .await?;
            Ok(taken == 1)
        })
    }

    /// Moves a request from `from` to what the provider said; never out of a final status,
    /// so an answer cannot undo the `SUCCESS` a notification set meanwhile.
    pub async fn move_refund(
        &self,
        out_refund_no: &str,
        from: RefundStatus,
        to: &RefundMove<'_>,
    ) -> Result<bool, StoreError> {
        with_conn!(self, conn => {
            // An acceptance also moves a request a concurrent send saw refused: the signed
            // acceptance is the provider's last word.
            let refused_too = to.error.is_none();
            let moved = diesel::update(
                refund_request::table.find(out_refund_no).filter(
                    refund_request::status.eq(from.as_str()).or(refund_request::status
                        .eq(RefundStatus::Abnormal.as_str())
                        .and(refund_request::error_code.is_not_null())
                        .and(refused_too.into_sql::<diesel::sql_types::Bool>())),
                ),
            )
            .set((
                refund_request::status.eq(to.status.as_str()),
                refund_request::refund_id.eq(to.refund_id),
                refund_request::error_code.eq(to.error.map(|e| e.0)),
                refund_request::error_message.eq(to.error.map(|e| e.1)),
                refund_request::updated_at.eq(to.now),
            ))
            .execute(conn)
            .await?;
            if moved == 1 && let Some(next) = to.next_attempt_at {
                diesel::update(refund_request::table.find(out_refund_no))
                    .set(refund_request::next_attempt_at.eq(next))
                    .execute(conn)
                    .await?;
            }
            Ok(moved == 1)
        })
    }
}

/// Where one answer moves a request.
#[derive(Debug, Clone, Copy)]
pub struct RefundMove<'a> {
    pub status: RefundStatus,
    pub refund_id: Option<&'a str>,
    /// A refusal's code and message.
    pub error: Option<(&'a str, &'a str)>,
    /// When the job calls next; `None` leaves the time the job's claim set.
    pub next_attempt_at: Option<Timestamp>,
    pub now: Timestamp,
}
