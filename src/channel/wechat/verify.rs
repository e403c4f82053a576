//! Verifying and decoding a notification: the `Channel` side of WeChat Pay, and the walk of
//! its checks that verification and `explain` share.

use actix_web::http::header::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::wire::{
    Envelope, RefundResource, TRANSFER_EVENT, Transaction, TransferResource, bad_json, parse_time,
    single_header, transaction_notice, transfer_notice,
};
use super::{PROBE_PREFIX, SIGNATURE_TYPE, TIMESTAMP_WINDOW_SECS, Verified, WechatPay};
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

        let platform = match self.key(serial) {
            Some(p) if p.usable_at(request.now) => {
                trail.pass("serial", || {
                    let origin = match p.origin {
                        KeyOrigin::Configured => "configured",
                        KeyOrigin::Downloaded => "downloaded",
                    };
                    format!(
                        "{serial} is a {origin} platform key of merchant {}",
                        p.merchant.mchid
                    )
                });
                Ok(p)
            }
            found => {
                let why = Rejection::UnknownSerial(match &found {
                    Some(p) => format!(
                        "Wechatpay-Serial {serial} names a certificate that expired at {}",
                        p.expire_at
                            .map_or(String::new(), |at| at.as_datetime().to_rfc3339())
                    ),
                    None => format!("unknown Wechatpay-Serial {serial}"),
                });
                Err(trail.fail("serial", why, |_| {
                    self.why_unknown(serial, found.as_deref(), request.now)
                })?)
            }
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
            match (&platform, BASE64.decode(signature)) {
                (_, Err(_)) => {
                    let why = Rejection::BadSignature("Wechatpay-Signature is not base64".into());
                    trail.fail(SIGNATURE, why, |_| {
                        "Wechatpay-Signature is not base64".to_owned()
                    })?;
                }
                (Err(_), Ok(_)) => {
                    trail.skip(SIGNATURE, || "no key for this serial".to_owned());
                }
                (Ok(p), Ok(sig)) => {
                    if p.key
                        .verify(&string_to_sign(timestamp, nonce, request.body), &sig)
                    {
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

        let platform = match platform {
            Ok(platform) => platform,
            Err(why) => {
                trail.skip("decryption", || "no merchant for this serial".to_owned());
                return Err(why);
            }
        };
        // Verified (for a trail that ends at the first failure): from here on the body is
        // WeChat's.
        self.open(
            &platform.merchant,
            serial,
            request.body,
            request.route,
            trail,
        )
    }
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
            "TRANSACTION.SUCCESS" => {
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
                    merchant_matches: r.mchid == m.mchid,
                    merchant: MerchantIds {
                        merchant_id: r.mchid,
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
            .is_some_and(|serial| self.key(serial).is_some());
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
