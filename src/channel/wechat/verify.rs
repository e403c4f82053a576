//! Verifying and decoding a notification: the `Channel` side of WeChat Pay, and the walk of
//! its checks that verification and `explain` share.

use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::wire::{
    CombinedProbe, CombinedTransaction, Envelope, PartnerProbe, PartnerTransaction, RefundResource,
    TRANSFER_EVENT, Transaction, TransferResource, bad_json, combined_notice, parse_time,
    route_base, single_header, transaction_notice, transfer_notice,
};
use super::{
    Merchant, PROBE_PREFIX, PlatformVerifier, SIGNATURE_TYPE, SubMerchant, TIMESTAMP_WINDOW_SECS,
    Verified, WechatPay,
};
use crate::channel::keys::RsaVerifier;
use crate::channel::platform::KeyOrigin;
use crate::channel::{
    Answer, Channel, Halt, Inbound, Rejection, Reply, SIGNATURE, Signed, Standing, Trail,
};
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};

const SIGNATURE_TYPE_CHECK: &str = "header Wechatpay-Signature-Type";

impl WechatPay {
    /// Every check of a notification, in the order WeChat's rules need them, each reported
    /// to `trail` (see [`Trail`]): `verify` and `explain` both walk this list. Ends with the
    /// decrypted resource once it is read; a trail that goes on past a failure may get it
    /// even though a check failed.
    pub(super) fn walk(
        &self,
        request: &Inbound<'_>,
        trail: &mut impl Trail,
    ) -> Result<Verified, Rejection> {
        let h = request.headers;
        match single_header(h, "Wechatpay-Signature-Type") {
            Ok(None) => trail.pass(SIGNATURE_TYPE_CHECK, || {
                format!("absent (means {SIGNATURE_TYPE})")
            }),
            Ok(Some(SIGNATURE_TYPE)) => {
                trail.pass(SIGNATURE_TYPE_CHECK, || SIGNATURE_TYPE.to_owned());
            }
            Ok(Some(other)) => {
                let why =
                    Rejection::BadRequest(format!("unsupported Wechatpay-Signature-Type {other}"));
                trail.fail(SIGNATURE_TYPE_CHECK, why, |_| {
                    format!("{other} is not supported (only {SIGNATURE_TYPE})")
                })?;
            }
            Err(why) => {
                trail.fail(SIGNATURE_TYPE_CHECK, why, Rejection::to_string)?;
            }
        }
        let timestamp = signature_header(trail, h, "header Wechatpay-Timestamp")?;
        let nonce = signature_header(trail, h, "header Wechatpay-Nonce")?;
        let signature = signature_header(trail, h, "header Wechatpay-Signature")?;
        let serial = signature_header(trail, h, "header Wechatpay-Serial")?;
        let (timestamp, nonce, signature, serial) = match (timestamp, nonce, signature, serial) {
            (Ok(timestamp), Ok(nonce), Ok(signature), Ok(serial)) => {
                (timestamp, nonce, signature, serial)
            }
            (Err(why), ..) | (_, Err(why), ..) | (_, _, Err(why), _) | (.., Err(why)) => {
                trail.skip(SIGNATURE, || "a signature header is missing".to_owned());
                return Err(why);
            }
        };

        match timestamp.parse::<i64>() {
            Ok(seconds) => {
                let skew = request.now.unix_seconds().saturating_sub(seconds);
                if skew.abs() <= TIMESTAMP_WINDOW_SECS {
                    trail.pass("timestamp skew", || format!("{skew} s between Wechatpay-Timestamp and arrival (window ±{TIMESTAMP_WINDOW_SECS} s)"));
                } else {
                    let why = Rejection::Stale(format!("timestamp is {skew} s from now"));
                    trail.fail("timestamp skew", why, |_| format!("{skew} s between Wechatpay-Timestamp and arrival, outside WeChat's ±{TIMESTAMP_WINDOW_SECS} s: a replay, a request held back, or a clock that is off"))?;
                }
            }
            Err(_) => {
                let why = Rejection::BadRequest("Wechatpay-Timestamp is not unix seconds".into());
                trail.fail("timestamp skew", why, |_| {
                    format!("Wechatpay-Timestamp {timestamp:?} is not unix seconds")
                })?;
            }
        }

        let holders = self.holders(serial);
        let usable: Vec<Arc<PlatformVerifier>> = holders
            .iter()
            .flat_map(|held| held.iter())
            .filter(|p| p.usable_at(request.now))
            .cloned()
            .collect();
        let mut platform = if usable.is_empty() {
            let found = holders.as_ref().and_then(|held| held.first());
            let why = Rejection::UnknownSerial(match found {
                Some(p) => format!(
                    "Wechatpay-Serial {serial} names a certificate that expired at {}",
                    p.expire_at
                        .map_or(String::new(), |at| at.as_datetime().to_rfc3339())
                ),
                None => format!("unknown Wechatpay-Serial {serial}"),
            });
            Err(trail.fail("serial", why, |_| {
                self.why_unknown(serial, found.map(|p| &**p), request.now)
            })?)
        } else {
            trail.pass("serial", || {
                let origin = match usable[0].origin {
                    KeyOrigin::Configured => "configured",
                    KeyOrigin::Downloaded => "downloaded",
                };
                match usable.as_slice() {
                    [p] => format!(
                        "{serial} is a {origin} platform key of merchant {}",
                        p.merchant.mchid
                    ),
                    many => format!(
                        "{serial} is a platform certificate held by {} merchants: the one whose apiv3_key opens the resource is the merchant",
                        many.len()
                    ),
                }
            });
            Ok(usable)
        };

        trail.info("string to sign", || {
            let message = string_to_sign(timestamp, nonce, request.body);
            format!(
                "{} bytes, SHA-256 {}: \"{}\"",
                message.len(),
                crate::channel::sha256_hex(&message),
                crate::channel::shown(&message)
            )
        });

        if signature.starts_with(PROBE_PREFIX) {
            let why = Rejection::BadSignature("WECHATPAY/SIGNTEST probe".into());
            trail.fail(SIGNATURE, why, |_| "a WECHATPAY/SIGNTEST/ probe: WeChat checks that merchants refuse it; refusing it is correct".to_owned())?;
        } else {
            match (&mut platform, BASE64.decode(signature)) {
                (_, Err(_)) => {
                    let why = Rejection::BadSignature("Wechatpay-Signature is not base64".into());
                    trail.fail(SIGNATURE, why, |_| {
                        "Wechatpay-Signature is not base64".to_owned()
                    })?;
                }
                (Err(_), Ok(_)) => {
                    trail.skip(SIGNATURE, || "no key for this serial".to_owned());
                }
                (Ok(held), Ok(sig)) => {
                    if let Some(key) = verifying_key(held, timestamp, nonce, request.body, &sig) {
                        // Several merchants holding the serial: those of the key that verified.
                        if held.len() > 1 {
                            let key = key.clone();
                            held.retain(|p| p.key.same_key(&key));
                        }
                        trail.pass(SIGNATURE, || {
                            "verifies with the platform key of this serial".to_owned()
                        });
                    } else {
                        let why = Rejection::BadSignature("signature does not verify".into());
                        trail.fail(SIGNATURE, why, |_| {
                            self.why_unsigned(serial, timestamp, nonce, request.body, &sig)
                        })?;
                    }
                }
            }
        }

        let mut platform = match platform {
            Ok(platform) => platform,
            Err(why) => {
                trail.skip("decryption", || "no merchant for this serial".to_owned());
                return Err(why);
            }
        };
        // A per-account path narrows a shared certificate's holders to the account's entry;
        // the others are kept to tell another account's notification from a wrong key.
        let mut others: Vec<Arc<Merchant>> = Vec::new();
        let path_account = request.route.and_then(|r| route_base(r).1);
        if let Some(account) = path_account {
            let held = platform.clone();
            self.check_path_account(account, &mut platform, trail)?;
            others = held
                .iter()
                .filter(|p| !platform.iter().any(|kept| Arc::ptr_eq(kept, p)))
                .map(|p| Arc::clone(&p.merchant))
                .collect();
        }
        let merchants: Vec<Arc<Merchant>> =
            platform.iter().map(|p| Arc::clone(&p.merchant)).collect();
        // Verified (for a trail that ends at the first failure): from here on the body is
        // WeChat's.
        match self.open(&merchants, serial, request.body, request.route, trail) {
            // Signed with the certificate the account shares, but encrypted for another of
            // its holders: not this account's notification (a 401, as for another key).
            Err(Rejection::Undecryptable(_))
                if !others.is_empty()
                    && self
                        .open(&others, serial, request.body, request.route, &mut Halt)
                        .is_ok() =>
            {
                Err(Rejection::BadSignature(format!(
                    "the resource opens with the APIv3 key of another merchant holding {serial}, not with {}'s",
                    path_account.unwrap_or_default()
                )))
            }
            result => result,
        }
    }
}

