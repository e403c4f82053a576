//! Alipay asynchronous notifications (`/notify/alipay`, `trade_status_sync`).
//!
//! Alipay: the body is `application/x-www-form-urlencoded` in the charset its own `charset`
//! parameter names. Percent-decode once (`+` is a space), drop `sign` and `sign_type`, sort the
//! rest by key, join `k=v` with `&`, and verify `sign` (base64 SHA256withRSA) over those bytes
//! with the app's Alipay public key. The raw body is read as bytes: actix's form extractor
//! would refuse Alipay's `…; text/html; charset=utf-8` Content-Type, and URL query parameters
//! are never part of the signed set.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::web;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{FixedOffset, NaiveDateTime, TimeZone};
use serde::Deserialize;
use std::path::PathBuf;
use utoipa::OpenApi;

use super::api::{
    ApiFuture, ClientSettings, CloseAnswer, Failure, Plumbing, ProviderApi, RefundAnswer,
    TradeAnswer,
};
use super::keys::{self, RsaVerifier};
use super::{
    Answer, Channel, Explanation, Inbound, Mounted, Provider, Rejection, Reply, Standing, Verdict,
};
use crate::config::value::{ConfigError, invalid};
use crate::money::yuan_to_fen;
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use crate::time::Timestamp;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlipaySettings {
    pub apps: Vec<AlipayApp>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlipayApp {
    pub app_id: String,
    pub seller_id: String,
    pub alipay_public_key_file: Option<PathBuf>,
    pub alipay_cert_file: Option<PathBuf>,
    /// The app private key. With it, this app's unpaid orders are queried and closed at
    /// Alipay (src/reconcile.rs).
    #[serde(default)]
    pub app_private_key_file: Option<PathBuf>,
    /// The OpenAPI gateway; `https://openapi.alipay.com/gateway.do` when absent.
    #[serde(default)]
    pub gateway: Option<String>,
}

/// A configured Alipay app.
pub struct App {
    pub app_id: String,
    pub seller_id: String,
    key: RsaVerifier,
}

/// The Alipay channel: every configured app, keyed by `app_id`.
pub struct Alipay {
    apps: HashMap<String, Arc<App>>,
}

impl std::fmt::Debug for Alipay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.apps.keys().collect();
        ids.sort();
        f.debug_struct("Alipay").field("apps", &ids).finish()
    }
}

impl Alipay {
    /// Loads every app's Alipay public key once, at start-up.
    pub fn from_settings(settings: &AlipaySettings, now: Timestamp) -> Result<Self, ConfigError> {
        let mut apps = HashMap::new();
        for (i, a) in settings.apps.iter().enumerate() {
            let prefix = format!("alipay.apps[{i}]");
            let key = match (&a.alipay_public_key_file, &a.alipay_cert_file) {
                (Some(path), None) => {
                    keys::public_key_file(&format!("{prefix}.alipay_public_key_file"), path)?
                }
                // Certificate mode: notifications are verified exactly as in public-key mode,
                // with the key inside alipayCertPublicKey_RSA2.crt.
                (None, Some(path)) => {
                    keys::certificate_file(&format!("{prefix}.alipay_cert_file"), path, now)?.1
                }
                _ => {
                    return Err(invalid(
                        prefix,
                        "set exactly one of alipay_public_key_file and alipay_cert_file",
                    ));
                }
            };
            let app = App {
                app_id: a.app_id.clone(),
                seller_id: a.seller_id.clone(),
                key,
            };
            if apps.insert(a.app_id.clone(), Arc::new(app)).is_some() {
                return Err(invalid(
                    format!("{prefix}.app_id"),
                    format!("{} is configured twice", a.app_id),
                ));
            }
        }
        Ok(Self { apps })
    }
}

/// The form fields, decoded once, as bytes in the body's charset, in arrival order.
struct Form(Vec<(Vec<u8>, Vec<u8>)>);

fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let spaced: Vec<u8> = raw
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    percent_encoding::percent_decode(&spaced).collect()
}

