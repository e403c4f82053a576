//! The notification on the wire: its headers, its JSON and the decryption of its `resource`.

use std::collections::HashSet;
use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderName};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{Aad, Nonce};
use serde::Deserialize;

use super::{Merchant, PAY_ROUTE, REFUND_ROUTE, TRANSFER_ROUTE, Verified, WechatPay};
use crate::channel::{Rejection, Trail};
use crate::notice::{
    ChannelId, Combination, MAX_SUB_ORDERS, MerchantIds, Notice, NoticeKind, SubPayment,
};
use crate::time::Timestamp;
use crate::transfer::{TransferSeen, TransferState};

/// The one value of a header that must appear exactly once.
pub(super) fn single_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, Rejection> {
    let mut values = match header_name(name) {
        Some(key) => headers.get_all(key),
        None => headers.get_all(name),
    };
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::BadRequest(format!(
            "header {name} appears more than once"
        )));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| Rejection::BadRequest(format!("header {name} is not visible ASCII")))
}

/// The headers a notification is read by, as header names made once: looking one up by
/// its text would parse (and, for these non-standard names, allocate) a header name on every
/// lookup of every request.
fn header_name(name: &str) -> Option<&'static HeaderName> {
    static SIGNATURE_TYPE: HeaderName = HeaderName::from_static("wechatpay-signature-type");
    static TIMESTAMP: HeaderName = HeaderName::from_static("wechatpay-timestamp");
    static NONCE: HeaderName = HeaderName::from_static("wechatpay-nonce");
    static SIGNATURE: HeaderName = HeaderName::from_static("wechatpay-signature");
    static SERIAL: HeaderName = HeaderName::from_static("wechatpay-serial");
    match name {
        "Wechatpay-Signature-Type" => Some(&SIGNATURE_TYPE),
        "Wechatpay-Timestamp" => Some(&TIMESTAMP),
        "Wechatpay-Nonce" => Some(&NONCE),
        "Wechatpay-Signature" => Some(&SIGNATURE),
        "Wechatpay-Serial" => Some(&SERIAL),
        _ => None,
    }
}

#[derive(Deserialize)]
pub(super) struct Envelope {
    pub(super) event_type: String,
    pub(super) resource_type: Option<String>,
    pub(super) resource: Resource,
}

#[derive(Deserialize)]
pub(super) struct Resource {
    pub(super) algorithm: String,
    pub(super) ciphertext: String,
    #[serde(default)]
    pub(super) associated_data: String,
    pub(super) nonce: String,
}

