//! The ledger: one verified notice becomes, in ONE transaction, a callback row, an order
//! compare-and-set and an outbox message — or nothing at all.
//!
//! The unique keys of `pay_callback` / `refund_callback` decide first-vs-duplicate (no
//! check-then-act), inserts use `ON CONFLICT DO NOTHING` so no statement fails inside a
//! PostgreSQL transaction, and every order update is conditional on the status it leaves.
//! SQLite: every write transaction here starts with a write, so it takes the write lock at
//! its first statement and waits on the busy timeout instead of failing with SQLITE_BUSY.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::schema::{local_message, orders, pay_callback, refund_callback, status_callback};
use super::statements::{InsertMessage, InsertPayCallback, MarkPaid};
use super::types::Payload;
use super::{Store, StoreError, with_conn};
use crate::notice::{AnomalyReason, Digest, Notice, NoticeKind, Outcome, Refund, RefundAmount};
use crate::order::{Order, OrderStatus};
use crate::outbox::{Message, status};
use crate::time::Timestamp;

#[derive(Insertable)]
#[diesel(table_name = refund_callback)]
struct NewRefundCallback<'a> {
    out_refund_no: &'a str,
    channel: &'a str,
    out_trade_no: &'a str,
    refund_id: &'a str,
    refund_fen: i64,
    status: &'a str,
    digest: &'a str,
    created_at: Timestamp,
}

#[derive(Insertable)]
#[diesel(table_name = local_message)]
pub(crate) struct NewMessage<'a> {
    topic: &'a str,
    biz_key: &'a str,
    payload: Payload,
    status: i16,
    attempts: i32,
    next_attempt_at: Timestamp,
    created_at: Timestamp,
}

impl<'a> NewMessage<'a> {
    pub(crate) fn pending(message: &'a Message, now: Timestamp) -> Self {
        Self {
            topic: message.topic.as_str(),
            biz_key: &message.biz_key,
            payload: Payload(message.payload.clone()),
            status: status::PENDING,
            attempts: 0,
            next_attempt_at: now,
            created_at: now,
        }
    }
}

/// Ends a transaction early: a database error, or an outcome that must leave nothing behind
/// (the callback row inserted at the start is rolled back with it).
pub(crate) enum Abort {
    Db(diesel::result::Error),
    With(Outcome),
}

impl From<diesel::result::Error> for Abort {
    fn from(e: diesel::result::Error) -> Self {
        Self::Db(e)
    }
}

pub(crate) fn settle(result: Result<Outcome, Abort>) -> Result<Outcome, StoreError> {
    match result {
        Ok(outcome) | Err(Abort::With(outcome)) => Ok(outcome),
        Err(Abort::Db(e)) => Err(StoreError::Query(e)),
    }
}

/// Writes a `PAYMENT_ANOMALY` message once: `Outcome::Anomaly` when it is new; when the
/// message exists already, the notice is a repeat of a recorded anomaly, and the
/// transaction is rolled back as a duplicate. (A macro: the body is compiled once per
/// backend inside `with_conn!`.)
macro_rules! record_anomaly {
    ($conn:expr, $n:expr, $provider_id:expr, $reason:expr, $order:expr, $now:expr) => {{
        let reason = $reason;
        let message = Message::payment_anomaly($n, $provider_id, reason, $order);
        let inserted = diesel::insert_into(local_message::table)
            .values(&NewMessage::pending(&message, $now))
            .on_conflict((local_message::topic, local_message::biz_key))
            .do_nothing()
            .execute($conn)
            .await?;
        if inserted == 0 {
            Err(Abort::With(Outcome::Duplicate))
        } else {
            Ok(Outcome::Anomaly(reason))
        }
    }};
}

/// Why a payment that did not move the order is an anomaly; `None` when it is the payment
/// the order already records (a repeat that outlived its callback row).
pub fn payment_anomaly(order: &Order, n: &Notice) -> Option<AnomalyReason> {
    if !n.merchant_matches {
        return Some(AnomalyReason::MerchantMismatch);
    }
    match order.status {
        OrderStatus::Closed => Some(AnomalyReason::PaidAfterClose),
        OrderStatus::Paid | OrderStatus::Refunded => {
            let same_payment = order.channel.as_deref() == Some(n.channel.as_str())
                && order.transaction_id.as_deref() == Some(n.transaction_id.as_str());
            (!same_payment).then_some(AnomalyReason::DuplicatePayment)
        }
        OrderStatus::WaitPay => Some(AnomalyReason::AmountMismatch),
    }
}

