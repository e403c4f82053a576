//! Verifying and decoding a notification or an app gateway message: the `Channel` side of
//! Alipay, and the walk of its checks that verification and `explain` share.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::Alipay;
use super::transfer::{FundOrder, ORDER_CHANGED};
use super::wire::{Form, Kind, Verified, read_fields};
use crate::channel::{
    Answer, Channel, Halt, Inbound, Rejection, Reply, SIGNATURE, Signed, Standing, Trail,
};
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use crate::time::Timestamp;

impl Alipay {
    /// Every check of a notification, in the order Alipay's rules need them, each reported
    /// to `trail` (see [`Trail`]): `verify` and `explain` both walk this list. Ends with the
    /// fields read as text; a trail that goes on past a failure may get them even though a
    /// check failed.
    pub(super) fn walk(
        &self,
        request: &Inbound<'_>,
        trail: &mut impl Trail,
    ) -> Result<Verified, Rejection> {
        let form = match Form::parse(request.body) {
            Ok(form) => {
                trail.pass("form", || format!("{} fields, each once", form.0.len()));
                form
            }
            Err(why) => return Err(trail.stop("form", why, Rejection::to_string)),
        };
        trail.info("charset", || {
            let content_type = request
                .headers
                .get("content-type")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            let declared = form
                .get("charset")
                .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase());
            let utf8 = form.0.iter().all(|(_, v)| std::str::from_utf8(v).is_ok());
            format!(
                "charset field {}, Content-Type {content_type:?}; the decoded values {} valid UTF-8",
                declared.as_deref().unwrap_or("absent (utf-8)"),
                if utf8 { "are" } else { "are not" }
            )
        });
        let Some(app_id) = form.get("app_id") else {
            let why = Rejection::BadRequest("missing parameter app_id".into());
            return Err(trail.stop("app_id", why, |_| "missing parameter app_id".to_owned()));
        };
        let Some(app) = std::str::from_utf8(app_id).ok().and_then(|id| self.app(id)) else {
            let app_id = String::from_utf8_lossy(app_id);
            let why = Rejection::BadSignature(format!("unknown app_id {app_id}"));
            return Err(trail.stop("app_id", why, |_| {
                let book = self.book();
                let mut known: Vec<&String> = book.apps.keys().collect();
                known.sort();
                let shown = &known[..known.len().min(10)];
                let more = known.len() - shown.len();
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                format!("{app_id} is not an enabled app (known: {shown:?}{more}): add it to alipay.apps or POST /admin/merchants")
            }));
        };
        trail.pass("app_id", || format!("{} is configured", app.app_id));
        match form.get("sign_type") {
            None | Some(b"RSA2") => trail.pass("sign_type", || "RSA2".to_owned()),
            Some(other) => {
                let other = String::from_utf8_lossy(other);
                let why = Rejection::BadRequest(format!("unsupported sign_type {other}"));
                trail.fail("sign_type", why, |_| {
                    format!("unsupported sign_type {other}")
                })?;
            }
        }
        trail.info("string to sign", || {
            let content = form.sign_content(false);
            format!(
                "{} bytes, SHA-256 {}: \"{}\"",
                content.len(),
                crate::channel::sha256_hex(&content),
                crate::channel::shown(&content)
            )
        });
        let Some(sign) = form.get("sign").filter(|s| !s.is_empty()) else {
            let why = Rejection::BadSignature("missing sign".into());
            return Err(trail.stop(SIGNATURE, why, |_| "missing sign".to_owned()));
        };
        let Ok(signature) = BASE64.decode(sign) else {
            let why = Rejection::BadSignature("sign is not base64".into());
            return Err(trail.stop(SIGNATURE, why, |_| "sign is not base64".to_owned()));
        };
        let verified = app.key.verify(&form.sign_content(false), &signature)
            || (form.0.iter().any(|(_, v)| v.is_empty())
                && app.key.verify(&form.sign_content(true), &signature));
        if !verified {
            let why = Rejection::BadSignature("signature does not verify".into());
            return Err(trail.stop(SIGNATURE, why, |_| {
                self.why_unsigned(&app, &form, &signature)
            }));
        }
        trail.pass(SIGNATURE, || {
            format!("verifies with the Alipay public key of app {}", app.app_id)
        });
        let kind = check_kind(&form, request.route, trail)?;
        read_fields(&app, kind, form)
            .map_err(|why| trail.stop("decoded fields", why, Rejection::to_string))
    }
}

