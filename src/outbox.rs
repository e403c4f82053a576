//! The transactional outbox: the messages the ledger writes in the same transaction as the
//! state change they announce. Consumers deduplicate on `(topic, biz_key)`.

use serde_json::json;

use crate::bills::report::{Item, Resolution};
use crate::notice::{AnomalyReason, ChannelId, Notice, Refund, RefundAmount};
use crate::order::Order;
use crate::time::Timestamp;
use crate::transfer::{TransferSeen, TransferStatus};

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
    TransferSucceeded,
    TransferFailed,
    TransferCancelled,
    TransferAnomaly,
}

impl Topic {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrderPaid => "ORDER_PAID",
            Self::OrderRefunded => "ORDER_REFUNDED",
            Self::OrderClosed => "ORDER_CLOSED",
            Self::PaymentAnomaly => "PAYMENT_ANOMALY",
            Self::TransferSucceeded => "TRANSFER_SUCCEEDED",
            Self::TransferFailed => "TRANSFER_FAILED",
            Self::TransferCancelled => "TRANSFER_CANCELLED",
            Self::TransferAnomaly => "TRANSFER_ANOMALY",
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

    /// [`Message::order_paid`] of a sub-order of the combination `combination`.
    pub fn sub_order_paid(n: &Notice, paid_at: Timestamp, combination: &str) -> Self {
        Self::order_paid(n, paid_at).in_combination(Some(combination))
    }

    /// The message about a sub-order of `combination` (`None`: an ordinary order, unchanged):
    /// its payload also names the combination.
    pub fn in_combination(mut self, combination: Option<&str>) -> Self {
        if let (Some(c), Some(payload)) = (combination, self.payload.as_object_mut()) {
            payload.insert("combine_out_trade_no".to_owned(), json!(c));
        }
        self
    }

    /// A combined notification's sub-order `n` that is not a sub-order of the combination
    /// `combination` here (`order`: the order of that number, if there is one):
    /// `PAYMENT_ANOMALY`, reason `NOT_IN_COMBINATION`, keyed as every payment anomaly.
    pub fn not_in_combination(n: &Notice, combination: &str, order: Option<&Order>) -> Self {
        Self {
            topic: Topic::PaymentAnomaly,
            biz_key: format!("{}:{}:{}", n.out_trade_no, n.channel, n.transaction_id),
            payload: json!({
                "order_no": n.out_trade_no,
                "channel": n.channel,
                "reason": AnomalyReason::NotInCombination,
                "transaction_id": n.transaction_id,
                "amount_fen": n.amount_fen,
                "currency": n.currency,
                "merchant_id": n.merchant.merchant_id,
                "app_id": n.merchant.app_id,
                "refund": serde_json::Value::Null,
                "order_status": order.map(|o| o.status),
                "order_amount_fen": order.map(|o| o.amount_fen),
                "order_currency": order.map(|o| &o.currency),
                "order_channel": order.and_then(|o| o.channel.as_ref()),
                "combine_out_trade_no": combination,
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
        .in_combination(order.combine_out_trade_no.as_deref())
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
        .in_combination(order.combine_out_trade_no.as_deref())
    }

    /// Money arrived that must not mark the order paid (or a refund that does not fit it).
    /// `provider_id` is the payment's transaction id, or the refund id for refunds.
    /// The `biz_key` of the `PAYMENT_ANOMALY` of payment (or refund) `provider_id` of an
    /// order: one per order, channel and provider id.
    pub fn payment_anomaly_key(order_no: &str, channel: ChannelId, provider_id: &str) -> String {
        format!("{order_no}:{channel}:{provider_id}")
    }

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
            biz_key: Self::payment_anomaly_key(&n.out_trade_no, n.channel, provider_id),
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
        .in_combination(order.combine_out_trade_no.as_deref())
    }

    /// A difference a bill run left open (`account`'s bill of `date`): `PAYMENT_ANOMALY`,
    /// reason `BILL_MISMATCH`, once per item.
    pub fn bill_mismatch(date: &str, channel: ChannelId, account: &str, item: &Item) -> Self {
        Self {
            topic: Topic::PaymentAnomaly,
            biz_key: mismatch_key(item, channel, date),
            payload: json!({
                "order_no": item.out_trade_no,
                "channel": channel,
                "reason": AnomalyReason::BillMismatch,
                "bill_date": date,
                "account": account,
                "type": item.kind,
                "out_refund_no": item.out_refund_no,
                "transaction_id": item.transaction_id,
                "provider": item.provider,
                "ours": item.ours,
                "resolution": Resolution::Open,
            }),
        }
    }

    /// What follows an item's `BILL_MISMATCH` (of `account`'s bill of `date`) once a later
    /// run found it explained, settled by `by_account`'s bill of `by_date`: `PAYMENT_ANOMALY`,
    /// reason `BILL_MISMATCH_SETTLED`, its biz_key the first one's and `:settled`.
    pub fn bill_mismatch_settled(
        date: &str,
        channel: ChannelId,
        account: &str,
        item: &Item,
        by_date: &str,
        by_account: &str,
    ) -> Self {
        let mut message = Self::bill_mismatch(date, channel, account, item);
        message.biz_key.push_str(":settled");
        message.payload["reason"] = json!(AnomalyReason::BillMismatchSettled);
        message.payload["resolution"] = json!(Resolution::Settled);
        message.payload["settled_by"] = json!({"bill_date": by_date, "account": by_account});
        message
    }
}

/// What a transfer was when it became final, for its event.
#[derive(Debug, Clone, Copy)]
pub struct FinishedTransfer<'a> {
    pub out_bill_no: &'a str,
    pub channel: ChannelId,
    pub account: &'a str,
    pub amount_fen: i64,
    pub status: TransferStatus,
    pub provider_bill_no: Option<&'a str>,
    pub fail_reason: Option<&'a str>,
    pub finished_at: Timestamp,
}

impl Message {
    /// A transfer became final: `TRANSFER_SUCCEEDED`, `TRANSFER_FAILED` or
    /// `TRANSFER_CANCELLED`, once per transfer (`None` for a status that is not final).
    pub fn transfer_final(t: &FinishedTransfer<'_>) -> Option<Self> {
        let topic = match t.status {
            TransferStatus::Success => Topic::TransferSucceeded,
            TransferStatus::Fail => Topic::TransferFailed,
            TransferStatus::Cancelled => Topic::TransferCancelled,
            TransferStatus::Processing | TransferStatus::WaitUserConfirm => return None,
        };
        let mut payload = json!({
            "out_bill_no": t.out_bill_no,
            "channel": t.channel,
            "account": t.account,
            "amount_fen": t.amount_fen,
            "status": t.status,
            "provider_bill_no": t.provider_bill_no,
            "finished_at": t.finished_at,
        });
        if t.status == TransferStatus::Fail {
            payload["fail_reason"] = json!(t.fail_reason);
        }
        Some(Self {
            topic,
            biz_key: format!("{}:{}", t.out_bill_no, t.channel),
            payload,
        })
    }

