//! The provider-neutral notice: what a verified WeChat Pay or Alipay notification means.
//!
//! Channel adapters produce a [`Notice`]; the ledger only ever sees this type.

use std::fmt;

use ring::digest::{SHA256, digest};
use serde::{Deserialize, Serialize};

use crate::text::hex;
use crate::time::Timestamp;
use crate::transfer::TransferSeen;

/// The payment channel a notice came through; stored in `orders.channel` and the callback tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelId {
    Wechat,
    Alipay,
}

impl ChannelId {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wechat => "wechat",
            Self::Alipay => "alipay",
        }
    }

    /// The channel stored (or asked for) as `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Wechat, Self::Alipay]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened, as far as the order is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeKind {
    /// The buyer paid `Notice::amount_fen` for the order.
    Paid,
    /// One refund succeeded; keyed by the merchant's `out_refund_no` (Alipay: `out_biz_no`).
    Refunded(Refund),
    /// The provider's trade can no longer be paid (Alipay `TRADE_CLOSED` without a refund).
    /// Recorded, never a state change: the buyer may still pay the order another way.
    Closed,
    /// Recorded and acknowledged, no state change (`WAIT_BUYER_PAY`, `REFUND.ABNORMAL`, …).
    Other { status: String },
    /// A merchant transfer's news (WeChat `MCHTRANSFER.BILL.FINISHED`, Alipay
    /// `alipay.fund.trans.order.changed`): applied to the transfer, never to an order. The
    /// notice's `out_trade_no` is the `out_bill_no`, its `transaction_id` the provider's bill
    /// number, its `amount_fen` the provider's amount (0 when it names none).
    Transfer(Box<TransferSeen>),
    /// A WeChat combined payment (合单支付): one delivery for up to fifty sub-orders, each
    /// its own payment, applied in one transaction (`store::ledger::combined`). The notice's
    /// `out_trade_no` is the `combine_out_trade_no` (the gate's key), its `merchant` the
    /// `combine_mchid` and `combine_appid`, `merchant_matches` whether those are the
    /// verifying merchant's, `transaction_id` empty and `amount_fen` the sub-orders' sum.
    Combined(Box<Combination>),
}

/// The sub-orders of a combined payment, in the order the provider lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combination {
    pub subs: Vec<SubPayment>,
}

/// One sub-order of a combined payment (`sub_orders[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubPayment {
    pub out_trade_no: String,
    pub transaction_id: String,
    /// `amount.total_amount`, in fen (not `payer_amount`, which coupons reduce).
    pub amount_fen: i64,
    pub currency: String,
    /// `sub_orders[].mchid`: the merchant the sub-order is settled to.
    pub mchid: String,
    /// `trade_state`: `SUCCESS` in a notification; a query also says `REFUND`, `NOTPAY`,
    /// `CLOSED`, `PAYERROR`, `USERPAYING`.
    pub trade_state: String,
    pub occurred_at: Option<Timestamp>,
}

impl SubPayment {
    /// Whether the provider says this sub-order was paid (`REFUND`: paid, then refunded).
    pub fn is_paid(&self) -> bool {
        matches!(self.trade_state.as_str(), "SUCCESS" | "REFUND")
    }
}

/// The most sub-orders a combination holds (WeChat's limit).
pub const MAX_SUB_ORDERS: usize = 50;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub out_refund_no: String,
    /// The provider's refund id (WeChat `refund_id`; Alipay has none per refund, so the
    /// adapter passes `trade_no:out_biz_no`).
    pub refund_id: String,
    pub amount: RefundAmount,
}

/// How a provider states a refund's amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundAmount {
    /// This refund alone (WeChat `amount.refund`).
    This(i64),
    /// Everything refunded on the trade so far, this refund included (Alipay `refund_fee`);
    /// the ledger derives this refund's amount from what the order already records.
    RunningTotal(i64),
}