/// The check that a signed form came to the route of its kind: a trade notification at the
/// app gateway, or a gateway message at the notify URL, is a URL registered in the wrong
/// place, and must be loud rather than silently working.
fn check_kind(form: &Form, route: Option<&str>, trail: &mut impl Trail) -> Result<Kind, Rejection> {
    const CHECK: &str = "kind";
    let kind = Kind::of_form(form);
    let Some(route) = route else {
        trail.pass(CHECK, || {
            format!("{}; the route it came to is not known (a receipt stored before routes were kept): either kind is taken", kind.name())
        });
        return Ok(kind);
    };
    match Kind::of_route(route) {
        None => trail.pass(CHECK, || {
            format!(
                "{}; {route} is not an Alipay notify route: either kind is taken",
                kind.name()
            )
        }),
        Some(takes) if takes == kind => {
            trail.pass(CHECK, || format!("{}, which {route} takes", kind.name()))
        }
        Some(takes) => {
            let why = format!(
                "this is {}; it came to {route}, which takes {}; {} must end in {}",
                kind.name(),
                takes.name(),
                kind.registered(),
                kind.route()
            );
            trail.fail(CHECK, Rejection::WrongEventType(why.clone()), |_| why)?;
        }
    }
    Ok(kind)
}

/// An Open Platform message's notice. `alipay.fund.trans.order.changed`: the transfer its
/// `biz_content` names, as the app `app_id` names (whose key verified it: the form's
/// `app_id` chose the key). Any other `msg_method` is acknowledged and changes nothing.
///
/// Like a trade notification, a message is not refused for its age: `utc_timestamp` is not
/// checked (Alipay retries one for 25 hours, and a replay applies nothing twice).
fn message_notice(v: Verified) -> Result<Notice, Rejection> {
    let app_id = v.required("app_id")?.to_owned();
    let msg_method = v.required("msg_method")?.to_owned();
    let merchant_matches = app_id == v.app.app_id;
    let merchant = MerchantIds {
        merchant_id: app_id.clone(),
        app_id: Some(app_id.clone()),
    };
    if msg_method != ORDER_CHANGED {
        tracing::info!(
            app_id,
            msg_method,
            notify_id = v.field("notify_id").unwrap_or("-"),
            "an Alipay gateway message this service does not act on: acknowledged, nothing applied"
        );
        return Ok(Notice {
            channel: ChannelId::Alipay,
            kind: NoticeKind::Other { status: msg_method },
            out_trade_no: String::new(),
            transaction_id: String::new(),
            amount_fen: 0,
            currency: String::new(),
            merchant,
            merchant_matches,
            occurred_at: None,
        });
    }
    let order: FundOrder = serde_json::from_str(v.required("biz_content")?)
        .map_err(|e| Rejection::BadRequest(format!("biz_content: {e}")))?;
    let utc_timestamp = v
        .field("utc_timestamp")
        .and_then(|ms| ms.parse::<i64>().ok())
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(Timestamp::new);
    let mut seen = order
        .seen(&app_id)
        .map_err(|why| Rejection::BadRequest(format!("biz_content: {why}")))?;
    seen.occurred_at = seen.occurred_at.or(utc_timestamp);
    Ok(Notice {
        channel: ChannelId::Alipay,
        out_trade_no: seen.out_bill_no.clone(),
        transaction_id: seen.provider_bill_no.clone().unwrap_or_default(),
        amount_fen: seen.amount_fen.unwrap_or(0),
        currency: "CNY".to_owned(),
        merchant,
        merchant_matches,
        occurred_at: seen.occurred_at,
        kind: NoticeKind::Transfer(Box::new(seen)),
    })
}

impl Channel for Alipay {
    type Verified = Verified;

    fn id(&self) -> ChannelId {
        ChannelId::Alipay
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
        if v.kind == Kind::Message {
            return message_notice(v);
        }
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
                .is_some_and(|id| self.book().apps.contains_key(id)),
            shaped: app_id.is_some() && form.get("sign").is_some(),
        }
    }
}
