//! The refund rules: what a verified refund does to its order, decided from the order as
//! the ledger's transaction read it.

use crate::notice::{AnomalyReason, Notice, Refund, RefundAmount};
use crate::order::{Order, OrderStatus};

/// What a verified refund does to its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundAction {
    /// Add the refund to `refunded_fen` (`PAID → REFUNDED` once it reaches the amount), if
    /// the order is still as read: for an amount derived from a running total,
    /// `refunded_fen` must still be the value it was derived against.
    Apply { refunded_was: Option<i64> },
    /// The running totals already counted this one (Alipay: a later refund known only by its
    /// notification arrived first and was counted at the whole difference): its
    /// `ORDER_REFUNDED` says so with `refund_fen` 0.
    AlreadyCounted,
    /// Recorded as `PAYMENT_ANOMALY`, keyed by the provider's refund id, or — for the refund
    /// of another payment — by the refund number.
    Anomaly {
        reason: AnomalyReason,
        keyed_by_refund_no: bool,
    },
}

/// A refund's share and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefundPlan {
    /// This refund's own amount.
    pub fen: i64,
    pub action: RefundAction,
}

/// What the ledger knows of a refund stated as a running total (Alipay), read in the
/// transaction that applies it: Alipay's `refund_fee` is the trade's total so far, so this
/// refund's own amount is what it was asked for when paynotify asked for it, and otherwise
/// the difference to the refunds Alipay did before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Earlier {
    /// The amount paynotify asked for under this refund number (Alipay refunds exactly
    /// that, or nothing).
    pub asked: Option<i64>,
    /// The refunds of the order counted before, whose running totals are below this one's:
    /// their amounts, summed.
    pub before_fen: i64,
    /// The highest running total Alipay reported for the order, this refund's included:
    /// the order never counts more.
    pub highest_fen: i64,
}

/// Whether a refund is of the order's own recorded payment: same channel, same provider
/// transaction (ids the provider issues once, so the same merchant too), and the merchant
/// whose key signed it.
pub fn refunds_the_payment(order: &Order, n: &Notice) -> bool {
    n.merchant_matches
        && order.channel.as_deref() == Some(n.channel.as_str())
        && order.transaction_id.as_deref() == Some(n.transaction_id.as_str())
}

