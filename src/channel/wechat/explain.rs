//! Explaining a stored request: the walk of `verify.rs` recorded, then decoding, and why a
//! check failed.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{Aad, LessSafeKey, Nonce};

use super::verify::{string_to_sign, without_json_whitespace};
use super::wire::Resource;
use super::{Merchant, PlatformVerifier, WechatPay};
use crate::channel::keys::RsaVerifier;
use crate::channel::{Channel, Explanation, Inbound, Provider, Rejection, Trail, Verdict};
use crate::notice::{ChannelId, Combination, Notice, NoticeKind};
use crate::time::Timestamp;

impl WechatPay {
    /// Why a signature that does not verify over the bytes received would have verified:
    /// the body WeChat signed recovered from what a proxy did to it, or another key.
    pub(super) fn why_unsigned(
        &self,
        serial: &str,
        timestamp: &str,
        nonce: &str,
        body: &[u8],
        signature: &[u8],
    ) -> String {
        let verifies = |key: &RsaVerifier, body: &[u8]| {
            key.verify(&string_to_sign(timestamp, nonce, body), signature)
        };
        let holders = self.holders(serial);
        if let Some(key) = holders.as_ref().and_then(|h| h.first()).map(|p| &p.key) {
            let compact = without_json_whitespace(body);
            if compact != body && verifies(key, &compact) {
                return "the body is not the bytes WeChat signed: it was re-serialised \
                        (whitespace differs); pass the raw request body through unchanged"
                    .to_owned();
            }
            for trimmed in [body.strip_suffix(b"\r\n"), body.strip_suffix(b"\n")]
                .into_iter()
                .flatten()
            {
                if verifies(key, trimmed) {
                    return "the body is not the bytes WeChat signed: a line ending was added \
                            at its end"
                        .to_owned();
                }
            }
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
                && let Ok(canonical) = serde_json::to_vec(&value)
                && canonical != body
                && verifies(key, &canonical)
            {
                return "the body is not the bytes WeChat signed: it was re-serialised \
                        (key order or escapes differ)"
                    .to_owned();
            }
        }
        let others: Vec<String> = self
            .all_keys()
            .into_iter()
            .filter(|(s, p)| !s.eq_ignore_ascii_case(serial) && verifies(&p.key, body))
            .map(|(s, _)| s)
            .collect();
        if let Some(other) = others.first() {
            return format!(
                "signed with the platform key {other}, not with {serial} that Wechatpay-Serial \
                 names: the serial-to-key mapping in wechat.merchants[].platform_keys is wrong"
            );
        }
        "the signature does not verify over the bytes received: the body or a Wechatpay-* \
         header was changed on the way (a proxy or framework re-serialised or re-encoded it), \
         the platform key configured for this serial is not WeChat's, or WeChat did not send it"
            .to_owned()
    }
}

impl WechatPay {
    /// Why the key `serial` names is not used: expired, or not among any merchant's keys,
    /// with each merchant's known serials and when its certificates were last asked for.
    pub(super) fn why_unknown(
        &self,
        serial: &str,
        found: Option<&PlatformVerifier>,
        now: Timestamp,
    ) -> String {
        if let Some(p) = found {
            let at = p
                .expire_at
                .map_or_else(String::new, |at| at.as_datetime().to_rfc3339());
            return format!(
                "serial {serial} is a platform certificate of merchant {} that expired at {at}: a certificate past its expiry is not used; WeChat signs with its current one, which a refresh downloads (POST /admin/certificates/refresh), or install it in platform_keys",
                p.merchant.mchid
            );
        }
        let merchants: Vec<String> = self
            .merchants()
            .iter()
            .map(|m| {
                let refreshed = self.last_refresh(&m.mchid).map_or_else(
                    || "never refreshed here".to_owned(),
                    |at| format!("last refresh at {}", at.as_datetime().to_rfc3339()),
                );
                format!(
                    "merchant {} (known: {}; {refreshed})",
                    m.mchid,
                    self.serials_of(&m.mchid, now).join(", ")
                )
            })
            .collect();
        format!(
            "serial {serial} is not among the known certificates of {}: WeChat signs with the key it names; a merchant that downloads its certificates fetches it on the first notification that names it (POST /admin/certificates/refresh does it now), else add its public key or certificate to wechat.merchants[].platform_keys (a rotation, a switch to WeChat Pay public keys, or a new merchant)",
            merchants.join(", ")
        )
    }
}

impl Provider for WechatPay {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn accounts(&self) -> Vec<String> {
        let book = self.book();
        let mut ids: Vec<String> = book
            .merchants
            .keys()
            .chain(book.subs.keys())
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    fn has_account(&self, id: &str) -> bool {
        let book = self.book();
        book.merchants.contains_key(id) || book.subs.contains_key(id)
    }

    fn order_field(&self) -> &'static str {
        "wechat_mchid"
    }

    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection> {
        crate::channel::admit(self, request)
    }

