//! Verifying and decoding a notification: the `Channel` side of WeChat Pay.

#[allow(unused_imports)]
use super::*;

impl Channel for WechatPay {
    type Verified = Verified;

    fn id(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn verify(&self, request: &Inbound<'_>) -> Result<Verified, Rejection> {
        let h = request.headers;
        if let Some(kind) = single_header(h, "Wechatpay-Signature-Type")?
            && kind != SIGNATURE_TYPE
        {
            return Err(Rejection::BadRequest(format!(
                "unsupported Wechatpay-Signature-Type {kind}"
            )));
        }
        let timestamp = required_header(h, "Wechatpay-Timestamp")?;
        let nonce = required_header(h, "Wechatpay-Nonce")?;
        // No signature at all is a bad signature (401), like a wrong one.
        let signature = single_header(h, "Wechatpay-Signature")?
            .ok_or_else(|| Rejection::BadSignature("missing Wechatpay-Signature".into()))?;
        let serial = required_header(h, "Wechatpay-Serial")?;

        let seconds: i64 = timestamp
            .parse()
            .map_err(|_| Rejection::BadRequest("Wechatpay-Timestamp is not unix seconds".into()))?;
        let skew = request.now.unix_seconds().saturating_sub(seconds);
        if skew.abs() > TIMESTAMP_WINDOW_SECS {
            return Err(Rejection::Stale(format!("timestamp is {skew} s from now")));
        }
        let platform = self
            .keys
            .get(&serial.to_ascii_uppercase())
            .ok_or_else(|| Rejection::BadSignature(format!("unknown Wechatpay-Serial {serial}")))?;
        if signature.starts_with(PROBE_PREFIX) {
            return Err(Rejection::BadSignature("WECHATPAY/SIGNTEST probe".into()));
        }
        let signature = BASE64
            .decode(signature)
            .map_err(|_| Rejection::BadSignature("Wechatpay-Signature is not base64".into()))?;
        let mut message =
            Vec::with_capacity(timestamp.len() + nonce.len() + request.body.len() + 3);
        for part in [timestamp.as_bytes(), nonce.as_bytes(), request.body] {
            message.extend_from_slice(part);
            message.push(b'\n');
        }
        if !platform.key.verify(&message, &signature) {
            return Err(Rejection::BadSignature("signature does not verify".into()));
        }
        // Verified: from here on the body is WeChat's.
        open(&platform.merchant, request.body)
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
            .is_some_and(|serial| self.keys.contains_key(&serial.to_ascii_uppercase()));
        Standing {
            keyed,
            shaped: serde_json::from_slice::<Envelope>(request.body).is_ok(),
        }
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