#[derive(Deserialize)]
pub(super) struct Transaction {
    pub(super) appid: String,
    pub(super) mchid: String,
    pub(super) out_trade_no: String,
    pub(super) transaction_id: String,
    pub(super) trade_state: String,
    pub(super) amount: TransactionAmount,
    pub(super) success_time: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct TransactionAmount {
    /// The order amount; not `payer_total`, which coupons reduce.
    pub(super) total: i64,
    pub(super) currency: Option<String>,
}

/// A combined payment's decrypted resource (合单支付, `original_type = transaction`): the
/// combine merchant's, one for every sub-order. No top-level `out_trade_no`, `transaction_id`,
/// `mchid` or `payer`. The combine query answers the same fields (and `combine_transaction_id`,
/// not used).
#[derive(Deserialize)]
pub(super) struct CombinedTransaction {
    pub(super) combine_appid: String,
    pub(super) combine_out_trade_no: String,
    pub(super) combine_mchid: String,
    pub(super) sub_orders: Vec<CombinedSubOrder>,
}

/// One of `sub_orders[]` (`trade_type`, `bank_type`, `attach` and `scene_info` are carried too
/// and not used).
#[derive(Deserialize)]
pub(super) struct CombinedSubOrder {
    pub(super) mchid: String,
    /// Partner mode (电商收付通, 服务商) names the sub-merchant here; not taken.
    #[serde(default)]
    pub(super) sub_mchid: Option<String>,
    pub(super) trade_state: String,
    pub(super) amount: CombinedAmount,
    pub(super) success_time: Option<String>,
    /// Always in a notification; a query answer about an unpaid sub-order may have none.
    #[serde(default)]
    pub(super) transaction_id: Option<String>,
    pub(super) out_trade_no: String,
}

#[derive(Deserialize)]
pub(super) struct CombinedAmount {
    /// The sub-order's amount; not `payer_amount`, which coupons reduce.
    pub(super) total_amount: i64,
    pub(super) currency: Option<String>,
}

/// Whether a decrypted payment is a combined one: it names a top-level `combine_out_trade_no`.
#[derive(Deserialize)]
pub(super) struct CombinedProbe {
    #[serde(default)]
    pub(super) combine_out_trade_no: Option<serde::de::IgnoredAny>,
}

/// WeChat's limit on `combine_out_trade_no`.
const COMBINE_OUT_TRADE_NO_MAX: usize = 32;

impl CombinedTransaction {
    /// What a combination must be before its sub-orders are judged, a notification's or a
    /// query answer's alike: its number within 1 to [`MAX_SUB_ORDERS`], 1 to 32 characters,
    /// every sub-order its own `out_trade_no` and a positive amount, and a direct merchant's
    /// (partner mode is not in the contract). The lengths of the sub-orders' ids are
    /// [`Notice::checked`]'s.
    pub(super) fn check(&self) -> Result<(), String> {
        let chars = self.combine_out_trade_no.chars().count();
        if chars == 0 || chars > COMBINE_OUT_TRADE_NO_MAX {
            return Err(format!(
                "combine_out_trade_no is {chars} characters, 1 to {COMBINE_OUT_TRADE_NO_MAX} allowed"
            ));
        }
        let count = self.sub_orders.len();
        if count == 0 || count > MAX_SUB_ORDERS {
            return Err(format!(
                "sub_orders has {count} entries, 1 to {MAX_SUB_ORDERS} allowed"
            ));
        }
        let mut seen = HashSet::with_capacity(count);
        let mut sum: i64 = 0;
        for (i, sub) in self.sub_orders.iter().enumerate() {
            if sub.sub_mchid.is_some() {
                return Err(format!(
                    "sub_orders[{i}] names a sub_mchid: a partner-mode combined payment is not supported"
                ));
            }
            if sub.amount.total_amount <= 0 {
                return Err(format!(
                    "sub_orders[{i}].amount.total_amount must be positive"
                ));
            }
            sum = sum.checked_add(sub.amount.total_amount).ok_or_else(|| {
                "the sub-orders' total_amount add up to more than this service counts".to_owned()
            })?;
            if !seen.insert(sub.out_trade_no.as_str()) {
                return Err(format!(
                    "sub_orders[{i}].out_trade_no {} is listed twice",
                    sub.out_trade_no
                ));
            }
        }
        Ok(())
    }
}

/// A service provider's payment (服务商模式): the sub-merchant's, decrypted with the service
/// provider's APIv3 key. No `mchid` or `appid`: `sp_mchid` + `sub_mchid` (+ `sp_appid`, and
/// `sub_appid` when the sub-merchant has its own app).
#[derive(Deserialize)]
pub(super) struct PartnerTransaction {
    pub(super) sp_mchid: String,
    pub(super) sub_mchid: String,
    #[serde(default)]
    pub(super) sp_appid: Option<String>,
    #[serde(default)]
    pub(super) sub_appid: Option<String>,
    pub(super) out_trade_no: String,
    pub(super) transaction_id: String,
    pub(super) trade_state: String,
    pub(super) amount: TransactionAmount,
    pub(super) success_time: Option<String>,
}

/// Whether a decrypted resource is a service provider's: it names a `sub_mchid`.
#[derive(Deserialize)]
pub(super) struct PartnerProbe {
    #[serde(default)]
    pub(super) sub_mchid: Option<String>,
}

/// A refund's decrypted resource: a direct merchant's names `mchid`, a service provider's
/// `sp_mchid` and `sub_mchid` instead.
#[derive(Deserialize)]
pub(super) struct RefundResource {
    #[serde(default)]
    pub(super) mchid: Option<String>,
    #[serde(default)]
    pub(super) sp_mchid: Option<String>,
    #[serde(default)]
    pub(super) sub_mchid: Option<String>,
    pub(super) transaction_id: String,
    pub(super) out_trade_no: String,
    pub(super) refund_id: String,
    pub(super) out_refund_no: String,
    pub(super) refund_status: String,
    pub(super) amount: WechatRefundAmount,
    pub(super) success_time: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct WechatRefundAmount {
    pub(super) total: i64,
    pub(super) refund: i64,
}

/// A merchant transfer's decrypted resource (`original_type = mch_payment`). WeChat's pages
/// name the merchant `mch_id` in the query answer and `mchid` in the notification: either is
/// taken.
#[derive(Deserialize)]
pub(super) struct TransferResource {
    pub(super) out_bill_no: String,
    pub(super) transfer_bill_no: String,
    pub(super) state: String,
    #[serde(alias = "mchid")]
    pub(super) mch_id: String,
    pub(super) transfer_amount: i64,
    /// `NAME_NOT_CORRECT`, `OVERDUE_CLOSE`, … with `FAIL`. (`openid` and `create_time` are
    /// carried too and not used.)
    pub(super) fail_reason: Option<String>,
    pub(super) update_time: Option<String>,
}

/// WeChat's word for a transfer's state as [`TransferState`]; one this client does not know is
/// not final: taken as `PROCESSING`, the word itself kept as the provider's state.
pub(super) fn transfer_state(state: &str) -> TransferState {
    TransferState::parse(state).unwrap_or(TransferState::Processing)
}

impl TransferResource {
    /// What the bill says, as the notification and the query answer both carry it (the same
    /// fields, so the same digest either way).
    pub(super) fn seen(self) -> TransferSeen {
        TransferSeen {
            state: transfer_state(&self.state),
            provider_state: Some(self.state),
            out_bill_no: self.out_bill_no,
            provider_bill_no: Some(self.transfer_bill_no),
            amount_fen: Some(self.transfer_amount),
            account: self.mch_id,
            package_info: None,
            fail_reason: self.fail_reason.filter(|r| !r.is_empty()),
            occurred_at: parse_time(self.update_time.as_deref()),
        }
    }
}

/// A transfer's notice: `out_trade_no` the `out_bill_no`, `transaction_id` the
/// `transfer_bill_no`, the merchant the one the bill names, matching when it is `merchant`
/// (whose key verified it).
pub(super) fn transfer_notice(merchant: &Merchant, seen: TransferSeen) -> Notice {
    Notice {
        channel: ChannelId::Wechat,
        merchant_matches: seen.account == merchant.mchid,
        merchant: MerchantIds {
            merchant_id: seen.account.clone(),
            app_id: None,
        },
        out_trade_no: seen.out_bill_no.clone(),
        transaction_id: seen.provider_bill_no.clone().unwrap_or_default(),
        amount_fen: seen.amount_fen.unwrap_or(0),
        currency: "CNY".to_owned(),
        occurred_at: seen.occurred_at,
        kind: NoticeKind::Transfer(Box::new(seen)),
    }
}

/// A payment's notice, from the transaction a notification or a query answer carries: the
/// same fields, so the same digest either way.
pub(super) fn transaction_notice(m: &Merchant, t: Transaction, kind: NoticeKind) -> Notice {
    Notice {
        channel: ChannelId::Wechat,
        kind,
        merchant_matches: t.mchid == m.mchid && m.appids.contains(&t.appid),
        merchant: MerchantIds {
            merchant_id: t.mchid,
            app_id: Some(t.appid),
        },
        out_trade_no: t.out_trade_no,
        transaction_id: t.transaction_id,
        amount_fen: t.amount.total,
        currency: t.amount.currency.unwrap_or_else(|| "CNY".to_owned()),
        occurred_at: parse_time(t.success_time.as_deref()),
    }
}

/// A combined payment's notice, from the combination a notification or a combine query
/// answer carries: `out_trade_no` the `combine_out_trade_no`, no `transaction_id`, the amount
/// the sub-orders' sum, the merchant the combine merchant and app, matching when they are
/// `m`'s (whose key verified it), as for an ordinary payment. Its sub-orders in WeChat's
/// order, each as WeChat states it (`trade_state` included: the ledger decides what each
/// means). Call [`CombinedTransaction::check`] first.
pub(super) fn combined_notice(m: &Merchant, t: CombinedTransaction) -> Notice {
    let subs: Vec<SubPayment> = t
        .sub_orders
        .into_iter()
        .map(|sub| SubPayment {
            occurred_at: parse_time(sub.success_time.as_deref()),
            out_trade_no: sub.out_trade_no,
            transaction_id: sub.transaction_id.unwrap_or_default(),
            amount_fen: sub.amount.total_amount,
            currency: sub.amount.currency.unwrap_or_else(|| "CNY".to_owned()),
            mchid: sub.mchid,
            trade_state: sub.trade_state,
        })
        .collect();
    let amount_fen = subs
        .iter()
        .fold(0i64, |sum, sub| sum.saturating_add(sub.amount_fen));
    // WeChat's combinations are in CNY; the first sub-order's word stands for all of them
    // (each sub-order's own currency is judged against its order).
    let currency = subs
        .first()
        .map_or_else(|| "CNY".to_owned(), |sub| sub.currency.clone());
    let occurred_at = subs.iter().filter_map(|sub| sub.occurred_at).max();
    Notice {
        channel: ChannelId::Wechat,
        merchant_matches: t.combine_mchid == m.mchid && m.appids.contains(&t.combine_appid),
        merchant: MerchantIds {
            merchant_id: t.combine_mchid,
            app_id: Some(t.combine_appid),
        },
        out_trade_no: t.combine_out_trade_no,
        transaction_id: String::new(),
        amount_fen,
        currency,
        occurred_at,
        kind: NoticeKind::Combined(Box::new(Combination { subs })),
    }
}

pub(super) fn parse_time(text: Option<&str>) -> Option<Timestamp> {
    text.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| Timestamp::new(t.with_timezone(&chrono::Utc)))
}

pub(super) fn bad_json(what: &str) -> impl Fn(serde_json::Error) -> Rejection + '_ {
    move |e| Rejection::BadRequest(format!("{what}: {e}"))
}