impl WechatPay {
    /// A per-account path: the key that verified must be the account's own (a sub-merchant's:
    /// its service provider's), and the account enabled here.
    fn check_path_account(
        &self,
        account: &str,
        held: &mut Vec<Arc<PlatformVerifier>>,
        trail: &mut impl Trail,
    ) -> Result<(), Rejection> {
        const CHECK: &str = "account of the path";
        let book = self.book();
        let owner = match book.subs.get(account) {
            Some(sub) => Some(sub.sp_mchid.as_str()),
            None => book.merchants.contains_key(account).then_some(account),
        };
        let Some(owner) = owner else {
            let why = Rejection::UnknownMerchant(format!(
                "{account} is not an enabled merchant or sub-merchant"
            ));
            return Err(trail.stop(CHECK, why, |_| {
                format!("the path names {account}, which is not an enabled WeChat merchant or sub-merchant here: add it (POST /admin/merchants) or re-enable it; WeChat retries for 24 hours")
            }));
        };
        if !held.iter().any(|p| p.merchant.mchid == owner) {
            let holder = held
                .first()
                .map_or_else(String::new, |p| p.merchant.mchid.clone());
            let why = Rejection::BadSignature(format!(
                "the key that verified is merchant {holder}'s, not {account}'s"
            ));
            return Err(trail.stop(CHECK, why, |_| {
                format!(
                    "the path names {account}, whose keys are merchant {owner}'s; the serial named is a key of merchant {holder}: only the named account's keys verify on this path"
                )
            }));
        }
        held.retain(|p| p.merchant.mchid == owner);
        trail.pass(CHECK, || {
            format!("{account} is enabled; the key is merchant {owner}'s")
        });
        Ok(())
    }

