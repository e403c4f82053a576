//! The ledger: one verified notice becomes, in ONE transaction, a callback row, an order
//! compare-and-set and an outbox message — or nothing at all.
//!
//! The unique keys of `pay_callback` / `refund_callback` decide first-vs-duplicate (no
//! check-then-act), inserts use `ON CONFLICT DO NOTHING` so no statement fails inside a
//! PostgreSQL transaction, and every order update is conditional on the status it leaves.
//! SQLite: every write transaction here starts with a write, so it takes the write lock at
//! its first statement and waits on the busy timeout instead of failing with SQLITE_BUSY.

mod combined;
mod fast_path;
mod refund_plan;
mod transfer;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::group::{GroupResult, Payment};
use super::schema::{
    order_account, orders, pay_callback, payment_anomaly, refund_callback, refund_request,
};
use super::statements::{
    InsertAnomaly, InsertMessage, InsertPayCallback, InsertRefundCallback, InsertStatusCallback,
    MarkPaid, MarkSubPaid, PRIMARY, ReplacePayCallback, unless_exists,
};
use super::types::Payload;
use super::{Store, StoreError, with_conn};
use crate::notice::{
    AnomalyReason, ChannelId, Digest, Notice, NoticeKind, Outcome, Refund, RefundAmount,
};
use crate::order::{Order, OrderStatus, RefundStatus};
use crate::outbox::Message;
use crate::time::Timestamp;
pub(crate) use fast_path::PaymentFastPath;
pub use refund_plan::{Earlier, RefundAction, RefundPlan, plan_refund, refunds_the_payment};
pub use transfer::{TransferVerdict, transfer_verdict};

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

pub(crate) fn outcome_of(result: Result<Outcome, Abort>) -> Result<Outcome, StoreError> {
    match result {
        Ok(outcome) | Err(Abort::With(outcome)) => Ok(outcome),
        Err(Abort::Db(e)) => Err(StoreError::Query(e)),
    }
}

/// The order row, read inside the transaction. (The helpers here are macros: their body is
/// compiled once per backend inside `with_conn!`.)
macro_rules! load_order {
    ($conn:expr, $order_no:expr) => {
        orders::table
            .find($order_no)
            .select(Order::as_select())
            .first($conn)
            .await
            .optional()
    };
}
pub(super) use load_order;

/// Records a payment anomaly once, with its `PAYMENT_ANOMALY` message: `Outcome::Anomaly`
/// when it is new; when its `payment_anomaly` row exists already, the notice is a repeat of a
/// recorded anomaly, and the transaction is rolled back as a duplicate.
macro_rules! insert_anomaly {
    ($conn:expr, $n:expr, $provider_id:expr, $reason:expr, $order:expr, $now:expr) => {{
        let reason = $reason;
        let message = Message::payment_anomaly($n, $provider_id, reason, $order);
        let written = InsertAnomaly::of(&message, $now).execute($conn).await;
        if unless_exists(written, PRIMARY)? == 0 {
            Err(Abort::With(Outcome::Duplicate))
        } else {
            InsertMessage::pending(&message, $now)
                .execute($conn)
                .await?;
            Ok(Outcome::Anomaly(reason))
        }
    }};
}

/// The account the order of notice `n` names on its channel (`order_account`), if any.
macro_rules! owner_of {
    ($conn:expr, $n:expr) => {
        order_account::table
            .find((&$n.out_trade_no, $n.channel.as_str()))
            .select(order_account::account)
            .first::<String>($conn)
            .await
            .optional()
    };
}

pub(super) use owner_of;

/// Whether the callback key of payment notice `n`'s order is held by the payment `seen_txn`
/// of another account, recorded as a `MERCHANT_MISMATCH`, while `n` is a payment of the
/// account the order names (or of any of the channel's, when it names none). Order numbers
/// are unique per merchant, not across merchants: such a payment holds the key only until the
/// order's own account pays.
macro_rules! held_by_another_account {
    ($conn:expr, $n:expr, $seen_txn:expr) => {{
        let (n, seen_txn): (&Notice, &str) = ($n, $seen_txn);
        if n.merchant_matches {
            let owner = owner_of!($conn, n)?;
            if owner.as_deref().is_none_or(|o| o == n.account()) {
                payment_anomaly::table
                    .find(Message::payment_anomaly_key(
                        &n.out_trade_no,
                        n.channel,
                        seen_txn,
                    ))
                    .select(payment_anomaly::payload)
                    .first::<Payload>($conn)
                    .await
                    .optional()
                    .map(|found| {
                        found.and_then(|p| AnomalyReason::of_payload(&p.0))
                            == Some(AnomalyReason::MerchantMismatch)
                    })
            } else {
                Ok(false)
            }
        } else {
            Ok(false)
        }
    }};
}
pub(super) use held_by_another_account;