/// The merchant identifiers a notification carries: WeChat `mchid` + `appid`,
/// Alipay `seller_id` + `app_id`. WeChat refund notifications carry no `appid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerchantIds {
    pub merchant_id: String,
    pub app_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub channel: ChannelId,
    pub kind: NoticeKind,
    pub out_trade_no: String,
    /// WeChat `transaction_id`, Alipay `trade_no`.
    pub transaction_id: String,
    /// The order amount the provider reports (`amount.total` / `total_amount`), in fen.
    pub amount_fen: i64,
    pub currency: String,
    pub merchant: MerchantIds,
    /// Whether `merchant` is the merchant/app whose key signed the notification. A valid
    /// signature over someone else's merchant ids never marks an order paid.
    pub merchant_matches: bool,
    pub occurred_at: Option<Timestamp>,
}

/// SHA-256 of a notice's business content, lowercase hex. Two deliveries are "the same"
/// exactly when their digests are equal.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Digest(String);

impl Digest {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn of(bytes: &[u8]) -> Self {
        Self(hex(digest(&SHA256, bytes).as_ref()))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.0[..12.min(self.0.len())])
    }
}

/// The widest provider ids the tables hold, from the providers' documented maxima: order and
/// refund numbers and transaction ids are at most 64 characters (Alipay `out_trade_no`,
/// `trade_no`, `out_biz_no`; WeChat's are 32 or 64), an Alipay refund id is
/// `trade_no:out_biz_no` (129). The migrations size the columns from these.
pub mod max_len {
    pub const ORDER_NO: usize = 64;
    pub const TRANSACTION_ID: usize = 64;
    pub const OUT_REFUND_NO: usize = 64;
    pub const REFUND_ID: usize = 2 * 64 + 1;
}

impl Notice {
    /// The provider account the payment is of, as `POST /orders` names one: WeChat's
    /// merchant (`mchid`, a sub-merchant's `sub_mchid`), Alipay's app (an authorizing
    /// merchant's `auth_app_id`).
    pub fn account(&self) -> &str {
        match self.channel {
            ChannelId::Wechat => &self.merchant.merchant_id,
            ChannelId::Alipay => self.merchant.app_id.as_deref().unwrap_or_default(),
        }
    }

    /// The notice as it may be stored: control characters in its text escaped
    /// ([`crate::text::storable`]: one NUL would fail every statement on PostgreSQL, and the
    /// provider would retry it for a day), then ids longer than the providers document (and
    /// the columns hold) refused, so an oversized value is a 400 the moment it arrives.
    pub fn checked(mut self) -> Result<Self, String> {
        self.make_storable();
        self.check_lengths()?;
        Ok(self)
    }

    fn make_storable(&mut self) {
        use crate::text::make_storable;
        for text in [
            &mut self.out_trade_no,
            &mut self.transaction_id,
            &mut self.currency,
            &mut self.merchant.merchant_id,
        ] {
            make_storable(text);
        }
        if let Some(app_id) = &mut self.merchant.app_id {
            make_storable(app_id);
        }
        match &mut self.kind {
            NoticeKind::Refunded(r) => {
                make_storable(&mut r.out_refund_no);
                make_storable(&mut r.refund_id);
            }
            NoticeKind::Other { status } => make_storable(status),
            NoticeKind::Transfer(t) => {
                for text in [&mut t.out_bill_no, &mut t.account] {
                    make_storable(text);
                }
                for text in [
                    &mut t.provider_bill_no,
                    &mut t.provider_state,
                    &mut t.package_info,
                    &mut t.fail_reason,
                ]
                .into_iter()
                .flatten()
                {
                    make_storable(text);
                }
            }
            NoticeKind::Combined(c) => {
                for sub in &mut c.subs {
                    for text in [
                        &mut sub.out_trade_no,
                        &mut sub.transaction_id,
                        &mut sub.currency,
                        &mut sub.mchid,
                        &mut sub.trade_state,
                    ] {
                        make_storable(text);
                    }
                }
            }
            NoticeKind::Paid | NoticeKind::Closed => {}
        }
    }