    /// The sub-merchant `sub_mchid` of the service provider `sp` that verified, enabled here
    /// (and the one a per-account path named, if any); else `unknown_merchant`.
    fn sub_of(
        &self,
        sp: &Merchant,
        sub_mchid: &str,
        path_account: Option<&str>,
    ) -> Result<Arc<SubMerchant>, Rejection> {
        if path_account.is_some_and(|a| a != sub_mchid) {
            return Err(Rejection::UnknownMerchant(format!(
                "sub_mchid {sub_mchid} is not the account the path names"
            )));
        }
        self.book()
            .subs
            .get(sub_mchid)
            .filter(|s| s.sp_mchid == sp.mchid)
            .cloned()
            .ok_or_else(|| {
                Rejection::UnknownMerchant(format!(
                    "sub_mchid {sub_mchid} is not an enabled sub-merchant of {}",
                    sp.mchid
                ))
            })
    }

    /// A service provider's payment of one of its sub-merchants: the sub-merchant's.
    fn partner_payment(&self, v: &Verified) -> Result<Notice, Rejection> {
        let t: PartnerTransaction =
            serde_json::from_slice(&v.plaintext).map_err(bad_json("transaction"))?;
        if t.amount.total <= 0 {
            return Err(Rejection::BadRequest(
                "amount.total must be positive".into(),
            ));
        }
        let sub = self.sub_of(&v.merchant, &t.sub_mchid, v.account.as_deref())?;
        let kind = if t.trade_state == "SUCCESS" {
            NoticeKind::Paid
        } else {
            NoticeKind::Other {
                status: t.trade_state.clone(),
            }
        };
        let app_matches = match &t.sub_appid {
            Some(sub_appid) => sub.appids.is_empty() || sub.appids.contains(sub_appid),
            None => true,
        };
        Ok(Notice {
            channel: ChannelId::Wechat,
            kind,
            merchant_matches: t.sp_mchid == v.merchant.mchid && app_matches,
            merchant: MerchantIds {
                merchant_id: t.sub_mchid,
                app_id: t.sub_appid.or(t.sp_appid),
            },
            out_trade_no: t.out_trade_no,
            transaction_id: t.transaction_id,
            amount_fen: t.amount.total,
            currency: t.amount.currency.unwrap_or_else(|| "CNY".to_owned()),
            occurred_at: parse_time(t.success_time.as_deref()),
        })
    }
}