/// A refund the ledger counts (applied now, or a repeat of one it applied): the refund
/// started through paynotify under that number, if any, is `SUCCESS` in the same
/// transaction, whichever arrived first — the notification or the provider's answer.
macro_rules! refund_request_done {
    ($conn:expr, $n:expr, $refund:expr, $now:expr) => {
        diesel::update(
            refund_request::table
                .filter(refund_request::out_refund_no.eq(&$refund.out_refund_no))
                .filter(refund_request::order_no.eq(&$n.out_trade_no))
                .filter(refund_request::channel.eq($n.channel.as_str()))
                .filter(refund_request::status.ne(RefundStatus::Success.as_str())),
        )
        .set((
            refund_request::status.eq(RefundStatus::Success.as_str()),
            refund_request::refund_id.eq(&$refund.refund_id),
            refund_request::error_code.eq(None::<String>),
            refund_request::error_message.eq(None::<String>),
            refund_request::updated_at.eq($now),
        ))
        .execute($conn)
        .await?
    };
}

/// The refund requests whose money may still move (`crate::refunds`): sent and not
/// answered, accepted and not done, or abnormal without a refusal.
macro_rules! refund_in_flight {
    () => {
        refund_request::status
            .eq_any([
                RefundStatus::Submitting.as_str(),
                RefundStatus::Processing.as_str(),
            ])
            .or(refund_request::status
                .eq(RefundStatus::Abnormal.as_str())
                .and(refund_request::error_code.is_null()))
    };
}
pub(crate) use refund_in_flight;