impl Form {
    /// Splits on `&`, then on the first `=` only (base64 values end in `=`).
    fn parse(body: &[u8]) -> Result<Self, Rejection> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for pair in body.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
            let (key, value) = match pair.iter().position(|b| *b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, &pair[pair.len()..]),
            };
            let key = percent_decode(key);
            if !seen.insert(key.clone()) {
                return Err(Rejection::BadRequest(format!(
                    "parameter {} appears more than once",
                    String::from_utf8_lossy(&key)
                )));
            }
            fields.push((key, percent_decode(value)));
        }
        Ok(Self(fields))
    }

    fn get(&self, key: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(k, _)| k == key.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    /// The string Alipay signed. The Java SDK skips empty values, the others keep them.
    fn sign_content(&self, keep_empty: bool) -> Vec<u8> {
        let mut fields: Vec<_> = self
            .0
            .iter()
            .filter(|(k, v)| k != b"sign" && k != b"sign_type" && (keep_empty || !v.is_empty()))
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::new();
        for (i, (k, v)) in fields.into_iter().enumerate() {
            if i > 0 {
                out.push(b'&');
            }
            out.extend_from_slice(k);
            out.push(b'=');
            out.extend_from_slice(v);
        }
        out
    }
}

/// The bytes Alipay signs for `body` (empty values skipped, as the Java SDK does).
pub fn string_to_sign(body: &[u8]) -> Result<Vec<u8>, Rejection> {
    Ok(Form::parse(body)?.sign_content(false))
}

/// What verification hands to decoding: the app and the fields as text.
#[derive(Debug)]
pub struct Verified {
    app: Arc<App>,
    fields: HashMap<String, String>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl Verified {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn required(&self, key: &str) -> Result<&str, Rejection> {
        self.field(key)
            .ok_or_else(|| Rejection::BadRequest(format!("missing parameter {key}")))
    }

    fn amount(&self, key: &str) -> Result<Option<i64>, Rejection> {
        self.field(key)
            .map(|v| yuan_to_fen(v).map_err(|e| Rejection::BadRequest(format!("{key}: {e}"))))
            .transpose()
    }

    /// Alipay times are Beijing time, `yyyy-MM-dd HH:mm:ss` (`gmt_refund` adds `.SSS`).
    fn time(&self, key: &str) -> Option<Timestamp> {
        let text = self.field(key)?;
        let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").ok()?;
        let beijing = FixedOffset::east_opt(8 * 3600)?;
        let at = beijing.from_local_datetime(&naive).single()?;
        Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
    }
}

fn text(bytes: &[u8], gbk: bool) -> Option<String> {
    if gbk {
        let (text, had_errors) = encoding_rs::GBK.decode_without_bom_handling(bytes);
        (!had_errors).then(|| text.into_owned())
    } else {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

/// A form whose signature verified, read as text in the charset Alipay signed it in.
fn read_fields(app: &Arc<App>, form: Form) -> Result<Verified, Rejection> {
    // Now read the values as text, in the charset Alipay signed.
    let charset = form
        .get("charset")
        .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase())
        .unwrap_or_else(|| "utf-8".to_owned());
    let gbk = match charset.as_str() {
        "utf-8" | "utf8" => false,
        "gbk" | "gb2312" | "gb18030" => true,
        other => {
            return Err(Rejection::BadRequest(format!(
                "unsupported charset {other}"
            )));
        }
    };
    let mut fields = HashMap::with_capacity(form.0.len());
    for (k, v) in form.0 {
        let key = text(&k, gbk);
        let value = text(&v, gbk);
        let (Some(key), Some(value)) = (key, value) else {
            return Err(Rejection::BadRequest(format!(
                "a parameter is not valid {charset}"
            )));
        };
        fields.insert(key, value);
    }
    Ok(Verified {
        app: Arc::clone(app),
        fields,
    })
}

#[cfg(feature = "fuzzing")]
impl Alipay {
    /// Fuzzing only (the `fuzzing` feature, never in the service): [`Channel::admit`]'s
    /// steps after the signature check, for a form as if its `sign` verified.
    pub fn admit_signed_body(&self, body: &[u8]) -> Result<Notice, Rejection> {
        let form = Form::parse(body)?;
        let app = form
            .get("app_id")
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(|id| self.apps.get(id))
            .ok_or_else(|| Rejection::BadSignature("unknown app_id".into()))?;
        read_fields(app, form)
            .and_then(|v| self.decode(v))
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
    }
}

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

/// `bytes` read as `from` and written as `to` (`None` when they are not valid `from`).
fn transcode(bytes: &[u8], from_gbk: bool) -> Option<Vec<u8>> {
    if from_gbk {
        let (text, had_errors) = encoding_rs::GBK.decode_without_bom_handling(bytes);
        (!had_errors).then(|| text.into_owned().into_bytes())
    } else {
        let text = std::str::from_utf8(bytes).ok()?;
        let (encoded, _, had_errors) = encoding_rs::GBK.encode(text);
        (!had_errors).then(|| encoded.into_owned())
    }
}

impl Alipay {
    /// Why a `sign` that does not verify over the fields received would have verified.
    fn why_unsigned(&self, app: &App, form: &Form, signature: &[u8]) -> String {
        let verifies = |form: &Form| {
            app.key.verify(&form.sign_content(false), signature)
                || app.key.verify(&form.sign_content(true), signature)
        };
        let non_ascii = form.0.iter().any(|(_, v)| !v.is_ascii());
        let declared = form
            .get("charset")
            .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase())
            .unwrap_or_else(|| "utf-8 (absent)".to_owned());
        if non_ascii {
            for (from_gbk, what) in [(false, "GBK to UTF-8"), (true, "UTF-8 to GBK")] {
                let recoded: Option<Vec<_>> = form
                    .0
                    .iter()
                    .map(|(k, v)| Some((k.clone(), transcode(v, from_gbk)?)))
                    .collect();
                if let Some(fields) = recoded
                    && verifies(&Form(fields))
                {
                    return format!(
                        "the body is not the bytes Alipay signed: it was re-encoded from {what} \
                         on the way (charset={declared}); Alipay signs the bytes of the charset \
                         it sends, so pass the raw body through unchanged"
                    );
                }
            }
        }
        let mut others: Vec<&str> = self
            .apps
            .values()
            .filter(|other| other.app_id != app.app_id)
            .filter(|other| {
                other.key.verify(&form.sign_content(false), signature)
                    || other.key.verify(&form.sign_content(true), signature)
            })
            .map(|other| other.app_id.as_str())
            .collect();
        others.sort_unstable();
        if let Some(other) = others.first() {
            return format!(
                "signed with the Alipay public key configured for app {other}, not for app {}: \
                 alipay.apps[].alipay_public_key_file is swapped",
                app.app_id
            );
        }
        "the sign does not verify over the fields received: a field was changed, added or \
         removed on the way, the body was re-encoded, or the key configured in \
         alipay.apps[].alipay_public_key_file is not Alipay's public key for this app (the \
         app's own public key is a common mistake)"
            .to_owned()
    }
}

impl Provider for Alipay {
    fn channel(&self) -> ChannelId {
        ChannelId::Alipay
    }