    fn check_lengths(&self) -> Result<(), String> {
        if let NoticeKind::Transfer(t) = &self.kind {
            return t.check_lengths();
        }
        let mut fields = vec![
            (
                "out_trade_no",
                self.out_trade_no.as_str(),
                max_len::ORDER_NO,
            ),
            (
                "transaction id",
                self.transaction_id.as_str(),
                max_len::TRANSACTION_ID,
            ),
        ];
        if let NoticeKind::Refunded(r) = &self.kind {
            fields.push(("out_refund_no", &r.out_refund_no, max_len::OUT_REFUND_NO));
            fields.push(("refund id", &r.refund_id, max_len::REFUND_ID));
        }
        if let NoticeKind::Combined(c) = &self.kind {
            for sub in &c.subs {
                fields.push((
                    "sub_orders[].out_trade_no",
                    &sub.out_trade_no,
                    max_len::ORDER_NO,
                ));
                fields.push((
                    "sub_orders[].transaction_id",
                    &sub.transaction_id,
                    max_len::TRANSACTION_ID,
                ));
            }
        }
        for (name, value, max) in fields {
            let chars = value.chars().count();
            if chars > max {
                return Err(format!(
                    "{name} is {chars} characters, at most {max} allowed"
                ));
            }
        }
        Ok(())
    }

    /// The digest of the business content as interface.md defines it, with `app_id` as the
    /// payment's app. Timestamps, nonces, `notify_id`, field order, re-encryption and
    /// `TRADE_SUCCESS` → `TRADE_FINISHED` are not part of it. Fields are hashed as a JSON
    /// array so no separator can be smuggled inside a value.
    ///
    /// Which app a provider's content names, and so [`Notice::digest`] and
    /// [`Notice::same_content`], is the provider's rule: see `crate::channel`.
    pub fn content_digest(&self, app_id: Option<&str>) -> Digest {
        let content = match &self.kind {
            NoticeKind::Refunded(r) => {
                let (rule, fen) = match r.amount {
                    RefundAmount::This(fen) => ("this", fen),
                    RefundAmount::RunningTotal(fen) => ("running_total", fen),
                };
                serde_json::json!([
                    "refund",
                    self.channel,
                    r.out_refund_no,
                    self.out_trade_no,
                    r.refund_id,
                    rule,
                    fen,
                ])
            }
            NoticeKind::Transfer(t) => serde_json::json!([
                "transfer",
                self.channel,
                t.out_bill_no,
                t.provider_bill_no,
                t.provider_state,
                t.amount_fen,
                t.account,
                t.fail_reason,
            ]),
            NoticeKind::Combined(c) => {
                let subs: Vec<_> = c
                    .subs
                    .iter()
                    .map(|sub| {
                        serde_json::json!([
                            sub.out_trade_no,
                            sub.transaction_id,
                            sub.amount_fen,
                            sub.currency,
                            sub.mchid,
                            sub.trade_state,
                        ])
                    })
                    .collect();
                serde_json::json!([
                    "combination",
                    self.channel,
                    self.out_trade_no,
                    self.merchant.merchant_id,
                    app_id,
                    subs,
                ])
            }
            NoticeKind::Closed => serde_json::json!([
                "closed",
                self.channel,
                self.out_trade_no,
                self.transaction_id,
            ]),
            _ => serde_json::json!([
                "payment",
                self.channel,
                self.out_trade_no,
                self.transaction_id,
                self.amount_fen,
                self.currency,
                self.merchant.merchant_id,
                app_id,
            ]),
        };
        Digest::of(content.to_string().as_bytes())
    }
}

impl Notice {
    /// One sub-order of a combined payment (`self` carries the [`Combination`]) as the
    /// payment notice the single-order rules judge: its own `out_trade_no`, transaction,
    /// amount and currency, the sub-order's `mchid` with the `combine_appid`, matching when
    /// the combination's merchant ids are the verifier's.
    pub fn sub_payment(&self, sub: &SubPayment) -> Notice {
        Notice {
            channel: self.channel,
            kind: NoticeKind::Paid,
            out_trade_no: sub.out_trade_no.clone(),
            transaction_id: sub.transaction_id.clone(),
            amount_fen: sub.amount_fen,
            currency: sub.currency.clone(),
            merchant: MerchantIds {
                merchant_id: sub.mchid.clone(),
                app_id: self.merchant.app_id.clone(),
            },
            merchant_matches: self.merchant_matches,
            occurred_at: sub.occurred_at,
        }
    }