/// `status_callback.status` of a provider's close of its unpaid trade.
pub const STATUS_CLOSED: &str = "CLOSED";

/// What closing an order found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseResult {
    /// `WAIT_PAY → CLOSED` happened now, with its `ORDER_CLOSED` message.
    Closed(Order),
    AlreadyClosed(Order),
    /// Paid or refunded: never closed.
    NotClosable(Order),
    NotFound,
}

impl Store {
    /// Applies one verified notice. Signature checks happen before this; the amount,
    /// currency and merchant checks happen here, against the order.
    pub async fn apply(&self, notice: &Notice, now: Timestamp) -> Result<Outcome, StoreError> {
        match &notice.kind {
            NoticeKind::Paid => self.apply_payment(notice, &notice.digest(), now).await,
            NoticeKind::Refunded(refund) => {
                self.apply_refund(notice, refund, &notice.digest(), now)
                    .await
            }
            NoticeKind::Closed => self.record_status(notice, now).await,
            NoticeKind::Other { .. } => Ok(Outcome::Ignored),
        }
    }

    async fn apply_payment(
        &self,
        n: &Notice,
        digest: &Digest,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let channel = n.channel.as_str();
        let result = with_conn!(self, conn => {
            conn.transaction::<_, Abort, _>(async |conn| {
                let inserted = InsertPayCallback {
                    out_trade_no: &n.out_trade_no,
                    channel,
                    transaction_id: &n.transaction_id,
                    amount_fen: n.amount_fen,
                    digest: digest.as_str(),
                    created_at: now,
                }
                .execute(conn)
                .await?;
                if inserted == 0 {
                    // Under READ COMMITTED this statement sees the winner's committed row.
                    let (seen_txn, seen_digest): (String, String) = pay_callback::table
                        .find((&n.out_trade_no, channel))
                        .select((pay_callback::transaction_id, pay_callback::digest))
                        .first(conn)
                        .await?;
                    if seen_digest == digest.as_str() {
                        return Ok(Outcome::Duplicate);
                    }
                    if seen_txn == n.transaction_id {
                        // The same payment with other content: the provider contradicts itself.
                        return Ok(Outcome::Conflict);
                    }
                    // Another real payment under the same key (a second merchant or app of
                    // this channel): money arrived, so it is recorded, once. Its anomaly
                    // message, which retention keeps, is what makes its retries duplicates.
                    let order: Order = orders::table
                        .find(&n.out_trade_no)
                        .select(Order::as_select())
                        .first(conn)
                        .await?;
                    return record_anomaly!(conn, n, &n.transaction_id, AnomalyReason::DuplicatePayment, &order, now);
                }
                if n.merchant_matches {
                    let moved = MarkPaid {
                        order_no: &n.out_trade_no,
                        amount_fen: n.amount_fen,
                        currency: &n.currency,
                        channel,
                        transaction_id: &n.transaction_id,
                        paid_at: now,
                    }
                    .execute(conn)
                    .await?;
                    if moved == 1 {
                        let message = Message::order_paid(n, now);
                        InsertMessage::pending(&message, now).execute(conn).await?;
                        return Ok(Outcome::Applied);
                    }
                }
                let order: Option<Order> = orders::table
                    .find(&n.out_trade_no)
                    .select(Order::as_select())
                    .first(conn)
                    .await
                    .optional()?;
                let Some(order) = order else {
                    return Err(Abort::With(Outcome::UnknownOrder));
                };
                let Some(reason) = payment_anomaly(&order, n) else {
                    return Err(Abort::With(Outcome::Duplicate));
                };
                record_anomaly!(conn, n, &n.transaction_id, reason, &order, now)
            })
            .await
        });
        settle(result)
    }