    fn accounts(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.apps.keys().cloned().collect();
        ids.sort();
        ids
    }

    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection> {
        super::admit(self, request)
    }

    fn explain(&self, request: &Inbound<'_>) -> Explanation {
        let mut e = Explanation::default();
        let form = match Form::parse(request.body) {
            Ok(form) => {
                e.push(
                    "form",
                    Verdict::Pass,
                    format!("{} fields, each once", form.0.len()),
                );
                form
            }
            Err(rejection) => {
                e.push("form", Verdict::Fail, rejection.to_string());
                return e;
            }
        };
        let content_type = request
            .headers
            .get("content-type")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let declared = form
            .get("charset")
            .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase());
        let utf8 = form.0.iter().all(|(_, v)| std::str::from_utf8(v).is_ok());
        e.push(
            "charset",
            Verdict::Info,
            format!(
                "charset field {}, Content-Type {content_type:?}; the decoded values {} valid UTF-8",
                declared.as_deref().unwrap_or("absent (utf-8)"),
                if utf8 { "are" } else { "are not" }
            ),
        );
        let Some(app_id) = form.get("app_id") else {
            e.push("app_id", Verdict::Fail, "missing parameter app_id");
            return e;
        };
        let app_id = String::from_utf8_lossy(app_id).into_owned();
        let Some(app) = self.apps.get(&app_id) else {
            let mut known: Vec<&String> = self.apps.keys().collect();
            known.sort();
            e.push(
                "app_id",
                Verdict::Fail,
                format!("{app_id} is not a configured app (configured: {known:?}): add it to alipay.apps"),
            );
            return e;
        };
        e.push("app_id", Verdict::Pass, format!("{app_id} is configured"));
        match form.get("sign_type") {
            None | Some(b"RSA2") => e.push("sign_type", Verdict::Pass, "RSA2"),
            Some(other) => e.push(
                "sign_type",
                Verdict::Fail,
                format!("unsupported sign_type {}", String::from_utf8_lossy(other)),
            ),
        }
        let content = form.sign_content(false);
        e.push(
            "string to sign",
            Verdict::Info,
            format!(
                "{} bytes, SHA-256 {}: \"{}\"",
                content.len(),
                super::sha256_hex(&content),
                super::shown(&content)
            ),
        );
        let signature = match form.get("sign").filter(|s| !s.is_empty()) {
            None => {
                e.push("signature", Verdict::Fail, "missing sign");
                return e;
            }
            Some(sign) => match BASE64.decode(sign) {
                Ok(signature) => signature,
                Err(_) => {
                    e.push("signature", Verdict::Fail, "sign is not base64");
                    return e;
                }
            },
        };
        let verified = app.key.verify(&content, &signature)
            || (form.0.iter().any(|(_, v)| v.is_empty())
                && app.key.verify(&form.sign_content(true), &signature));
        if !verified {
            let why = self.why_unsigned(app, &form, &signature);
            e.push("signature", Verdict::Fail, why);
            return e;
        }
        e.push(
            "signature",
            Verdict::Pass,
            format!("verifies with the Alipay public key of app {app_id}"),
        );
        match super::admit(self, request) {
            Ok(notice) => {
                e.push(
                    "decoded fields",
                    Verdict::Info,
                    format!(
                        "out_trade_no {}, trade_no {}, amount_fen {}, seller_id {}, app_id {}",
                        notice.out_trade_no,
                        notice.transaction_id,
                        notice.amount_fen,
                        notice.merchant.merchant_id,
                        notice.merchant.app_id.as_deref().unwrap_or("-")
                    ),
                );
                if notice.merchant_matches {
                    e.push(
                        "merchant",
                        Verdict::Pass,
                        "seller_id and app_id are those configured",
                    );
                } else {
                    e.push("merchant", Verdict::Fail, format!(
                        "seller_id {} is not the one configured for app {app_id}: recorded as a MERCHANT_MISMATCH anomaly, the order is not paid",
                        notice.merchant.merchant_id
                    ));
                }
                e.notice = Some(notice);
            }
            Err(rejection) => e.push("decoded fields", Verdict::Fail, rejection.to_string()),
        }
        e
    }
}