/// A combined payment (合单支付) notified to its combine merchant: the combination, every
/// sub-order in it. The path rule is an ordinary payment's.
fn combined_payment(v: &Verified) -> Result<Notice, Rejection> {
    let m = &v.merchant;
    if v.account.as_deref().is_some_and(|a| a != m.mchid) {
        return Err(Rejection::UnknownMerchant(format!(
            "a combined payment of merchant {} on the path of another account",
            m.mchid
        )));
    }
    let t: CombinedTransaction =
        serde_json::from_slice(&v.plaintext).map_err(bad_json("combined transaction"))?;
    t.check().map_err(Rejection::BadRequest)?;
    // WeChat notifies paid sub-orders only, each with its payment.
    if let Some(i) = t.sub_orders.iter().position(|s| s.transaction_id.is_none()) {
        return Err(Rejection::BadRequest(format!(
            "sub_orders[{i}]: missing field `transaction_id`"
        )));
    }
    Ok(combined_notice(m, t))
}

/// The header `check` names (`header Wechatpay-…`), present once. The inner error is the
/// refusal a trail that goes on keeps until a check needs the header.
fn signature_header<'a>(
    trail: &mut impl Trail,
    headers: &'a HeaderMap,
    check: &'static str,
) -> Result<Result<&'a str, Rejection>, Rejection> {
    let name = check.trim_start_matches("header ");
    let why = match single_header(headers, name) {
        Ok(Some(value)) => {
            trail.pass(check, || format!("present once: {value}"));
            return Ok(Ok(value));
        }
        // No signature at all is a bad signature (401), like a wrong one.
        Ok(None) if name == "Wechatpay-Signature" => {
            Rejection::BadSignature("missing Wechatpay-Signature".into())
        }
        Ok(None) => Rejection::BadRequest(format!("missing header {name}")),
        Err(why) => {
            return trail.fail(check, why, Rejection::to_string).map(Err);
        }
    };
    trail
        .fail(check, why, |_| {
            format!("missing: WeChat always sends {name}; something on the way dropped it, or WeChat did not send this request")
        })
        .map(Err)
}

/// Whether a decrypted payment is a combined one (合单支付: it names a top-level
/// `combine_out_trade_no`).
fn is_combined(plaintext: &[u8]) -> bool {
    serde_json::from_slice::<CombinedProbe>(plaintext)
        .is_ok_and(|p| p.combine_out_trade_no.is_some())
}

/// Whether a decrypted payment is a service provider's (it names a `sub_mchid`).
fn is_partner(plaintext: &[u8]) -> bool {
    serde_json::from_slice::<PartnerProbe>(plaintext).is_ok_and(|p| p.sub_mchid.is_some())
}

impl Channel for WechatPay {
    type Verified = Verified;