    async fn apply_refund(
        &self,
        n: &Notice,
        refund: &Refund,
        digest: &Digest,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let channel = n.channel.as_str();
        let reported = match refund.amount {
            RefundAmount::This(fen) | RefundAmount::RunningTotal(fen) => fen,
        };
        let callback = NewRefundCallback {
            out_refund_no: &refund.out_refund_no,
            channel,
            out_trade_no: &n.out_trade_no,
            refund_id: &refund.refund_id,
            refund_fen: reported,
            status: "SUCCESS",
            digest: digest.as_str(),
            created_at: now,
        };
        let refund_key = (&refund.out_refund_no, channel, &n.out_trade_no);
        let result = with_conn!(self, conn => {
            conn.transaction::<_, Abort, _>(async |conn| {
                let inserted = diesel::insert_into(refund_callback::table)
                    .values(&callback)
                    .on_conflict((
                        refund_callback::out_refund_no,
                        refund_callback::channel,
                        refund_callback::out_trade_no,
                    ))
                    .do_nothing()
                    .execute(conn)
                    .await?;
                if inserted == 0 {
                    let seen: String = refund_callback::table
                        .find(refund_key)
                        .select(refund_callback::digest)
                        .first(conn)
                        .await?;
                    return Ok(if seen == digest.as_str() { Outcome::Duplicate } else { Outcome::Conflict });
                }
                let order: Option<Order> = orders::table
                    .find(&n.out_trade_no)
                    .select(Order::as_select())
                    .first(conn)
                    .await
                    .optional()?;
                let Some(before) = order else {
                    return Err(Abort::With(Outcome::UnknownOrder));
                };
                if before.status == OrderStatus::WaitPay && n.merchant_matches {
                    // A payment through this channel that did not pay the order (recorded as
                    // an anomaly) is being refunded: record that too. Otherwise the refund
                    // overtook its payment notification: keep nothing, let the provider retry
                    // once the payment is in.
                    let paid_here: i64 = pay_callback::table
                        .filter(pay_callback::out_trade_no.eq(&n.out_trade_no))
                        .filter(pay_callback::channel.eq(channel))
                        .count()
                        .get_result(conn)
                        .await?;
                    if paid_here == 0 {
                        return Err(Abort::With(Outcome::TooEarly));
                    }
                }
                // Only a refund of the order's own recorded payment moves it: same channel,
                // same provider transaction (ids the provider issues once, so the same
                // merchant too), and the merchant the signing key belongs to.
                let ours = n.merchant_matches
                    && before.channel.as_deref() == Some(channel)
                    && before.transaction_id.as_deref() == Some(n.transaction_id.as_str());
                // This refund's amount. A running total only means something against the
                // refunds of the channel that was paid; the update below applies only to the
                // state it was computed from.
                let (fen, seen_refunded) = match refund.amount {
                    RefundAmount::This(fen) => (fen, (0, i64::MAX)),
                    RefundAmount::RunningTotal(total) if ours => {
                        (total - before.refunded_fen, (before.refunded_fen, before.refunded_fen))
                    }
                    RefundAmount::RunningTotal(total) => (total, (0, i64::MAX)),
                };
                if matches!(refund.amount, RefundAmount::RunningTotal(_)) {
                    diesel::update(refund_callback::table.find(refund_key))
                        .set(refund_callback::refund_fen.eq(fen.max(0)))
                        .execute(conn)
                        .await?;
                    if ours && fen <= 0 {
                        // A later refund's running total already counted this one (they
                        // arrived out of order): its event says so with refund_fen 0.
                        let message = Message::order_refunded(n, refund, 0, &before);
                        InsertMessage::pending(&message, now).execute(conn).await?;
                        return Ok(Outcome::Applied);
                    }
                }
                // Never more than was paid: checked here so the sums below cannot overflow.
                let fits = fen > 0 && fen <= before.amount_fen - before.refunded_fen;
                let moved = if fits && ours && before.status == OrderStatus::Paid {
                    // Partial refunds keep PAID and add up; the one that reaches the amount
                    // moves PAID → REFUNDED.
                    diesel::update(
                        orders::table
                            .filter(orders::order_no.eq(&n.out_trade_no))
                            .filter(orders::status.eq(OrderStatus::Paid))
                            .filter(orders::channel.eq(channel))
                            .filter(orders::refunded_fen.between(seen_refunded.0, seen_refunded.1))
                            .filter((orders::refunded_fen + fen).le(orders::amount_fen)),
                    )
                    .set((
                        orders::refunded_fen.eq(orders::refunded_fen + fen),
                        orders::status.eq(diesel::dsl::case_when(
                            (orders::refunded_fen + fen).ge(orders::amount_fen),
                            OrderStatus::Refunded.into_sql::<diesel::sql_types::Text>(),
                        )
                        .otherwise(orders::status)),
                    ))
                    .execute(conn)
                    .await?
                } else {
                    0
                };
                let order: Order = orders::table
                    .find(&n.out_trade_no)
                    .select(Order::as_select())
                    .first(conn)
                    .await?;
                if moved == 1 {
                    let message = Message::order_refunded(n, refund, fen, &order);
                    InsertMessage::pending(&message, now).execute(conn).await?;
                    return Ok(Outcome::Applied);
                }
                if order.refunded_fen != before.refunded_fen {
                    // Another refund of this order committed in between: retry.
                    return Err(Abort::With(Outcome::Contended));
                }
                if !n.merchant_matches {
                    let reason = AnomalyReason::MerchantMismatch;
                    return record_anomaly!(conn, n, &refund.refund_id, reason, &order, now);
                }
                if !ours {
                    // The refund of another payment (a second payment, one after close, a
                    // payment through the other channel): the order's own payment stands.
                    let reason = AnomalyReason::OtherPaymentRefunded;
                    return record_anomaly!(conn, n, &refund.out_refund_no, reason, &order, now);
                }
                record_anomaly!(conn, n, &refund.refund_id, AnomalyReason::AmountMismatch, &order, now)
            })
            .await
        });
        settle(result)
    }