crate::routes::notify::notify_handler!(
    #[utoipa::path(post, path = "/notify/alipay", tag = "notify",
    description = "Alipay asynchronous notification (trade_status_sync): payments, refunds, closes. Authenticated by the RSA2 `sign` field; the body is read raw whatever its Content-Type.",
    request_body(content = String, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "`success`: applied, duplicate, recorded anomaly", content_type = "text/plain", body = String),
        (status = 400, description = "`fail`: malformed form, repeated field, bad amount", content_type = "text/plain", body = String),
        (status = 401, description = "`fail`: bad or missing sign, unknown app_id", content_type = "text/plain", body = String),
        (status = 404, description = "`fail`: unknown order", content_type = "text/plain", body = String),
        (status = 409, description = "`fail`: the same payment or refund as before with other amount or merchant", content_type = "text/plain", body = String),
        (status = 413, description = "`fail`: body too large", content_type = "text/plain", body = String),
        (status = 503, description = "`fail`: database unavailable or the same notification in flight", content_type = "text/plain", body = String)))]
    alipay,
    Alipay
);

/// The OpenAPI description of the notify route.
#[derive(OpenApi)]
#[openapi(paths(alipay))]
pub struct NotifyApi;

/// Alipay's production OpenAPI gateway.
pub const GATEWAY: &str = "https://openapi.alipay.com/gateway.do";

/// One app's API credentials.
struct ApiApp {
    app: Arc<App>,
    key: keys::RsaSigner,
    gateway: String,
}

/// The Alipay OpenAPI client (`alipay.trade.query`, `alipay.trade.close`,
/// `alipay.trade.fastpay.refund.query`) for every app with an app private key. Requests are
/// signed RSA2 with it; answers are verified over the exact bytes of their `…_response` value
/// with the app's Alipay public key, the one notifications are verified with.
pub struct AlipayApi {
    apps: Vec<ApiApp>,
    plumbing: Plumbing,
}