impl WechatPay {
    /// The checks of a signed body, the last of [`WechatPay::walk`]: the envelope read, its
    /// event type one the notify `route` takes, and `resource` decrypted with `merchant`'s
    /// APIv3 key (the key of the platform key `serial` names). For a trail that ends at the
    /// first failure, only ever reached by a body whose signature verified.
    /// Opens `resource` with the APIv3 key of the first of `merchants` (those holding the
    /// key that verified: one, or several sharing a platform certificate) whose key opens it:
    /// AES-GCM authenticates, so only the right key does.
    pub(super) fn open(
        &self,
        merchants: &[Arc<Merchant>],
        serial: &str,
        body: &[u8],
        route: Option<&str>,
        trail: &mut impl Trail,
    ) -> Result<Verified, Rejection> {
        const CHECK: &str = "decryption";
        let envelope: Envelope = match serde_json::from_slice(body) {
            Ok(envelope) => envelope,
            Err(err) => {
                let why = Rejection::BadRequest(format!("envelope: {err}"));
                return Err(trail.stop(CHECK, why, |_| {
                    format!("the body is not WeChat's notification JSON: {err}")
                }));
            }
        };
        check_event_route(&envelope.event_type, route, trail)?;
        if envelope
            .resource_type
            .as_deref()
            .is_some_and(|t| t != "encrypt-resource")
        {
            let why = Rejection::BadRequest("resource_type is not encrypt-resource".into());
            return Err(trail.stop(CHECK, why, Rejection::to_string));
        }
        let r = envelope.resource;
        if r.algorithm != "AEAD_AES_256_GCM" {
            let why = Rejection::BadRequest(format!("unsupported algorithm {}", r.algorithm));
            return Err(trail.stop(CHECK, why, |_| {
                format!("unsupported algorithm {}", r.algorithm)
            }));
        }
        let Ok(nonce) = Nonce::try_assume_unique_for_key(r.nonce.as_bytes()) else {
            let why = Rejection::BadRequest("resource.nonce is not 12 bytes".into());
            return Err(trail.stop(CHECK, why, Rejection::to_string));
        };
        let Ok(mut sealed) = BASE64.decode(&r.ciphertext) else {
            let why = Rejection::BadRequest("resource.ciphertext is not base64".into());
            return Err(trail.stop(CHECK, why, Rejection::to_string));
        };
        let aad = || Aad::from(r.associated_data.as_bytes());
        let opened = match merchants {
            [merchant] => merchant
                .apiv3_key
                .open_in_place(nonce, aad(), &mut sealed)
                .ok()
                .map(|plaintext| (merchant, plaintext.to_vec())),
            // Each try on a copy: a failed open leaves its buffer unspecified.
            _ => merchants.iter().find_map(|merchant| {
                let nonce = Nonce::try_assume_unique_for_key(r.nonce.as_bytes()).ok()?;
                let mut copy = sealed.clone();
                let plaintext = merchant
                    .apiv3_key
                    .open_in_place(nonce, aad(), &mut copy)
                    .ok()?;
                Some((merchant, plaintext.to_vec()))
            }),
        };
        let Some((merchant, plaintext)) = opened else {
            let why = Rejection::Undecryptable(match merchants {
                [merchant] => format!(
                    "resource does not decrypt with the apiv3_key of merchant {}",
                    merchant.mchid
                ),
                _ => format!(
                    "resource does not decrypt with the apiv3_key of any of the {} merchants holding {serial}",
                    merchants.len()
                ),
            });
            return Err(trail.stop(CHECK, why, |_| {
                self.why_undecryptable(merchants, serial, &r)
            }));
        };
        trail.pass(CHECK, || {
            format!(
                "decrypts with the apiv3_key of merchant {} ({} bytes)",
                merchant.mchid,
                plaintext.len()
            )
        });
        Ok(Verified {
            merchant: Arc::clone(merchant),
            event_type: envelope.event_type,
            plaintext,
            account: route.and_then(|r| route_base(r).1).map(str::to_owned),
        })
    }
}

