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

use super::keys::{self, RsaVerifier};
use super::{Answer, Channel, Inbound, Mount, Rejection, Reply};
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

        // Verified: now read the values as text, in the charset Alipay signed.
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

/// Loads the apps' keys (once, at start-up) and mounts the notify route.
pub fn mount(settings: &AlipaySettings, now: Timestamp) -> Result<Mount, ConfigError> {
    let channel = web::Data::new(Alipay::from_settings(settings, now)?);
    Ok(Box::new(move |cfg: &mut web::ServiceConfig| {
        cfg.service(
            web::resource("/notify/alipay")
                .app_data(channel.clone())
                .route(web::post().to(alipay)),
        );
    }))
}