/// The fields of a `…_response` value this client reads.
#[derive(Deserialize)]
struct ApiResponse {
    code: String,
    #[serde(default)]
    msg: String,
    sub_code: Option<String>,
    sub_msg: Option<String>,
    out_trade_no: Option<String>,
    trade_no: Option<String>,
    trade_status: Option<String>,
    total_amount: Option<String>,
    /// What the buyer paid; `0.00` (or absent) while nothing was paid.
    buyer_pay_amount: Option<String>,
    send_pay_date: Option<String>,
    refund_status: Option<String>,
    out_request_no: Option<String>,
    /// Not in the documented query answer; checked when an answer carries it.
    seller_id: Option<String>,
}

impl ApiResponse {
    /// Whether a query answer shows money paid: `send_pay_date` (when the buyer paid) or a
    /// `buyer_pay_amount` above zero. A trade closed unpaid has neither. An amount that does
    /// not parse counts as a payment, so the paid path refuses the answer instead of it
    /// closing the order.
    fn carries_a_payment(&self) -> bool {
        let paid_at = self
            .send_pay_date
            .as_deref()
            .is_some_and(|d| !d.trim().is_empty());
        let paid = self
            .buyer_pay_amount
            .as_deref()
            .is_some_and(|a| yuan_to_fen(a).map_or(true, |fen| fen > 0));
        paid_at || paid
    }

    /// `20000` (service unavailable) and `ACQ.SYSTEM_ERROR`: Alipay says "try later".
    fn retry_later(&self) -> bool {
        self.code == "20000" || self.sub_code.as_deref() == Some("ACQ.SYSTEM_ERROR")
    }

    fn failure(&self) -> Failure {
        let what = format!(
            "code {} {} {} {}",
            self.code,
            self.msg,
            self.sub_code.as_deref().unwrap_or(""),
            self.sub_msg.as_deref().unwrap_or("")
        );
        if self.retry_later() {
            Failure::Unreachable(what)
        } else {
            Failure::Unexpected(what)
        }
    }
}