/// Why a payment that did not move the order is an anomaly; `None` when it is the payment
/// the order already records (a repeat that outlived its callback row). `owner` is the
/// account the order names on the notice's channel, if any: a payment of another account is
/// a `MERCHANT_MISMATCH`.
pub fn payment_anomaly(order: &Order, n: &Notice, owner: Option<&str>) -> Option<AnomalyReason> {
    if !n.merchant_matches || owner.is_some_and(|o| o != n.account()) {
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

/// `refund_callback.status`: a refund the ledger counted, and one it recorded as a
/// `PAYMENT_ANOMALY` instead.
pub const REFUND_COUNTED: &str = "SUCCESS";
pub const REFUND_ANOMALY: &str = "ANOMALY";

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

/// Times a deadlock victim is applied again before its error is answered (503).
pub const DEADLOCK_RETRIES: u32 = 3;

impl Store {
    /// Applies one verified notice. Signature checks happen before this; the amount,
    /// currency and merchant checks happen here, against the order.
    ///
    /// A deadlock victim (its transaction undone whole) is tried again here, up to
    /// [`DEADLOCK_RETRIES`] times, instead of answering 503: two paths that take an order's
    /// row and its callback key in opposite orders (a group or the one-statement path, and
    /// the full transaction or another writer) can meet under load.
    pub async fn apply(&self, notice: &Notice, now: Timestamp) -> Result<Outcome, StoreError> {
        let mut retried = 0;
        loop {
            match self.apply_once(notice, now).await {
                Err(e) if e.is_deadlock() && retried < DEADLOCK_RETRIES => {
                    retried += 1;
                    tracing::info!(
                        order_no = %notice.out_trade_no,
                        retried,
                        "deadlock victim; applied again"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(5 * u64::from(retried)))
                        .await;
                }
                result => return result,
            }
        }
    }

    async fn apply_once(&self, notice: &Notice, now: Timestamp) -> Result<Outcome, StoreError> {
        match &notice.kind {
            NoticeKind::Paid => self.apply_payment(notice, &notice.digest(), now).await,
            NoticeKind::Refunded(refund) => {
                self.apply_refund(notice, refund, &notice.digest(), now)
                    .await
            }
            NoticeKind::Closed => self.record_status(notice, now).await,
            NoticeKind::Other { .. } => Ok(Outcome::Ignored),
            NoticeKind::Combined(c) => self.apply_combined(notice, c, now).await,
            NoticeKind::Transfer(seen) => {
                self.apply_transfer(notice.channel, seen, notice.merchant_matches, now)
                    .await
            }
        }
    }

    async fn apply_payment(
        &self,
        n: &Notice,
        digest: &Digest,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let channel = n.channel.as_str();
        // The one-statement path, unless the group tried it already.
        let mut fast = true;
        if let Some(group) = self.group().filter(|_| n.merchant_matches) {
            let payment = Payment {
                notice: n.clone(),
                digest: digest.clone(),
                now,
            };
            // As long as the ordinary path could take: a connection, then one statement.
            let deadline = self.acquire_timeout + self.statement_timeout;
            match group.submit(payment, deadline).await {
                Ok(Some(GroupResult::Decided(outcome))) => return Ok(outcome),
                Ok(Some(GroupResult::Undecided)) => fast = false,
                Ok(Some(GroupResult::Unavailable(why))) => {
                    return Err(StoreError::Unavailable(why.to_string()));
                }
                Ok(Some(GroupResult::Alone) | None) => {}
                // Still queued or running, so it may yet commit: 503 without saying what
                // happened, and the provider's retry finds what it did.
                Err(()) => {
                    return Err(StoreError::Undecided(format!(
                        "no group answered within {} ms; it may still commit",
                        deadline.as_millis()
                    )));
                }
            }
        }
        let result = with_conn!(self, conn => {
            if fast && let Some(outcome) = conn.pay_fast(n, digest, now).await? {
                return Ok(outcome);
            }
            conn.transaction::<_, Abort, _>(async |conn| {
                let written = InsertPayCallback::of(n, digest, now).execute(conn)
                .await;
                if unless_exists(written, PRIMARY)? == 0 {
                    // The insert waited for the winner to commit; under READ COMMITTED (every
                    // backend's setting here, MySQL's included) this read sees its row.
                    let (seen_txn, seen_digest): (String, String) = pay_callback::table
                        .find((&n.out_trade_no, channel))
                        .select((pay_callback::transaction_id, pay_callback::digest))
                        .first(conn)
                        .await?;
                    if n.same_content(digest, &seen_digest) {
                        return Ok(Outcome::Duplicate);
                    }
                    if seen_txn == n.transaction_id {
                        // The same payment with other content: the provider contradicts itself.
                        return Ok(Outcome::Conflict);
                    }
                    let Some(order) = load_order!(conn, &n.out_trade_no)? else {
                        return Err(Abort::With(Outcome::UnknownOrder));
                    };
                    // The key is held by another account's payment, recorded as a
                    // MERCHANT_MISMATCH (order numbers are unique per merchant, not across
                    // them): it holds the key only until the order's own account pays, whose
                    // payment takes the callback row and goes on to move the order. The
                    // other payment stays recorded by its anomaly.
                    if !held_by_another_account!(conn, n, &seen_txn)? {
                        // Another real payment under the same key (a second merchant or app
                        // of this channel, paying twice): money arrived, so it is recorded,
                        // once. Its anomaly message, which retention keeps, is what makes its
                        // retries duplicates.
                        return insert_anomaly!(conn, n, &n.transaction_id, AnomalyReason::DuplicatePayment, &order, now);
                    }
                    ReplacePayCallback { paid: InsertPayCallback::of(n, digest, now), held_by: &seen_txn }
                        .execute(conn)
                        .await?;
                }
                if n.merchant_matches {
                    let moved = MarkPaid::of(n, now).execute(conn)
                    .await?;
                    if moved == 1 {
                        let message = Message::order_paid(n, now);
                        InsertMessage::pending(&message, now).execute(conn).await?;
                        return Ok(Outcome::Applied);
                    }
                }
                let Some(order) = load_order!(conn, &n.out_trade_no)? else {
                    return Err(Abort::With(Outcome::UnknownOrder));
                };
                // A sub-order of a combination paid on its own (an Alipay merge payment
                // notifies each trade): the same compare-and-set, its message naming the
                // combination.
                if let Some(combination) = order.combine_out_trade_no.as_deref()
                    && n.merchant_matches
                    && order.status == OrderStatus::WaitPay
                {
                    let paid = MarkPaid::of(n, now);
                    if (MarkSubPaid { paid, combination }).execute(conn).await? == 1 {
                        let message = Message::sub_order_paid(n, now, combination);
                        InsertMessage::pending(&message, now).execute(conn).await?;
                        return Ok(Outcome::Applied);
                    }
                }
                let owner = owner_of!(conn, n)?;
                let Some(reason) = payment_anomaly(&order, n, owner.as_deref()) else {
                    return Err(Abort::With(Outcome::Duplicate));
                };
                insert_anomaly!(conn, n, &n.transaction_id, reason, &order, now)
            })
            .await
        });
        outcome_of(result)
    }

    async fn apply_refund(
        &self,
        n: &Notice,
        refund: &Refund,
        digest: &Digest,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let channel = n.channel.as_str();
        let (reported, running_total) = match refund.amount {
            RefundAmount::This(fen) => (fen, None),
            RefundAmount::RunningTotal(fen) => (fen, Some(fen)),
        };
        let callback = InsertRefundCallback {
            out_refund_no: &refund.out_refund_no,
            channel,
            out_trade_no: &n.out_trade_no,
            refund_id: &refund.refund_id,
            refund_fen: reported,
            status: REFUND_COUNTED,
            digest: digest.as_str(),
            created_at: now,
            occurred_at: n.occurred_at,
            running_total_fen: running_total,
        };
        let refund_key = (&refund.out_refund_no, channel, &n.out_trade_no);
        let result = with_conn!(self, conn => {
            conn.transaction::<_, Abort, _>(async |conn| {
                let written = callback.execute(conn).await;
                // A running total (Alipay): the amount paynotify asked for under this number,
                // for this order, is this refund's own.
                let asked: Option<i64> = match running_total {
                    Some(_) => refund_request::table
                        .find(&refund.out_refund_no)
                        .filter(refund_request::order_no.eq(&n.out_trade_no))
                        .filter(refund_request::channel.eq(channel))
                        .select(refund_request::amount_fen)
                        .first(conn)
                        .await
                        .optional()?,
                    None => None,
                };
                if unless_exists(written, PRIMARY)? == 0 {
                    let (seen, status, seen_id, seen_fen, seen_total): (
                        String,
                        String,
                        String,
                        i64,
                        Option<i64>,
                    ) = refund_callback::table
                        .find(refund_key)
                        .select((
                            refund_callback::digest,
                            refund_callback::status,
                            refund_callback::refund_id,
                            refund_callback::refund_fen,
                            refund_callback::running_total_fen,
                        ))
                        .first(conn)
                        .await?;
                    if seen != digest.as_str() {
                        // Alipay tells one refund two ways: its refund query names its own
                        // amount, its notification the trade's running total. The refund the
                        // ledger counted at the amount this one is (asked for, or named) is
                        // this one; its running total, once known, is kept.
                        let own = match refund.amount {
                            RefundAmount::This(fen) => Some(fen),
                            RefundAmount::RunningTotal(_) => asked,
                        };
                        // Its running total: not known yet (or recorded before it was kept),
                        // not stated by this delivery, or the one recorded.
                        let same_total = seen_total.is_none_or(|t| t == 0)
                            || running_total.is_none()
                            || running_total == seen_total;
                        let same_refund = n.channel == ChannelId::Alipay
                            && status == REFUND_COUNTED
                            && seen_id == refund.refund_id
                            && own == Some(seen_fen)
                            && same_total;
                        if !same_refund {
                            return Ok(Outcome::Conflict);
                        }
                        if let Some(total) = running_total.filter(|_| running_total != seen_total) {
                            diesel::update(refund_callback::table.find(refund_key))
                                .set(refund_callback::running_total_fen.eq(total))
                                .execute(conn)
                                .await?;
                        }
                    }
                    // A repeat of a refund the ledger counted; one it recorded as an anomaly
                    // counted nothing, so its request is not done.
                    if status == REFUND_COUNTED {
                        refund_request_done!(conn, n, refund, now);
                    }
                    return Ok(Outcome::Duplicate);
                }
                let Some(before) = load_order!(conn, &n.out_trade_no)? else {
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
                let mut earlier = Earlier {
                    asked,
                    ..Earlier::default()
                };
                if let (Some(total), None, true) =
                    (running_total, asked, refunds_the_payment(&before, n))
                {
                    // Known only by its running total (a refund made at the provider, not
                    // through paynotify): its amount is the difference to the refunds done
                    // before it there.
                    let counted: Vec<(i64, Option<i64>)> = refund_callback::table
                        .filter(refund_callback::out_trade_no.eq(&n.out_trade_no))
                        .filter(refund_callback::channel.eq(channel))
                        .filter(refund_callback::status.eq(REFUND_COUNTED))
                        .filter(refund_callback::out_refund_no.ne(&refund.out_refund_no))
                        .select((refund_callback::refund_fen, refund_callback::running_total_fen))
                        .load(conn)
                        .await?;
                    let flying: i64 = refund_request::table
                        .filter(refund_request::order_no.eq(&n.out_trade_no))
                        .filter(refund_request::channel.eq(channel))
                        .filter(refund_request::out_refund_no.ne(&refund.out_refund_no))
                        .filter(refund_in_flight!())
                        .count()
                        .get_result(conn)
                        .await?;
                    // A refund counted without its running total (applied from the refund
                    // query) or one still in flight may have been done before this one or
                    // after: its notification says which. Until then, nothing is guessed;
                    // the provider delivers this one again.
                    if flying > 0 || counted.iter().any(|(_, t)| t.is_none()) {
                        tracing::info!(order_no = %n.out_trade_no, out_refund_no = %refund.out_refund_no, "a refund known only by its running total waits for the order's other refunds to be placed");
                        return Err(Abort::With(Outcome::Contended));
                    }
                    earlier.before_fen = counted
                        .iter()
                        .filter(|(_, t)| t.is_some_and(|t| t < total))
                        .map(|(fen, _)| fen)
                        .sum();
                    earlier.highest_fen = counted
                        .iter()
                        .filter_map(|(_, t)| *t)
                        .fold(total, i64::max);
                }
                let RefundPlan { fen, action } = plan_refund(&before, n, refund, &earlier);
                if matches!(refund.amount, RefundAmount::RunningTotal(_)) {
                    // Record this refund's own share, not the running total.
                    diesel::update(refund_callback::table.find(refund_key))
                        .set(refund_callback::refund_fen.eq(fen.max(0)))
                        .execute(conn)
                        .await?;
                }
                match action {
                    RefundAction::AlreadyCounted => {
                        let message = Message::order_refunded(n, refund, 0, &before);
                        InsertMessage::pending(&message, now).execute(conn).await?;
                        refund_request_done!(conn, n, refund, now);
                        Ok(Outcome::Applied)
                    }
                    RefundAction::Apply { refunded_was } => {
                        let (low, high) = refunded_was.map_or((0, i64::MAX), |was| (was, was));
                        // Partial refunds keep PAID and add up; the one that reaches the
                        // amount moves PAID → REFUNDED. The filters repeat the plan's checks
                        // so the update applies only to the state it was planned on.
                        let moved = diesel::update(
                            orders::table
                                .filter(orders::order_no.eq(&n.out_trade_no))
                                .filter(orders::status.eq(OrderStatus::Paid))
                                .filter(orders::channel.eq(channel))
                                .filter(orders::refunded_fen.between(low, high))
                                .filter((orders::refunded_fen + fen).le(orders::amount_fen)),
                        )
                        // The status first: MySQL assigns left to right, each assignment
                        // seeing the ones before it, and this one must read the old sum.
                        .set((
                            orders::status.eq(diesel::dsl::case_when(
                                (orders::refunded_fen + fen).ge(orders::amount_fen),
                                OrderStatus::Refunded.into_sql::<diesel::sql_types::Text>(),
                            )
                            .otherwise(orders::status)),
                            orders::refunded_fen.eq(orders::refunded_fen + fen),
                        ))
                        .execute(conn)
                        .await?;
                        if moved == 0 {
                            // Another refund of this order committed since it was read.
                            return Err(Abort::With(Outcome::Contended));
                        }
                        let Some(after) = load_order!(conn, &n.out_trade_no)? else {
                            return Err(Abort::With(Outcome::UnknownOrder));
                        };
                        let message = Message::order_refunded(n, refund, fen, &after);
                        InsertMessage::pending(&message, now).execute(conn).await?;
                        refund_request_done!(conn, n, refund, now);
                        Ok(Outcome::Applied)
                    }
                    RefundAction::Anomaly { reason, keyed_by_refund_no } => {
                        diesel::update(refund_callback::table.find(refund_key))
                            .set(refund_callback::status.eq(REFUND_ANOMALY))
                            .execute(conn)
                            .await?;
                        let key = if keyed_by_refund_no {
                            &refund.out_refund_no
                        } else {
                            &refund.refund_id
                        };
                        insert_anomaly!(conn, n, key, reason, &before, now)
                    }
                }
            })
            .await
        });
        outcome_of(result)
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
            let written = InsertStatusCallback {
                out_trade_no: &n.out_trade_no,
                channel,
                transaction_id: &n.transaction_id,
                status: STATUS_CLOSED,
                amount_fen: n.amount_fen,
                created_at: now,
            }
            .execute(conn)
            .await;
            let inserted = unless_exists(written, PRIMARY)?;
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
                        .filter(super::still_waiting()),
                )
                .set((orders::status.eq(OrderStatus::Closed), orders::closed_at.eq(now)))
                .execute(conn)
                .await?;
                let Some(order) = load_order!(conn, order_no)? else {
                    return Ok(CloseResult::NotFound);
                };
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