    fn explain(&self, request: &Inbound<'_>) -> Explanation {
        let mut e = Explanation::default();
        let Ok(verified) = self.walk(request, &mut e) else {
            return e;
        };
        let event_type = verified.event_type.clone();
        match self
            .decode(verified)
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
        {
            Ok(notice) => {
                if let NoticeKind::Transfer(t) = &notice.kind {
                    e.push("decoded fields", Verdict::Info, format!(
                        "event {event_type}, out_bill_no {}, transfer_bill_no {}, state {}, transfer_amount {}, mch_id {}, fail_reason {}",
                        t.out_bill_no, t.provider_bill_no.as_deref().unwrap_or("-"),
                        t.provider_state.as_deref().unwrap_or("-"), notice.amount_fen,
                        t.account, t.fail_reason.as_deref().unwrap_or("-")
                    ));
                    if notice.merchant_matches {
                        e.push(
                            "merchant",
                            Verdict::Pass,
                            "mch_id is the merchant configured for this key",
                        );
                    } else {
                        e.push("merchant", Verdict::Fail, format!("mch_id {} is not the merchant configured for this key: recorded as a TRANSFER_ANOMALY (MERCHANT_MISMATCH), the transfer is not moved", t.account));
                    }
                    e.notice = Some(notice);
                    return e;
                }
                if let NoticeKind::Combined(c) = &notice.kind {
                    explain_combined(&mut e, &event_type, &notice, c);
                    e.notice = Some(notice);
                    return e;
                }
                e.push("decoded fields", Verdict::Info, format!(
                    "event {event_type}, out_trade_no {}, transaction_id {}, amount_fen {}, currency {}, mchid {}, appid {}",
                    notice.out_trade_no, notice.transaction_id, notice.amount_fen,
                    notice.currency, notice.merchant.merchant_id, notice.merchant.app_id.as_deref().unwrap_or("-")
                ));
                if notice.merchant_matches {
                    e.push(
                        "merchant",
                        Verdict::Pass,
                        "mchid and appid are those configured for this key",
                    );
                } else {
                    e.push("merchant", Verdict::Fail, format!("mchid {} / appid {} are not those configured for this key: recorded as a MERCHANT_MISMATCH anomaly, the order is not paid", notice.merchant.merchant_id, notice.merchant.app_id.as_deref().unwrap_or("-")));
                }
                // Decoded even when the signature failed: the order checks still tell the
                // reader whether re-applying it would pay the order.
                e.notice = Some(notice);
            }
            Err(rejection) => {
                e.stop("decoded fields", rejection, Rejection::to_string);
            }
        }
        e
    }
}

/// A combined notification's decoded fields: the combination, each sub-order in WeChat's
/// order, and whether the combine merchant is the verifying one.
fn explain_combined(e: &mut Explanation, event_type: &str, notice: &Notice, c: &Combination) {
    let app_id = notice.merchant.app_id.as_deref().unwrap_or("-");
    e.push(
        "decoded fields",
        Verdict::Info,
        format!(
            "event {event_type}, a combined payment: combine_out_trade_no {}, combine_mchid {}, combine_appid {app_id}, {} sub-orders, total_amount {} in all",
            notice.out_trade_no,
            notice.merchant.merchant_id,
            c.subs.len(),
            notice.amount_fen
        ),
    );
    for (i, sub) in c.subs.iter().enumerate() {
        e.push(
            format!("sub-order {}", i + 1),
            Verdict::Info,
            format!(
                "out_trade_no {}, transaction_id {}, total_amount {}, currency {}, mchid {}, trade_state {}",
                sub.out_trade_no,
                sub.transaction_id,
                sub.amount_fen,
                sub.currency,
                sub.mchid,
                sub.trade_state
            ),
        );
    }
    if notice.merchant_matches {
        e.push(
            "merchant",
            Verdict::Pass,
            "combine_mchid and combine_appid are those configured for this key",
        );
    } else {
        e.push("merchant", Verdict::Fail, format!("combine_mchid {} / combine_appid {app_id} are not those configured for this key: every sub-order is recorded as a MERCHANT_MISMATCH anomaly, none is paid", notice.merchant.merchant_id));
    }
}

impl WechatPay {
    /// Why `r` does not decrypt with the APIv3 key of `merchant`, the merchant the platform
    /// key `serial` is configured under: another merchant's key, or a wrong key.
    pub(super) fn why_undecryptable(
        &self,
        holders: &[Arc<Merchant>],
        serial: &str,
        r: &Resource,
    ) -> String {
        let tried: Vec<&str> = holders.iter().map(|m| m.mchid.as_str()).collect();
        let merchant = match tried.as_slice() {
            [one] => format!("merchant {one}"),
            many => format!("any of merchants {}", many.join(", ")),
        };
        let opens = |key: &LessSafeKey| -> bool {
            let Ok(nonce) = Nonce::try_assume_unique_for_key(r.nonce.as_bytes()) else {
                return false;
            };
            let Ok(mut sealed) = BASE64.decode(&r.ciphertext) else {
                return false;
            };
            key.open_in_place(nonce, Aad::from(r.associated_data.as_bytes()), &mut sealed)
                .is_ok()
        };
        let merchants = self.merchants();
        let mut others: Vec<&str> = merchants
            .iter()
            .filter(|m| !tried.contains(&m.mchid.as_str()) && opens(&m.apiv3_key))
            .map(|m| m.mchid.as_str())
            .collect();
        others.sort_unstable();
        match others.first() {
            Some(other) => format!(
                "the resource does not decrypt with the apiv3_key of {merchant}, but does with merchant {other}'s: the platform key {serial} is configured under the wrong merchant"
            ),
            None => format!(
                "the resource does not decrypt with the apiv3_key of {merchant}: the key configured is not the APIv3 key set in the WeChat Pay merchant platform (it was changed, or mistyped); fix wechat.merchants[].apiv3_key, then re-apply the receipts"
            ),
        }
    }
}