/// Alipay's times: Beijing, `yyyy-MM-dd HH:mm:ss`.
fn beijing(at: Timestamp) -> String {
    (at.as_datetime().naive_utc() + chrono::Duration::hours(8))
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

impl AlipayApi {
    /// `None` when no app has an app private key.
    fn from_settings(
        channel: &Alipay,
        settings: &AlipaySettings,
        client: &ClientSettings,
    ) -> Result<Option<Self>, ConfigError> {
        let mut apps = Vec::new();
        for (i, a) in settings.apps.iter().enumerate() {
            let prefix = format!("alipay.apps[{i}]");
            let Some(path) = &a.app_private_key_file else {
                if a.gateway.is_some() {
                    return Err(invalid(
                        format!("{prefix}.app_private_key_file"),
                        "required with gateway: the app private key that signs requests",
                    ));
                }
                continue;
            };
            let key = keys::private_key_file(&format!("{prefix}.app_private_key_file"), path)?;
            let gateway = a.gateway.clone().unwrap_or_else(|| GATEWAY.to_owned());
            super::api::provider_url(&format!("{prefix}.gateway"), &gateway)?;
            let Some(app) = channel.apps.get(&a.app_id) else {
                return Err(invalid(format!("{prefix}.app_id"), "not loaded"));
            };
            apps.push(ApiApp {
                app: Arc::clone(app),
                key,
                gateway,
            });
        }
        if apps.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            apps,
            plumbing: Plumbing::new(client)?,
        }))
    }

    fn app(&self, app_id: &str) -> Result<&ApiApp, Failure> {
        self.apps
            .iter()
            .find(|a| a.app.app_id == app_id)
            .ok_or_else(|| Failure::Unexpected(format!("no app private key for app {app_id}")))
    }

    /// Calls `method` and returns its verified `…_response` value. Alipay: sign every
    /// non-empty parameter but `sign`, sorted by key, `k=v` joined with `&`, raw values.
    async fn call(
        &self,
        a: &ApiApp,
        method: &str,
        biz_content: &serde_json::Value,
        now: Timestamp,
    ) -> Result<ApiResponse, Failure> {
        let mut params: Vec<(&str, String)> = vec![
            ("app_id", a.app.app_id.clone()),
            ("biz_content", biz_content.to_string()),
            ("charset", "utf-8".to_owned()),
            ("format", "JSON".to_owned()),
            ("method", method.to_owned()),
            ("sign_type", "RSA2".to_owned()),
            ("timestamp", beijing(now)),
            ("version", "1.0".to_owned()),
        ];
        params.sort_by(|x, y| x.0.cmp(y.0));
        let content = params
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let sign = a
            .key
            .sign_base64(content.as_bytes())
            .map_err(|e| Failure::Unexpected(format!("signing failed: {e}")))?;
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            for (k, v) in &params {
                form.append_pair(k, v);
            }
            form.append_pair("sign", &sign);
            form.finish()
        };
        let request = self
            .plumbing
            .client()
            .post(&a.gateway)
            .header(
                "Content-Type",
                "application/x-www-form-urlencoded;charset=utf-8",
            )
            .body(body);
        let r = self.plumbing.send(request).await?;
        if r.status == 429 || r.status >= 500 {
            return Err(Failure::Unreachable(format!("HTTP {}", r.status)));
        }
        if !(200..300).contains(&r.status) {
            return Err(Failure::Unexpected(format!("HTTP {}", r.status)));
        }
        let response_key = format!("{}_response", method.replace('.', "_"));
        let value = signed_response(&a.app.key, &r.body, &response_key)?;
        serde_json::from_str(value).map_err(|e| Failure::Unexpected(format!("{response_key}: {e}")))
    }

    async fn do_query(&self, app_id: &str, out_trade_no: &str, now: Timestamp) -> TradeAnswer {
        let a = match self.app(app_id) {
            Ok(a) => a,
            Err(f) => return TradeAnswer::Failed(f),
        };
        let biz = serde_json::json!({ "out_trade_no": out_trade_no });
        let r = match self.call(a, "alipay.trade.query", &biz, now).await {
            Ok(r) => r,
            Err(f) => return TradeAnswer::Failed(f),
        };
        if r.code != "10000" {
            return if r.sub_code.as_deref() == Some("ACQ.TRADE_NOT_EXIST") {
                TradeAnswer::NotFound
            } else {
                TradeAnswer::Failed(r.failure())
            };
        }
        if r.out_trade_no.as_deref() != Some(out_trade_no) {
            return TradeAnswer::Failed(Failure::Unexpected(format!(
                "asked about {out_trade_no}, answered about {:?}",
                r.out_trade_no
            )));
        }
        let status = r.trade_status.clone().unwrap_or_default();
        match status.as_str() {
            // TRADE_CLOSED is also "paid, then refunded in full" (未付款交易超时关闭，或支付完成
            // 后全额退款): the payment happened, as WeChat's REFUND, and the answer shows it.
            "TRADE_SUCCESS" | "TRADE_FINISHED" => match paid_notice(&a.app, r) {
                Ok(notice) => TradeAnswer::Paid(Box::new(notice)),
                Err(f) => TradeAnswer::Failed(f),
            },
            "TRADE_CLOSED" if r.carries_a_payment() => match paid_notice(&a.app, r) {
                Ok(notice) => TradeAnswer::Paid(Box::new(notice)),
                Err(f) => TradeAnswer::Failed(f),
            },
            "TRADE_CLOSED" => TradeAnswer::Closed,
            _ => TradeAnswer::Unpaid(status),
        }
    }

    async fn do_close(&self, app_id: &str, out_trade_no: &str, now: Timestamp) -> CloseAnswer {
        let a = match self.app(app_id) {
            Ok(a) => a,
            Err(f) => return CloseAnswer::Failed(f),
        };
        let biz = serde_json::json!({ "out_trade_no": out_trade_no });
        let r = match self.call(a, "alipay.trade.close", &biz, now).await {
            Ok(r) => r,
            Err(f) => return CloseAnswer::Failed(f),
        };
        match (r.code.as_str(), r.sub_code.as_deref()) {
            // A success carries no time: another order's, replayed, must not count for this one.
            ("10000", _) if r.out_trade_no.as_deref() == Some(out_trade_no) => CloseAnswer::Closed,
            ("10000", _) => CloseAnswer::Failed(Failure::Unexpected(format!(
                "asked to close {out_trade_no}, answered about {:?}",
                r.out_trade_no
            ))),
            (_, Some("ACQ.TRADE_NOT_EXIST")) => CloseAnswer::NotFound,
            // Paid, or closed already: a query tells which.
            (_, Some("ACQ.TRADE_STATUS_ERROR")) => CloseAnswer::NotClosable,
            _ => CloseAnswer::Failed(r.failure()),
        }
    }

    async fn do_refund_query(
        &self,
        app_id: &str,
        out_trade_no: &str,
        out_refund_no: &str,
        now: Timestamp,
    ) -> RefundAnswer {
        let a = match self.app(app_id) {
            Ok(a) => a,
            Err(f) => return RefundAnswer::Failed(f),
        };
        let biz =
            serde_json::json!({ "out_trade_no": out_trade_no, "out_request_no": out_refund_no });
        let r = match self
            .call(a, "alipay.trade.fastpay.refund.query", &biz, now)
            .await
        {
            Ok(r) => r,
            Err(f) => return RefundAnswer::Failed(f),
        };
        if r.code != "10000" {
            return if r.sub_code.as_deref() == Some("ACQ.TRADE_NOT_EXIST") {
                RefundAnswer::NotFound
            } else {
                RefundAnswer::Failed(r.failure())
            };
        }
        if r.out_request_no
            .as_deref()
            .is_some_and(|no| no != out_refund_no)
        {
            return RefundAnswer::Failed(Failure::Unexpected(format!(
                "asked about refund {out_refund_no}, answered about {:?}",
                r.out_request_no
            )));
        }
        // `10000` alone is not a refund: only REFUND_SUCCESS is (an empty answer means
        // Alipay has no such refund request).
        match r.refund_status.as_deref() {
            Some("REFUND_SUCCESS") => RefundAnswer::Refunded(None),
            Some(other) => RefundAnswer::NotRefunded(other.to_owned()),
            None => RefundAnswer::NotFound,
        }
    }
}

