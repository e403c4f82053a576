//! Explaining a stored request: the walk of `verify.rs` recorded, then decoding, and why a
//! check failed.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{Aad, LessSafeKey, Nonce};

use super::verify::{string_to_sign, without_json_whitespace};
use super::wire::Resource;
use super::{Merchant, WechatPay};
use crate::channel::keys::RsaVerifier;
use crate::channel::{Channel, Explanation, Inbound, Provider, Rejection, Trail, Verdict};
use crate::notice::{ChannelId, Notice};

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
        let key = self.keys.get(&serial.to_ascii_uppercase()).map(|p| &p.key);
        if let Some(key) = key {
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
        let mut others: Vec<&String> = self
            .keys
            .iter()
            .filter(|(s, p)| !s.eq_ignore_ascii_case(serial) && verifies(&p.key, body))
            .map(|(s, _)| s)
            .collect();
        others.sort();
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

impl Provider for WechatPay {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn accounts(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .keys
            .values()
            .map(|p| p.merchant.mchid.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
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

impl WechatPay {
    /// Why `r` does not decrypt with the APIv3 key of `merchant`, the merchant the platform
    /// key `serial` is configured under: another merchant's key, or a wrong key.
    pub(super) fn why_undecryptable(
        &self,
        merchant: &Merchant,
        serial: &str,
        r: &Resource,
    ) -> String {
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
        let mut others: Vec<&str> = self
            .keys
            .values()
            .filter(|p| p.merchant.mchid != merchant.mchid && opens(&p.merchant.apiv3_key))
            .map(|p| p.merchant.mchid.as_str())
            .collect();
        others.sort_unstable();
        others.dedup();
        match others.first() {
            Some(other) => format!(
                "the resource does not decrypt with the apiv3_key of merchant {}, but does with merchant {other}'s: the platform key {serial} is configured under the wrong merchant",
                merchant.mchid
            ),
            None => format!(
                "the resource does not decrypt with the apiv3_key of merchant {}: the key configured is not the APIv3 key set in the WeChat Pay merchant platform (it was changed, or mistyped); fix wechat.merchants[].apiv3_key, then re-apply the receipts",
                merchant.mchid
            ),
        }
    }
}