    /// A verified notification or answer that must not move a transfer. `ours` is the
    /// transfer's account and amount, `None` for one never started here.
    pub fn transfer_anomaly(
        channel: ChannelId,
        seen: &TransferSeen,
        ours: Option<(&str, i64)>,
        reason: AnomalyReason,
    ) -> Self {
        Self {
            topic: Topic::TransferAnomaly,
            biz_key: format!(
                "{}:{channel}:{}",
                seen.out_bill_no,
                seen.provider_bill_no.as_deref().unwrap_or_default()
            ),
            payload: json!({
                "out_bill_no": seen.out_bill_no,
                "channel": channel,
                "account": ours.map(|o| o.0),
                "amount_fen": ours.map(|o| o.1),
                "provider_amount_fen": seen.amount_fen,
                "provider_account": seen.account,
                "provider_bill_no": seen.provider_bill_no,
                "provider_state": seen.provider_state,
                "reason": reason,
            }),
        }
    }
}

/// The biz_key of an item's `BILL_MISMATCH` event: its order, channel, bill date, type and
/// refund number (a `BILL_MISMATCH_SETTLED` event adds `:settled`).
fn mismatch_key(item: &Item, channel: ChannelId, date: &str) -> String {
    let refund = item
        .out_refund_no
        .as_deref()
        .map(|r| format!(":{r}"))
        .unwrap_or_default();
    format!(
        "{}:{channel}:bill:{date}:{}{refund}",
        item.out_trade_no,
        item.kind.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bills::report::{ItemType, Side};

    fn refund_item() -> Item {
        Item {
            kind: ItemType::RefundAmountMismatch,
            out_trade_no: "A1".into(),
            out_refund_no: Some("R1".into()),
            transaction_id: Some("T1".into()),
            provider: Some(Side {
                status: "SUCCESS".into(),
                amount_fen: 100,
            }),
            ours: Some(Side {
                status: "SUCCESS".into(),
                amount_fen: 90,
            }),
            resolution: Resolution::Open,
        }
    }

    #[test]
    fn a_bill_mismatch_names_the_bill_and_both_sides() {
        let m = Message::bill_mismatch(
            "2026-11-30",
            ChannelId::Wechat,
            "1900000001",
            &refund_item(),
        );
        assert_eq!(m.topic, Topic::PaymentAnomaly);
        assert_eq!(
            m.biz_key,
            "A1:wechat:bill:2026-11-30:REFUND_AMOUNT_MISMATCH:R1"
        );
        assert_eq!(
            m.payload,
            json!({
                "order_no": "A1",
                "channel": "wechat",
                "reason": "BILL_MISMATCH",
                "bill_date": "2026-11-30",
                "account": "1900000001",
                "type": "REFUND_AMOUNT_MISMATCH",
                "out_refund_no": "R1",
                "transaction_id": "T1",
                "provider": {"status": "SUCCESS", "amount_fen": 100},
                "ours": {"status": "SUCCESS", "amount_fen": 90},
                "resolution": "open",
            })
        );
    }

    #[test]
    fn a_settled_bill_mismatch_follows_the_first_event() {
        let mut item = refund_item();
        item.kind = ItemType::MissingAtProvider;
        item.out_refund_no = None;
        let m = Message::bill_mismatch_settled(
            "2026-11-30",
            ChannelId::Alipay,
            "2021000000000001",
            &item,
            "2026-12-01",
            "2021000000000002",
        );
        assert_eq!(m.topic, Topic::PaymentAnomaly);
        assert_eq!(
            m.biz_key,
            "A1:alipay:bill:2026-11-30:MISSING_AT_PROVIDER:settled"
        );
        assert_eq!(
            m.payload,
            json!({
                "order_no": "A1",
                "channel": "alipay",
                "reason": "BILL_MISMATCH_SETTLED",
                "bill_date": "2026-11-30",
                "account": "2021000000000001",
                "type": "MISSING_AT_PROVIDER",
                "out_refund_no": null,
                "transaction_id": "T1",
                "provider": {"status": "SUCCESS", "amount_fen": 100},
                "ours": {"status": "SUCCESS", "amount_fen": 90},
                "resolution": "settled",
                "settled_by": {"bill_date": "2026-12-01", "account": "2021000000000002"},
            })
        );
    }
}