/// The exact bytes of `response_key`'s value in `body`, once `sign` verifies over them with
/// the app's Alipay public key. An answer without `sign` (Alipay's answer to an unknown
/// app) is never evidence.
fn signed_response<'b>(
    key: &RsaVerifier,
    body: &'b [u8],
    response_key: &str,
) -> Result<&'b str, Failure> {
    use serde_json::value::RawValue;
    // Every top-level value as its exact bytes: the signature covers them, not a re-encoding.
    let mut envelope: HashMap<&'b str, &'b RawValue> = serde_json::from_slice(body)
        .map_err(|e| Failure::Unexpected(format!("answer is not Alipay's JSON: {e}")))?;
    let sign: Option<String> = match envelope.remove("sign") {
        Some(raw) => Some(
            serde_json::from_str(raw.get())
                .map_err(|e| Failure::BadSignature(format!("sign is not a string: {e}")))?,
        ),
        None => None,
    };
    let Some(value) = envelope.get(response_key) else {
        let mut keys: Vec<&&str> = envelope.keys().collect();
        keys.sort();
        return Err(match sign {
            Some(_) => Failure::Unexpected(format!("no {response_key} in the answer ({keys:?})")),
            None => Failure::BadSignature(format!("an unsigned answer ({keys:?})")),
        });
    };
    let sign = sign
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Failure::BadSignature(format!("{response_key} is not signed")))?;
    let signature = BASE64
        .decode(sign)
        .map_err(|_| Failure::BadSignature("sign is not base64".into()))?;
    if !key.verify(value.get().as_bytes(), &signature) {
        return Err(Failure::BadSignature(format!(
            "the sign of {response_key} does not verify with the Alipay public key"
        )));
    }
    Ok(value.get())
}

/// A paid trade's notice from what the signed answer says. `alipay.trade.query` answers name
/// neither seller nor app: the seller is the asking app's (Alipay answers an app only about
/// its own seller's trades, and the answer verified with that app's Alipay key), checked
/// against the answer's `seller_id` when it carries one; the app is the one that asked, which
/// need not be the app the buyer paid through, so it is not part of an Alipay payment's
/// content ([`Notice::digest`]) and the notification is a duplicate either way.
fn paid_notice(app: &App, r: ApiResponse) -> Result<Notice, Failure> {
    let bad = |m: String| Failure::Unexpected(m);
    let trade_no = r
        .trade_no
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("a paid answer without trade_no".into()))?;
    let total = r
        .total_amount
        .as_deref()
        .ok_or_else(|| bad("a paid answer without total_amount".into()))
        .and_then(|t| yuan_to_fen(t).map_err(|e| bad(format!("total_amount: {e}"))))?;
    if total <= 0 {
        return Err(bad("total_amount must be positive".into()));
    }
    let occurred_at = r.send_pay_date.as_deref().and_then(|text| {
        let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").ok()?;
        let at = FixedOffset::east_opt(8 * 3600)?
            .from_local_datetime(&naive)
            .single()?;
        Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
    });
    let seller_id = r
        .seller_id
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| app.seller_id.clone());
    let notice = Notice {
        channel: ChannelId::Alipay,
        kind: NoticeKind::Paid,
        merchant_matches: seller_id == app.seller_id,
        merchant: MerchantIds {
            merchant_id: seller_id,
            app_id: Some(app.app_id.clone()),
        },
        out_trade_no: r.out_trade_no.unwrap_or_default(),
        transaction_id: trade_no,
        amount_fen: total,
        currency: "CNY".to_owned(),
        occurred_at,
    };
    notice.checked().map_err(bad)
}