/// The one transfer event this service takes (商家转账: the bill reached `SUCCESS`, `FAIL` or
/// `CANCELLED`).
pub(super) const TRANSFER_EVENT: &str = "MCHTRANSFER.BILL.FINISHED";

/// The kinds of notification WeChat sends, each to the notify URL registered for it: a
/// payment's to the `notify_url` of the order, a refund's to the `notify_url` of the refund
/// request (or the merchant platform's refund URL), a transfer's to the `notify_url` of the
/// transfer-bills request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Payment,
    Refund,
    Transfer,
}

impl EventKind {
    /// The kind of `event_type` by its prefix (WeChat Pay v3: `TRANSACTION.*`, `REFUND.*`,
    /// `MCHTRANSFER.*`); `None` for one of none, which the payment and refund routes
    /// acknowledge.
    fn of_event(event_type: &str) -> Option<Self> {
        if event_type.starts_with("TRANSACTION.") {
            Some(Self::Payment)
        } else if event_type.starts_with("REFUND.") {
            Some(Self::Refund)
        } else if event_type.starts_with("MCHTRANSFER.") {
            Some(Self::Transfer)
        } else {
            None
        }
    }

    /// The kind the notify route `route` takes (a per-account route takes its base's);
    /// `None` for a path that is not one of ours.
    fn of_route(route: &str) -> Option<Self> {
        match route_base(route).0 {
            PAY_ROUTE => Some(Self::Payment),
            REFUND_ROUTE => Some(Self::Refund),
            TRANSFER_ROUTE => Some(Self::Transfer),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Payment => "a payment",
            Self::Refund => "a refund",
            Self::Transfer => "a merchant transfer",
        }
    }