    /// The digest of one sub-order's business content (interface.md, "Business content of a
    /// sub-order"): channel, `out_trade_no`, `transaction_id`, `total_amount`, `currency`,
    /// the sub-order's `mchid`, and the combination's `combine_mchid` and `combine_appid`.
    pub fn sub_digest(&self, sub: &SubPayment) -> Digest {
        let content = serde_json::json!([
            "combined payment",
            self.channel,
            sub.out_trade_no,
            sub.transaction_id,
            sub.amount_fen,
            sub.currency,
            sub.mchid,
            self.merchant.merchant_id,
            self.merchant.app_id,
        ]);
        Digest::of(content.to_string().as_bytes())
    }
}

/// Why money that arrived must not mark the order paid (`PAYMENT_ANOMALY` payload `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AnomalyReason {
    /// The amount or currency differs from the order (for refunds: more than was paid).
    AmountMismatch,
    MerchantMismatch,
    PaidAfterClose,
    /// The order was already paid through another channel or transaction.
    DuplicatePayment,
    /// A refund of a payment that is not the order's recorded one (a duplicate payment, a
    /// payment after close, another merchant's payment of the same `out_trade_no`).
    OtherPaymentRefunded,
    /// The provider's daily bill and the ledger disagree about a payment or refund
    /// (`crate::bills`): missing at the provider, or another amount.
    BillMismatch,
    /// A `BillMismatch` raised before that a later bill run found explained (the payment or
    /// refund is in another day's bill): it was not one. Follows the event it settles.
    BillMismatchSettled,
    /// A verified transfer notification about an `out_bill_no` never started here: money
    /// out that paynotify did not send (`TRANSFER_ANOMALY`).
    UnknownTransfer,
    /// A combined notification lists an `out_trade_no` that is not a sub-order of its
    /// combination here (unknown, an ordinary order, or another combination's).
    NotInCombination,
}

impl AnomalyReason {
    /// The `reason` a `PAYMENT_ANOMALY` payload names, if it is one of these.
    pub fn of_payload(payload: &serde_json::Value) -> Option<Self> {
        Self::deserialize(payload.get("reason")?).ok()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AmountMismatch => "AMOUNT_MISMATCH",
            Self::MerchantMismatch => "MERCHANT_MISMATCH",
            Self::PaidAfterClose => "PAID_AFTER_CLOSE",
            Self::DuplicatePayment => "DUPLICATE_PAYMENT",
            Self::OtherPaymentRefunded => "OTHER_PAYMENT_REFUNDED",
            Self::BillMismatch => "BILL_MISMATCH",
            Self::BillMismatchSettled => "BILL_MISMATCH_SETTLED",
            Self::UnknownTransfer => "UNKNOWN_TRANSFER",
            Self::NotInCombination => "NOT_IN_COMBINATION",
        }
    }
}

/// What the ledger did with a notice; the HTTP layer maps it to the provider's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// First delivery: the order moved and the outbox message was written.
    Applied,
    /// Same key, same business content as before: nothing written.
    Duplicate,
    /// Same key, different business content: nothing written, answered 409.
    Conflict,
    /// Recorded with a `PAYMENT_ANOMALY` message; the order did not move.
    Anomaly(AnomalyReason),
    /// Acknowledged without a state change (a status the ledger does not act on).
    Ignored,
    /// No such order: nothing written, answered 404 so the provider retries.
    UnknownOrder,
    /// A refund for an order whose payment has not arrived yet: nothing written, answered
    /// like an unknown order so the provider retries after the payment notification.
    TooEarly,
    /// Another refund of the same order changed it mid-transaction, or decides this one's
    /// amount and is not placed yet (Alipay): nothing written, the provider retries.
    Contended,
}

impl Outcome {
    /// The outcome's name in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
            Self::Anomaly(_) => "anomaly",
            Self::Ignored => "ignored",
            Self::UnknownOrder => "unknown_order",
            Self::TooEarly => "too_early",
            Self::Contended => "contended",
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A WeChat payment, for tests to change what they look at.
    pub(crate) fn paid() -> Notice {
        Notice {
            channel: ChannelId::Wechat,
            kind: NoticeKind::Paid,
            out_trade_no: "O1".into(),
            transaction_id: "T1".into(),
            amount_fen: 19900,
            currency: "CNY".into(),
            merchant: MerchantIds {
                merchant_id: "1900000001".into(),
                app_id: Some("wx1".into()),
            },
            merchant_matches: true,
            occurred_at: None,
        }
    }

