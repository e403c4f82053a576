//! The transactional outbox: the messages the ledger writes in the same transaction as the
//! state change they announce. Consumers deduplicate on `(topic, biz_key)`.

use serde_json::json;

use crate::notice::{AnomalyReason, Notice, Refund, RefundAmount};
use crate::order::Order;
use crate::time::Timestamp;

/// `local_message.status`.
pub mod status {
    pub const PENDING: i16 = 0;
    pub const SENT: i16 = 1;
    pub const DEAD: i16 = 2;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    OrderPaid,
    OrderRefunded,
    OrderClosed,
    PaymentAnomaly,
}

impl Topic {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrderPaid => "ORDER_PAID",
            Self::OrderRefunded => "ORDER_REFUNDED",
            Self::OrderClosed => "ORDER_CLOSED",
            Self::PaymentAnomaly => "PAYMENT_ANOMALY",
        }
    }
}

/// One outbox message, before it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub topic: Topic,
    pub biz_key: String,
    pub payload: serde_json::Value,
}

impl Message {
    /// The order moved `WAIT_PAY → PAID`.
    pub fn order_paid(n: &Notice, paid_at: Timestamp) -> Self {
        Self {
            topic: Topic::OrderPaid,
            biz_key: n.out_trade_no.clone(),
            payload: json!({
                "order_no": n.out_trade_no,
                "channel": n.channel,
                "transaction_id": n.transaction_id,
                "amount_fen": n.amount_fen,
                "currency": n.currency,
                "paid_at": paid_at,
            }),
        }
    }

    /// A refund of `refund_fen` succeeded; `order` is the order after it.
    pub fn order_refunded(n: &Notice, refund: &Refund, refund_fen: i64, order: &Order) -> Self {
        Self {
            topic: Topic::OrderRefunded,
            biz_key: format!("{}:{}", n.out_trade_no, refund.out_refund_no),
            payload: json!({
                "order_no": n.out_trade_no,
                "channel": n.channel,
                "out_refund_no": refund.out_refund_no,
                "refund_id": refund.refund_id,
                "refund_fen": refund_fen,
                "refunded_fen": order.refunded_fen,
                "amount_fen": order.amount_fen,
                "status": order.status,
            }),
        }
    }

    /// The order moved `WAIT_PAY → CLOSED`; `by` says who closed it.
    pub fn order_closed(order: &Order, by: &str) -> Self {
        Self {
            topic: Topic::OrderClosed,
            biz_key: order.order_no.clone(),
            payload: json!({
                "order_no": order.order_no,
                "amount_fen": order.amount_fen,
                "closed_at": order.closed_at,
                "closed_by": by,
            }),
        }
    }

    /// Money arrived that must not mark the order paid (or a refund that does not fit it).
    /// `provider_id` is the payment's transaction id, or the refund id for refunds.
    pub fn payment_anomaly(
        n: &Notice,
        provider_id: &str,
        reason: AnomalyReason,
        order: &Order,
    ) -> Self {
        let refund = match &n.kind {
            crate::notice::NoticeKind::Refunded(r) => {
                let (this, total) = match r.amount {
                    RefundAmount::This(fen) => (Some(fen), None),
                    RefundAmount::RunningTotal(fen) => (None, Some(fen)),
                };
                json!({
                    "out_refund_no": r.out_refund_no,
                    "refund_id": r.refund_id,
                    "refund_fen": this,
                    "refunded_total_fen": total,
                })
            }
            _ => serde_json::Value::Null,
        };
        Self {
            topic: Topic::PaymentAnomaly,
            biz_key: format!("{}:{}:{}", n.out_trade_no, n.channel, provider_id),
            payload: json!({
                "order_no": n.out_trade_no,
                "channel": n.channel,
                "reason": reason,
                "transaction_id": n.transaction_id,
                "amount_fen": n.amount_fen,
                "currency": n.currency,
                "merchant_id": n.merchant.merchant_id,
                "app_id": n.merchant.app_id,
                "refund": refund,
                "order_status": order.status,
                "order_amount_fen": order.amount_fen,
                "order_currency": order.currency,
                "order_channel": order.channel,
            }),
        }
    }
}