    /// The event types of this kind the route takes, as WeChat names them.
    fn events(self) -> &'static str {
        match self {
            Self::Payment => "TRANSACTION.*",
            Self::Refund => "REFUND.*",
            Self::Transfer => TRANSFER_EVENT,
        }
    }

    /// Whether the route of this kind takes `event_type`: the transfer route takes its one
    /// event only (the contract: other event types are `wrong_event_type` there).
    fn takes(self, event_type: &str) -> bool {
        match self {
            Self::Transfer => event_type == TRANSFER_EVENT,
            Self::Payment | Self::Refund => Self::of_event(event_type).is_none_or(|e| e == self),
        }
    }

    fn route(self) -> &'static str {
        match self {
            Self::Payment => PAY_ROUTE,
            Self::Refund => REFUND_ROUTE,
            Self::Transfer => TRANSFER_ROUTE,
        }
    }

    /// Where WeChat is told the notify URL of this kind.
    fn registered(self) -> &'static str {
        match self {
            Self::Payment => "payments (the notify_url of the order request)",
            Self::Refund => "refunds (the notify_url of the refund request)",
            Self::Transfer => {
                "transfers (the notify_url of the transfer-bills request, transfers.wechat_notify_url)"
            }
        }
    }
}

/// A notify route and the account a per-account route names: `/notify/wechat/pay/1900000101`
/// is `(PAY_ROUTE, Some("1900000101"))`.
pub(super) fn route_base(route: &str) -> (&str, Option<&str>) {
    for base in [PAY_ROUTE, REFUND_ROUTE] {
        if let Some(account) = route
            .strip_prefix(base)
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|a| !a.is_empty() && !a.contains('/'))
        {
            return (base, Some(account));
        }
    }
    (route, None)
}