/// The refund rules, decided from the order as the transaction read it. Only a refund of
/// the order's own recorded payment moves it ([`refunds_the_payment`]). Deciding an anomaly
/// from that read is safe under concurrency: refunds only ever add to `refunded_fen`, so a
/// refund that does not fit now never fits later.
pub fn plan_refund(order: &Order, n: &Notice, refund: &Refund, earlier: &Earlier) -> RefundPlan {
    let ours = refunds_the_payment(order, n);
    let (fen, derived) = match refund.amount {
        RefundAmount::This(fen) => (fen, false),
        // A running total means something only against the refunds of the order's payment.
        RefundAmount::RunningTotal(_) if ours && earlier.asked.is_some() => {
            (earlier.asked.unwrap_or_default(), false)
        }
        RefundAmount::RunningTotal(total) if ours => (
            (total - earlier.before_fen).min(earlier.highest_fen - order.refunded_fen),
            true,
        ),
        RefundAmount::RunningTotal(total) => (total, false),
    };
    let anomaly = |reason, keyed_by_refund_no| RefundAction::Anomaly {
        reason,
        keyed_by_refund_no,
    };
    let action = if !n.merchant_matches {
        anomaly(AnomalyReason::MerchantMismatch, false)
    } else if !ours {
        // A second payment, one after close, one through the other channel: the order's
        // own payment stands.
        anomaly(AnomalyReason::OtherPaymentRefunded, true)
    } else if derived && fen <= 0 {
        RefundAction::AlreadyCounted
    } else if order.status == OrderStatus::Paid
        && fen > 0
        && fen <= order.amount_fen - order.refunded_fen
    {
        RefundAction::Apply {
            refunded_was: derived.then_some(order.refunded_fen),
        }
    } else {
        // More than is left to refund.
        anomaly(AnomalyReason::AmountMismatch, false)
    };
    RefundPlan { fen, action }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::{ChannelId, MerchantIds, NoticeKind};
    use crate::time::Timestamp;

    fn order(status: OrderStatus, refunded_fen: i64) -> Order {
        let now = Timestamp::new(chrono::Utc::now());
        Order {
            order_no: "O".into(),
            status,
            amount_fen: 1000,
            refunded_fen,
            currency: "CNY".into(),
            subject: String::new(),
            channel: Some("alipay".into()),
            transaction_id: Some("T".into()),
            created_at: now,
            paid_at: Some(now),
            closed_at: None,
            expire_at: now,
            combine_out_trade_no: None,
        }
    }

    fn refund_of(transaction_id: &str, amount: RefundAmount) -> (Notice, Refund) {
        let refund = Refund {
            out_refund_no: "R".into(),
            refund_id: "RID".into(),
            amount,
        };
        let notice = Notice {
            channel: ChannelId::Alipay,
            kind: NoticeKind::Refunded(refund.clone()),
            out_trade_no: "O".into(),
            transaction_id: transaction_id.into(),
            amount_fen: 1000,
            currency: "CNY".into(),
            merchant: MerchantIds {
                merchant_id: "2088".into(),
                app_id: Some("app".into()),
            },
            merchant_matches: true,
            occurred_at: None,
        };
        (notice, refund)
    }

    /// A plan as the ledger reads its refunds when every earlier one is counted and none is
    /// later: what the order refunded comes before this one.
    fn plan(order: &Order, transaction_id: &str, amount: RefundAmount) -> RefundPlan {
        let (n, r) = refund_of(transaction_id, amount);
        let earlier = match amount {
            RefundAmount::RunningTotal(total) => Earlier {
                asked: None,
                before_fen: order.refunded_fen,
                highest_fen: total.max(order.refunded_fen),
            },
            RefundAmount::This(_) => Earlier::default(),
        };
        plan_refund(order, &n, &r, &earlier)
    }

    fn anomaly(reason: AnomalyReason, keyed_by_refund_no: bool) -> RefundAction {
        RefundAction::Anomaly {
            reason,
            keyed_by_refund_no,
        }
    }

    #[test]
    fn a_refund_of_the_orders_own_payment_applies() {
        let paid = order(OrderStatus::Paid, 0);
        let p = plan(&paid, "T", RefundAmount::This(400));
        assert_eq!(p.fen, 400);
        assert_eq!(p.action, RefundAction::Apply { refunded_was: None });
    }

    #[test]
    fn a_running_total_becomes_this_refunds_share_of_what_is_recorded() {
        let p = plan(
            &order(OrderStatus::Paid, 300),
            "T",
            RefundAmount::RunningTotal(1000),
        );
        assert_eq!(p.fen, 700);
        assert_eq!(
            p.action,
            RefundAction::Apply {
                refunded_was: Some(300)
            }
        );
        // Already counted by a later refund's total that arrived first.
        let counted = plan(
            &order(OrderStatus::Refunded, 1000),
            "T",
            RefundAmount::RunningTotal(600),
        );
        assert_eq!(counted.action, RefundAction::AlreadyCounted);
    }

    #[test]
    fn a_running_total_counts_the_amount_asked_for_or_the_difference_to_what_came_before() {
        // Asked for 300 under this number: 300, whichever refund's total arrived first (here
        // a later one of 400, total 700, was counted first).
        let (n, r) = refund_of("T", RefundAmount::RunningTotal(700));
        let asked = Earlier {
            asked: Some(300),
            before_fen: 0,
            highest_fen: 700,
        };
        let p = plan_refund(&order(OrderStatus::Paid, 400), &n, &r, &asked);
        assert_eq!(p.fen, 300);
        assert_eq!(p.action, RefundAction::Apply { refunded_was: None });
        // Known only by its total (300); a later refund (200, total 500) was counted first.
        let (n, r) = refund_of("T", RefundAmount::RunningTotal(300));
        let later_first = Earlier {
            asked: None,
            before_fen: 0,
            highest_fen: 500,
        };
        let p = plan_refund(&order(OrderStatus::Paid, 200), &n, &r, &later_first);
        assert_eq!(p.fen, 300);
        assert_eq!(
            p.action,
            RefundAction::Apply {
                refunded_was: Some(200)
            }
        );
        // Never more than the highest total reported: a later total counted it already.
        let counted = Earlier {
            asked: None,
            before_fen: 0,
            highest_fen: 800,
        };
        let p = plan_refund(&order(OrderStatus::Paid, 800), &n, &r, &counted);
        assert_eq!(p.action, RefundAction::AlreadyCounted);
    }

    #[test]
    fn a_refund_of_another_payment_never_moves_the_order() {
        let paid = order(OrderStatus::Paid, 0);
        for amount in [RefundAmount::This(1000), RefundAmount::RunningTotal(1000)] {
            let p = plan(&paid, "OTHER", amount);
            assert_eq!(p.action, anomaly(AnomalyReason::OtherPaymentRefunded, true));
        }
        let mut wechat = paid.clone();
        wechat.channel = Some("wechat".into());
        assert_eq!(
            plan(&wechat, "T", RefundAmount::This(1)).action,
            anomaly(AnomalyReason::OtherPaymentRefunded, true),
            "another channel's payment"
        );
        let closed = Order {
            channel: None,
            transaction_id: None,
            ..order(OrderStatus::Closed, 0)
        };
        assert_eq!(
            plan(&closed, "T", RefundAmount::This(1)).action,
            anomaly(AnomalyReason::OtherPaymentRefunded, true),
            "a payment after close"
        );
    }

    #[test]
    fn more_than_is_left_or_a_foreign_merchant_is_an_anomaly() {
        let p = plan(&order(OrderStatus::Paid, 600), "T", RefundAmount::This(401));
        assert_eq!(p.action, anomaly(AnomalyReason::AmountMismatch, false));
        let p = plan(
            &order(OrderStatus::Refunded, 1000),
            "T",
            RefundAmount::This(1),
        );
        assert_eq!(p.action, anomaly(AnomalyReason::AmountMismatch, false));
        let (mut n, r) = refund_of("T", RefundAmount::This(1));
        n.merchant_matches = false;
        assert_eq!(
            plan_refund(&order(OrderStatus::Paid, 0), &n, &r, &Earlier::default()).action,
            anomaly(AnomalyReason::MerchantMismatch, false)
        );
    }
}