    #[test]
    fn digest_is_sha256_hex() {
        assert_eq!(
            Digest::of(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digest_ignores_delivery_details_and_covers_business_fields() {
        let base = paid();
        let mut later = paid();
        later.occurred_at = Some(Timestamp::new(chrono::Utc::now()));
        assert_eq!(base.digest(), later.digest());

        let changes: Vec<fn(&mut Notice)> = vec![
            |n| n.channel = ChannelId::Alipay,
            |n| n.out_trade_no.push('x'),
            |n| n.transaction_id.push('x'),
            |n| n.amount_fen += 1,
            |n| n.currency = "USD".into(),
            |n| n.merchant.merchant_id.push('x'),
            |n| n.merchant.app_id = None,
        ];
        for change in changes {
            let mut n = paid();
            change(&mut n);
            assert_ne!(base.digest(), n.digest(), "{n:?}");
        }
    }

    #[test]
    fn refund_digest_covers_refund_id_and_amount() {
        let refund = |id: &str, fen| {
            let mut n = paid();
            n.kind = NoticeKind::Refunded(Refund {
                out_refund_no: "R1".into(),
                refund_id: id.into(),
                amount: RefundAmount::This(fen),
            });
            n
        };
        assert_eq!(refund("X", 100).digest(), refund("X", 100).digest());
        assert_ne!(refund("X", 100).digest(), refund("Y", 100).digest());
        assert_ne!(refund("X", 100).digest(), refund("X", 101).digest());
        assert_ne!(refund("X", 100).digest(), paid().digest());
    }

    #[test]
    fn ids_longer_than_the_providers_document_are_refused() {
        let mut n = paid();
        n.out_trade_no = "O".repeat(max_len::ORDER_NO);
        n.transaction_id = "T".repeat(max_len::TRANSACTION_ID);
        n.kind = NoticeKind::Refunded(Refund {
            out_refund_no: "R".repeat(max_len::OUT_REFUND_NO),
            refund_id: "I".repeat(max_len::REFUND_ID),
            amount: RefundAmount::This(1),
        });
        assert_eq!(n.check_lengths(), Ok(()));
        let longer: Vec<fn(&mut Notice)> = vec![
            |n| n.out_trade_no.push('x'),
            |n| n.transaction_id.push('x'),
            |n| {
                if let NoticeKind::Refunded(r) = &mut n.kind {
                    r.out_refund_no.push('x');
                }
            },
            |n| {
                if let NoticeKind::Refunded(r) = &mut n.kind {
                    r.refund_id.push('x');
                }
            },
        ];
        for grow in longer {
            let mut m = n.clone();
            grow(&mut m);
            assert!(m.check_lengths().is_err(), "{m:?}");
        }
    }

    #[test]
    fn control_characters_are_escaped_before_the_lengths_are_checked() {
        let mut n = paid();
        n.transaction_id = "T\0".into();
        n.merchant.app_id = Some("wx\u{7}".into());
        n.kind = NoticeKind::Other {
            status: "WAIT\n".into(),
        };
        let n = n.checked().expect("short enough");
        assert_eq!(
            (
                n.transaction_id.as_str(),
                n.merchant.app_id.as_deref(),
                &n.kind
            ),
            (
                "T\\x00",
                Some("wx\\x07"),
                &NoticeKind::Other {
                    status: "WAIT\\x0a".into()
                }
            )
        );
        // At the limit with a NUL: longer than the column once escaped.
        let mut n = paid();
        n.out_trade_no = format!("{}\0", "O".repeat(max_len::ORDER_NO - 1));
        assert!(n.checked().is_err());
    }

    #[test]
    fn a_provider_close_is_not_the_same_content_as_a_payment() {
        let mut closed = paid();
        closed.kind = NoticeKind::Closed;
        assert_ne!(closed.digest(), paid().digest());
    }

    #[test]
    fn fields_cannot_run_into_each_other() {
        let mut a = paid();
        a.out_trade_no = "O1\",\"T".into();
        a.transaction_id = "1".into();
        let mut b = paid();
        b.out_trade_no = "O1".into();
        b.transaction_id = "T1".into();
        assert_ne!(a.digest(), b.digest());
    }
}