impl ProviderApi for AlipayApi {
    fn channel(&self) -> ChannelId {
        ChannelId::Alipay
    }

    fn accounts(&self) -> Vec<String> {
        self.apps.iter().map(|a| a.app.app_id.clone()).collect()
    }

    fn query<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, TradeAnswer> {
        Box::pin(self.do_query(account, out_trade_no, now))
    }

    fn close<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CloseAnswer> {
        Box::pin(self.do_close(account, out_trade_no, now))
    }

    fn refund_query<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        out_refund_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, RefundAnswer> {
        Box::pin(self.do_refund_query(account, out_trade_no, out_refund_no, now))
    }
}

/// Loads the apps' keys (once, at start-up) and mounts the notify route.
pub fn mount(
    settings: &AlipaySettings,
    client: &ClientSettings,
    now: Timestamp,
) -> Result<Mounted, ConfigError> {
    let built = Arc::new(Alipay::from_settings(settings, now)?);
    let provider: Arc<dyn Provider> = built.clone();
    let api = AlipayApi::from_settings(&built, settings, client)?
        .map(|api| Arc::new(api) as Arc<dyn ProviderApi>);
    let channel = web::Data::from(built);
    let mount: super::Mount = Box::new(move |cfg: &mut web::ServiceConfig| {
        cfg.service(
            web::resource("/notify/alipay")
                .app_data(channel.clone())
                .route(web::post().to(alipay)),
        );
    });
    Ok(Mounted {
        mount,
        provider,
        api,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    use rsa::{Generate, PrivateKey};

    const KEY: &str = "alipay_trade_query_response";

    fn key_pair() -> (PrivateKey, RsaVerifier) {
        let key = PrivateKey::try_generate().expect("key");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("alipay.pem");
        let pem = key
            .to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem");
        std::fs::write(&path, pem).expect("write");
        let verifier = keys::public_key_file("test", &path).expect("public key");
        (key, verifier)
    }

    #[test]
    fn an_answer_is_verified_over_the_exact_bytes_of_its_response_value() {
        let (key, verifier) = key_pair();
        // Alipay's own spacing and escapes: re-serialising the parsed value changes them.
        let value =
            "{\"code\": \"10000\",\"msg\":\"Success\",\"subject\":\"\\u6c99\\u7bb1 a\\/b\"}";
        let sign = crate::qa::forge::rsa_sign(&key, value.as_bytes()).expect("sign");
        let body = format!("{{\"{KEY}\":{value},\"sign\":\"{sign}\"}}");
        assert_eq!(signed_response(&verifier, body.as_bytes(), KEY), Ok(value));

        let parsed: serde_json::Value = serde_json::from_str(value).expect("json");
        let reserialised = format!("{{\"{KEY}\":{parsed},\"sign\":\"{sign}\"}}");
        assert!(matches!(
            signed_response(&verifier, reserialised.as_bytes(), KEY),
            Err(Failure::BadSignature(_))
        ));
        let unsigned = format!("{{\"{KEY}\":{value}}}");
        assert!(matches!(
            signed_response(&verifier, unsigned.as_bytes(), KEY),
            Err(Failure::BadSignature(_))
        ));
        // Alipay's answer to an unknown app_id: unsigned, never evidence.
        let unknown_app =
            "{\"error_response\":{\"code\":\"40002\",\"sub_code\":\"isv.invalid-app-id\"}}";
        assert!(matches!(
            signed_response(&verifier, unknown_app.as_bytes(), KEY),
            Err(Failure::BadSignature(_))
        ));
    }

    #[test]
    fn request_timestamps_are_beijing_time() {
        let at = chrono::Utc
            .with_ymd_and_hms(2026, 11, 30, 16, 30, 5)
            .single()
            .expect("time");
        assert_eq!(beijing(Timestamp::new(at)), "2026-12-01 00:30:05");
    }
}