/// The check that a signed notification came to the route of its kind: a notify URL
/// registered for the wrong kind must be loud, not silently working (a payment applied
/// through the refund route, a refund through the payment route).
fn check_event_route(
    event_type: &str,
    route: Option<&str>,
    trail: &mut impl Trail,
) -> Result<(), Rejection> {
    const CHECK: &str = "event type";
    let Some(route) = route else {
        trail.pass(CHECK, || {
            format!("{event_type}; the route it came to is not known (a receipt stored before routes were kept): every event type is taken")
        });
        return Ok(());
    };
    let Some(takes) = EventKind::of_route(route) else {
        trail.pass(CHECK, || {
            format!("{event_type}; {route} is not a WeChat notify route: every event type is taken")
        });
        return Ok(());
    };
    let event = EventKind::of_event(event_type);
    if takes.takes(event_type) {
        trail.pass(CHECK, || match event {
            Some(event) => format!("{event_type} is {}, which {route} takes", event.name()),
            None => format!("{event_type} is neither a payment, a refund nor a transfer: acknowledged on {route}, changing nothing"),
        });
        return Ok(());
    }
    let why = match event {
        Some(event) if event != takes => format!(
            "event_type {event_type} is {}; this request came to {route}, which takes {}; the notify URL registered for {} must end in {}",
            event.name(),
            takes.events(),
            event.registered(),
            event.route()
        ),
        _ => format!(
            "event_type {event_type} is not {}; this request came to {route}, which takes only that",
            takes.events()
        ),
    };
    trail.fail(CHECK, Rejection::WrongEventType(why.clone()), |_| why)?;
    Ok(())
}

#[cfg(test)]
mod header_tests {
    use super::*;

    #[test]
    fn the_made_header_names_are_the_names_they_stand_for() {
        for name in [
            "Wechatpay-Signature-Type",
            "Wechatpay-Timestamp",
            "Wechatpay-Nonce",
            "Wechatpay-Signature",
            "Wechatpay-Serial",
        ] {
            let parsed = HeaderName::from_bytes(name.as_bytes()).expect("a header name");
            assert_eq!(header_name(name), Some(&parsed), "{name}");
        }
        assert_eq!(header_name("Wechatpay-Other"), None);
    }
}