    fn id(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn verify(&self, request: &Inbound<'_>) -> Result<Verified, Rejection> {
        self.walk(request, &mut Halt)
    }

    fn verify_signed(&self, request: &Inbound<'_>) -> (Result<Verified, Rejection>, bool) {
        let mut trail = Signed::default();
        let verified = self.walk(request, &mut trail);
        (verified, trail.signed)
    }

    fn decode(&self, v: Verified) -> Result<Notice, Rejection> {
        let m = &v.merchant;
        match v.event_type.as_str() {
            "TRANSACTION.SUCCESS" if is_combined(&v.plaintext) => combined_payment(&v),
            "TRANSACTION.SUCCESS" if is_partner(&v.plaintext) => self.partner_payment(&v),
            "TRANSACTION.SUCCESS" => {
                if v.account.as_deref().is_some_and(|a| a != m.mchid) {
                    return Err(Rejection::UnknownMerchant(format!(
                        "a payment of merchant {} on the path of another account",
                        m.mchid
                    )));
                }
                let t: Transaction =
                    serde_json::from_slice(&v.plaintext).map_err(bad_json("transaction"))?;
                if t.amount.total <= 0 {
                    return Err(Rejection::BadRequest(
                        "amount.total must be positive".into(),
                    ));
                }
                let kind = if t.trade_state == "SUCCESS" {
                    NoticeKind::Paid
                } else {
                    NoticeKind::Other {
                        status: t.trade_state.clone(),
                    }
                };
                Ok(transaction_notice(m, t, kind))
            }
            "REFUND.SUCCESS" | "REFUND.ABNORMAL" | "REFUND.CLOSED" => {
                let r: RefundResource =
                    serde_json::from_slice(&v.plaintext).map_err(bad_json("refund"))?;
                let (merchant_id, merchant_matches) = match (&r.sub_mchid, &r.mchid) {
                    (Some(sub), _) => {
                        self.sub_of(m, sub, v.account.as_deref())?;
                        (sub.clone(), r.sp_mchid.as_deref() == Some(m.mchid.as_str()))
                    }
                    (None, Some(mchid)) => {
                        if v.account.as_deref().is_some_and(|a| a != m.mchid) {
                            return Err(Rejection::UnknownMerchant(format!(
                                "a refund of merchant {} on the path of another account",
                                m.mchid
                            )));
                        }
                        (mchid.clone(), *mchid == m.mchid)
                    }
                    (None, None) => {
                        return Err(Rejection::BadRequest(
                            "refund: neither mchid nor sub_mchid".into(),
                        ));
                    }
                };
                if r.amount.refund <= 0 || r.amount.total <= 0 {
                    return Err(Rejection::BadRequest(
                        "amount.refund and amount.total must be positive".into(),
                    ));
                }
                let kind = if v.event_type == "REFUND.SUCCESS" && r.refund_status == "SUCCESS" {
                    NoticeKind::Refunded(Refund {
                        out_refund_no: r.out_refund_no,
                        refund_id: r.refund_id,
                        amount: RefundAmount::This(r.amount.refund),
                    })
                } else {
                    // ABNORMAL is not final (the merchant may retry the refund) and CLOSED
                    // refunded nothing: acknowledge, change nothing.
                    NoticeKind::Other {
                        status: r.refund_status,
                    }
                };
                Ok(Notice {
                    channel: ChannelId::Wechat,
                    kind,
                    merchant_matches,
                    merchant: MerchantIds {
                        merchant_id,
                        app_id: None,
                    },
                    out_trade_no: r.out_trade_no,
                    transaction_id: r.transaction_id,
                    amount_fen: r.amount.total,
                    currency: "CNY".to_owned(),
                    occurred_at: parse_time(r.success_time.as_deref()),
                })
            }
            TRANSFER_EVENT => {
                let t: TransferResource =
                    serde_json::from_slice(&v.plaintext).map_err(bad_json("transfer"))?;
                if t.transfer_amount <= 0 {
                    return Err(Rejection::BadRequest(
                        "transfer_amount must be positive".into(),
                    ));
                }
                Ok(transfer_notice(m, t.seen()))
            }
            other => Ok(Notice {
                // A verified event this service does not act on: acknowledged so WeChat
                // stops resending it for 24 hours.
                channel: ChannelId::Wechat,
                kind: NoticeKind::Other {
                    status: other.to_owned(),
                },
                out_trade_no: String::new(),
                transaction_id: String::new(),
                amount_fen: 0,
                currency: String::new(),
                merchant: MerchantIds {
                    merchant_id: m.mchid.clone(),
                    app_id: m.appids.first().cloned(),
                },
                merchant_matches: true,
                occurred_at: None,
            }),
        }
    }

    fn render(&self, reply: Reply<'_>) -> Answer {
        match reply {
            Reply::Success => Answer::empty(204),
            Reply::Failure { status, message } => Answer::json(
                status,
                &serde_json::json!({ "code": "FAIL", "message": message }),
            ),
        }
    }

    fn standing(&self, request: &Inbound<'_>) -> Standing {
        let keyed = single_header(request.headers, "Wechatpay-Serial")
            .ok()
            .flatten()
            .is_some_and(|serial| self.holders(serial).is_some());
        Standing {
            keyed,
            shaped: serde_json::from_slice::<Envelope>(request.body).is_ok(),
        }
    }

    /// `Wechatpay-Timestamp`, `-Nonce`, `-Signature`, `-Serial` and `-Signature-Type`.
    fn signature_headers(&self) -> Option<&'static str> {
        Some("wechatpay-")
    }
}

/// `body` with the whitespace outside JSON strings removed: WeChat's own compact form of a
/// body that a proxy pretty-printed or re-indented, key order and string bytes untouched.
pub(super) fn without_json_whitespace(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
    out
}

/// The string WeChat signs.
pub(super) fn string_to_sign(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(timestamp.len() + nonce.len() + body.len() + 3);
    for part in [timestamp.as_bytes(), nonce.as_bytes(), body] {
        message.extend_from_slice(part);
        message.push(b'\n');
    }
    message
}

/// The key among `held` that verifies `signature`: each distinct key tried once (a serial
/// names one key; merchants holding a shared platform certificate hold the same one).
fn verifying_key<'k>(
    held: &'k [Arc<PlatformVerifier>],
    timestamp: &str,
    nonce: &str,
    body: &[u8],
    signature: &[u8],
) -> Option<&'k RsaVerifier> {
    let message = string_to_sign(timestamp, nonce, body);
    let mut tried: Vec<&RsaVerifier> = Vec::new();
    held.iter().map(|p| &p.key).find(|key| {
        if tried.iter().any(|t| t.same_key(key)) {
            return false;
        }
        tried.push(key);
        key.verify(&message, signature)
    })
}
