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
use utoipa::OpenApi;

use super::api::ProviderApi;
use super::keys::{self, RsaVerifier};
#[cfg(feature = "fuzzing")]
use super::{Channel, Rejection};
use super::{Mounted, Provider};
use crate::config::value::{ConfigError, invalid};
use crate::https::ClientSettings;
#[cfg(feature = "fuzzing")]
use crate::notice::Notice;
use crate::time::Timestamp;
#[cfg(feature = "fuzzing")]
use wire::{Form, read_fields};

mod api;
pub mod bill;
pub mod cert_sn;
mod explain;
pub mod settings;
mod verify;
mod wire;

pub use api::{AlipayApi, CertSn, GATEWAY};
pub use settings::{AlipayApp, AlipaySettings};
pub use wire::string_to_sign;

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

/// Loads the apps' keys (once, at start-up) and mounts the notify route; with API
/// credentials, the API client asks about trades and fetches the daily bills.
pub fn mount(
    settings: &AlipaySettings,
    client: &ClientSettings,
    now: Timestamp,
) -> Result<Mounted, ConfigError> {
    let built = Arc::new(Alipay::from_settings(settings, now)?);
    let provider: Arc<dyn Provider> = built.clone();
    let client = AlipayApi::from_settings(&built, settings, client, now)?.map(Arc::new);
    let api = client.clone().map(|c| c as Arc<dyn ProviderApi>);
    let bills = client.map(|c| c as Arc<dyn super::bill::BillSource>);
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
        keys: None,
        bills,
    })
}

#[cfg(test)]
mod tests {
    use super::api::{beijing, signed_response};
    use super::*;
    use crate::channel::api::Failure;
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