    /// Records a notice that changes nothing but must be seen (Alipay `TRADE_CLOSED` without
    /// a refund: that trade can no longer be paid, yet the buyer may still pay the order
    /// through another channel). One `status_callback` row per order, channel, trade and
    /// status; a repeat is a duplicate.
    async fn record_status(&self, n: &Notice, now: Timestamp) -> Result<Outcome, StoreError> {
        let channel = n.channel.as_str();
        with_conn!(self, conn => {
            let known: i64 = orders::table
                .filter(orders::order_no.eq(&n.out_trade_no))
                .count()
                .get_result(conn)
                .await?;
            if known == 0 {
                return Ok(Outcome::UnknownOrder);
            }
            let inserted = diesel::insert_into(status_callback::table)
                .values((
                    status_callback::out_trade_no.eq(&n.out_trade_no),
                    status_callback::channel.eq(channel),
                    status_callback::transaction_id.eq(&n.transaction_id),
                    status_callback::status.eq(STATUS_CLOSED),
                    status_callback::amount_fen.eq(n.amount_fen),
                    status_callback::created_at.eq(now),
                ))
                .on_conflict((
                    status_callback::out_trade_no,
                    status_callback::channel,
                    status_callback::transaction_id,
                    status_callback::status,
                ))
                .do_nothing()
                .execute(conn)
                .await?;
            Ok(if inserted == 1 { Outcome::Ignored } else { Outcome::Duplicate })
        })
    }

    /// Closes an unpaid order (`WAIT_PAY → CLOSED`) with its `ORDER_CLOSED` message, in one
    /// transaction. `by` is recorded in the message: `api` or `expiry`.
    pub async fn close_order(
        &self,
        order_no: &str,
        by: &str,
        now: Timestamp,
    ) -> Result<CloseResult, StoreError> {
        with_conn!(self, conn => {
            conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                let moved = diesel::update(
                    orders::table
                        .filter(orders::order_no.eq(order_no))
                        .filter(orders::status.eq(OrderStatus::WaitPay)),
                )
                .set((orders::status.eq(OrderStatus::Closed), orders::closed_at.eq(now)))
                .execute(conn)
                .await?;
                let order: Option<Order> = orders::table
                    .find(order_no)
                    .select(Order::as_select())
                    .first(conn)
                    .await
                    .optional()?;
                let Some(order) = order else { return Ok(CloseResult::NotFound) };
                if moved == 1 {
                    let message = Message::order_closed(&order, by);
                    InsertMessage::pending(&message, now).execute(conn).await?;
                    return Ok(CloseResult::Closed(order));
                }
                Ok(match order.status {
                    OrderStatus::Closed => CloseResult::AlreadyClosed(order),
                    _ => CloseResult::NotClosable(order),
                })
            })
            .await
            .map_err(StoreError::from)
        })
    }
}
