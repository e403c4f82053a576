//! Verifying and decoding a notification: the `Channel` side of Alipay.

#[allow(unused_imports)]
use super::*;

impl Channel for Alipay {
    type Verified = Verified;

    fn id(&self) -> ChannelId {
        ChannelId::Alipay
    }

    fn verify(&self, request: &Inbound<'_>) -> Result<Verified, Rejection> {
        let form = Form::parse(request.body)?;
        let app_id = form
            .get("app_id")
            .ok_or_else(|| Rejection::BadRequest("missing parameter app_id".into()))?;
        let app = std::str::from_utf8(app_id)
            .ok()
            .and_then(|id| self.apps.get(id))
            .ok_or_else(|| {
                Rejection::BadSignature(format!(
                    "unknown app_id {}",
                    String::from_utf8_lossy(app_id)
                ))
            })?;
        match form.get("sign_type") {
            None | Some(b"RSA2") => {}
            Some(other) => {
                return Err(Rejection::BadRequest(format!(
                    "unsupported sign_type {}",
                    String::from_utf8_lossy(other)
                )));
            }
        }
        let sign = form
            .get("sign")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Rejection::BadSignature("missing sign".into()))?;
        let signature = BASE64
            .decode(sign)
            .map_err(|_| Rejection::BadSignature("sign is not base64".into()))?;
        let verified = app.key.verify(&form.sign_content(false), &signature)
            || (form.0.iter().any(|(_, v)| v.is_empty())
                && app.key.verify(&form.sign_content(true), &signature));
        if !verified {
            return Err(Rejection::BadSignature("signature does not verify".into()));
        }

        read_fields(app, form)
    }

    fn decode(&self, v: Verified) -> Result<Notice, Rejection> {
        let out_trade_no = v.required("out_trade_no")?.to_owned();
        let trade_no = v.required("trade_no")?.to_owned();
        let status = v.required("trade_status")?.to_owned();
        let seller_id = v.required("seller_id")?.to_owned();
        let app_id = v.required("app_id")?.to_owned();
        let total = v
            .amount("total_amount")?
            .ok_or_else(|| Rejection::BadRequest("missing parameter total_amount".into()))?;
        if total <= 0 {
            return Err(Rejection::BadRequest(
                "total_amount must be positive".into(),
            ));
        }
        // `refund_fee` is the trade's refunded total so far; a payment notification may carry
        // `0.00`.
        let refunded_total = v.amount("refund_fee")?.filter(|fen| *fen > 0);
        let kind = match (status.as_str(), refunded_total) {
            ("TRADE_SUCCESS", Some(total_refunded)) | ("TRADE_CLOSED", Some(total_refunded)) => {
                // The refund's key: without one there is nothing to deduplicate on.
                let out_biz_no = v.required("out_biz_no")?.to_owned();
                NoticeKind::Refunded(Refund {
                    refund_id: format!("{trade_no}:{out_biz_no}"),
                    out_refund_no: out_biz_no,
                    amount: RefundAmount::RunningTotal(total_refunded),
                })
            }
            // TRADE_FINISHED after TRADE_SUCCESS is the same payment: same business content.
            ("TRADE_SUCCESS", None) | ("TRADE_FINISHED", _) => NoticeKind::Paid,
            ("TRADE_CLOSED", None) => NoticeKind::Closed,
            (other, _) => NoticeKind::Other {
                status: other.to_owned(),
            },
        };
        let occurred_at = v.time("gmt_refund").or_else(|| v.time("gmt_payment"));
        Ok(Notice {
            channel: ChannelId::Alipay,
            kind,
            merchant_matches: app_id == v.app.app_id && seller_id == v.app.seller_id,
            merchant: MerchantIds {
                merchant_id: seller_id,
                app_id: Some(app_id),
            },
            out_trade_no,
            transaction_id: trade_no,
            amount_fen: total,
            currency: "CNY".to_owned(),
            occurred_at,
        })
    }

    fn render(&self, reply: Reply<'_>) -> Answer {
        // Alipay reads only the body: exactly `success`, anything else means "retry".
        match reply {
            Reply::Success => Answer::text(200, "success"),
            Reply::Failure { status, .. } => Answer::text(status, "fail"),
        }
    }

    fn standing(&self, request: &Inbound<'_>) -> Standing {
        let Ok(form) = Form::parse(request.body) else {
            return Standing {
                keyed: false,
                shaped: false,
            };
        };
        let app_id = form.get("app_id");
        Standing {
            keyed: app_id
                .and_then(|id| std::str::from_utf8(id).ok())
                .is_some_and(|id| self.apps.contains_key(id)),
            shaped: app_id.is_some() && form.get("sign").is_some(),
        }
    }
}
