//! WeChat Pay API v3 notifications (`/notify/wechat/pay`, `/notify/wechat/refund`).
//!
//! WeChat Pay v3: the signed message is `"{Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{body}\n"`
//! over the raw body bytes, RSASSA-PKCS1-v1_5 with SHA-256, base64; `Wechatpay-Serial` names
//! the platform key (a `PUB_KEY_ID_…` public key or a platform certificate serial) and so the
//! merchant. `resource` is AES-256-GCM with the merchant's APIv3 key, `resource.nonce` and
//! `resource.associated_data` as AAD, ciphertext‖tag in base64.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::web;
use ring::aead::{AES_256_GCM, LessSafeKey, UnboundKey};

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

mod api;
mod explain;
pub mod settings;
mod verify;
mod wire;

pub use api::{API_BASE, WechatApi};
pub use settings::{PlatformKey, WechatMerchant, WechatSettings};

/// WeChat Pay's freshness rule: more than five minutes either way is refused.
pub const TIMESTAMP_WINDOW_SECS: i64 = 300;
/// The only signature type this build verifies (absent means this one).
pub const SIGNATURE_TYPE: &str = "WECHATPAY2-SHA256-RSA2048";
/// Signatures WeChat sends on purpose to check that merchants verify them.
const PROBE_PREFIX: &str = "WECHATPAY/SIGNTEST/";
/// The notify route of payments (`TRANSACTION.*`).
pub const PAY_ROUTE: &str = "/notify/wechat/pay";
/// The notify route of refunds (`REFUND.*`).
pub const REFUND_ROUTE: &str = "/notify/wechat/refund";

/// A configured merchant: its ids and its APIv3 decryption key.
pub struct Merchant {
    pub mchid: String,
    /// Every app bound to this mchid; a payment from any of them is ours.
    pub appids: Vec<String>,
    apiv3_key: LessSafeKey,
}

impl std::fmt::Debug for Merchant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merchant")
            .field("mchid", &self.mchid)
            .field("appids", &self.appids)
            .finish_non_exhaustive()
    }
}

/// One platform key and the merchant it belongs to.
struct PlatformVerifier {
    key: RsaVerifier,
    merchant: Arc<Merchant>,
}

/// The WeChat Pay channel: every configured merchant, keyed by platform-key serial.
pub struct WechatPay {
    keys: HashMap<String, PlatformVerifier>,
}

impl std::fmt::Debug for WechatPay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut serials: Vec<_> = self.keys.keys().collect();
        serials.sort();
        f.debug_struct("WechatPay")
            .field("serials", &serials)
            .finish()
    }
}

/// What verification hands to decoding: the merchant and the decrypted resource.
#[derive(Debug)]
pub struct Verified {
    merchant: Arc<Merchant>,
    event_type: String,
    plaintext: Vec<u8>,
}

impl Verified {
    /// The decrypted `resource`, exactly as WeChat encrypted it.
    pub fn plaintext(&self) -> &[u8] {
        &self.plaintext
    }
}

impl WechatPay {
    /// Loads every merchant's keys once, at start-up. `now` decides certificate expiry.
    pub fn from_settings(settings: &WechatSettings, now: Timestamp) -> Result<Self, ConfigError> {
        let mut keys = HashMap::new();
        for (i, m) in settings.merchants.iter().enumerate() {
            let prefix = format!("wechat.merchants[{i}]");
            let apiv3_key = UnboundKey::new(&AES_256_GCM, m.apiv3_key.expose().as_bytes())
                .map_err(|_| invalid(format!("{prefix}.apiv3_key"), "must be exactly 32 bytes"))?;
            let appids = m.all_appids();
            if appids.iter().all(|id| id.is_empty()) {
                return Err(invalid(
                    format!("{prefix}.appid"),
                    "set appid or appids: the apps bound to this mchid",
                ));
            }
            let merchant = Arc::new(Merchant {
                mchid: m.mchid.clone(),
                appids,
                apiv3_key: LessSafeKey::new(apiv3_key),
            });
            if m.platform_keys.is_empty() {
                return Err(invalid(
                    format!("{prefix}.platform_keys"),
                    "at least one key is needed",
                ));
            }
            for (j, k) in m.platform_keys.iter().enumerate() {
                let key_name = format!("{prefix}.platform_keys[{j}]");
                let (serial, key) = match (&k.public_key_file, &k.certificate_file) {
                    (Some(path), None) => {
                        let serial = k.serial.clone().ok_or_else(|| {
                            invalid(
                                format!("{key_name}.serial"),
                                "required with public_key_file",
                            )
                        })?;
                        (
                            serial,
                            keys::public_key_file(&format!("{key_name}.public_key_file"), path)?,
                        )
                    }
                    (None, Some(path)) => {
                        let name = format!("{key_name}.certificate_file");
                        let (serial, key) = keys::certificate_file(&name, path, now)?;
                        if let Some(given) = &k.serial
                            && !given.eq_ignore_ascii_case(&serial)
                        {
                            return Err(invalid(
                                format!("{key_name}.serial"),
                                format!("{given} differs from the certificate's serial {serial}"),
                            ));
                        }
                        (serial, key)
                    }
                    _ => {
                        return Err(invalid(
                            key_name,
                            "set exactly one of public_key_file and certificate_file",
                        ));
                    }
                };
                let entry = PlatformVerifier {
                    key,
                    merchant: Arc::clone(&merchant),
                };
                if keys.insert(serial.to_ascii_uppercase(), entry).is_some() {
                    return Err(invalid(
                        format!("{key_name}.serial"),
                        format!("{serial} is configured twice"),
                    ));
                }
            }
        }
        Ok(Self { keys })
    }
}

#[cfg(feature = "fuzzing")]
impl WechatPay {
    /// Fuzzing only (the `fuzzing` feature, never in the service): [`Channel::admit`]'s
    /// steps after the signature check, for a body as if signed with the key `serial`.
    pub fn admit_signed_body(&self, serial: &str, body: &[u8]) -> Result<Notice, Rejection> {
        let platform = self
            .keys
            .get(&serial.to_ascii_uppercase())
            .ok_or_else(|| Rejection::BadSignature(format!("unknown Wechatpay-Serial {serial}")))?;
        self.open(&platform.merchant, serial, body, None, &mut super::Halt)
            .and_then(|v| self.decode(v))
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
    }
}

/// WeChat's failure body; success is `204 No Content`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct WechatFail {
    /// Always `FAIL`.
    pub code: String,
    pub message: String,
}

crate::routes::notify::notify_handler!(
    #[utoipa::path(post, path = "/notify/wechat/pay", tag = "notify",
    description = "WeChat Pay API v3 payment result (TRANSACTION.SUCCESS). Authenticated by the Wechatpay-* signature headers over the raw body.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, or recorded anomaly (including a second payment under the same key)"),
        (status = 400, description = "Missing header, malformed body or field, unsupported signature type; a signed REFUND.* event (wrong_event_type: refunds go to /notify/wechat/refund)", body = WechatFail),
        (status = 401, description = "Bad or missing signature, unknown serial, probe, stale timestamp", body = WechatFail),
        (status = 404, description = "Unknown order (WeChat retries)", body = WechatFail),
        (status = 409, description = "The same payment or refund as before (same transaction id or refund key) with other amount, currency or merchant", body = WechatFail),
        (status = 413, description = "Body larger than server.max_body_bytes", body = WechatFail),
        (status = 500, description = "Signature valid, resource does not decrypt (our apiv3_key is wrong)", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
    wechat_pay,
    WechatPay
);

crate::routes::notify::notify_handler!(
    #[utoipa::path(post, path = "/notify/wechat/refund", tag = "notify",
    description = "WeChat Pay API v3 refund result (REFUND.SUCCESS, REFUND.ABNORMAL, REFUND.CLOSED); answers as /notify/wechat/pay.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, recorded anomaly, or acknowledged without change"),
        (status = 400, description = "Bad request; a signed TRANSACTION.* event (wrong_event_type: payments go to /notify/wechat/pay)", body = WechatFail),
        (status = 401, description = "Bad signature or stale", body = WechatFail),
        (status = 404, description = "Unknown order, or its payment not in yet", body = WechatFail),
        (status = 409, description = "The same payment or refund as before (same transaction id or refund key) with other amount, currency or merchant", body = WechatFail),
        (status = 413, description = "Body too large", body = WechatFail),
        (status = 500, description = "Resource does not decrypt", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
    wechat_refund,
    WechatPay
);

/// The OpenAPI description of the notify routes.
#[derive(OpenApi)]
#[openapi(paths(wechat_pay, wechat_refund), components(schemas(WechatFail)))]
pub struct NotifyApi;

/// Loads the merchants' keys (once, at start-up), mounts the notify routes and builds the
/// API client of the merchants with API credentials.
pub fn mount(
    settings: &WechatSettings,
    reconcile: &ClientSettings,
    now: Timestamp,
) -> Result<Mounted, ConfigError> {
    let built = Arc::new(WechatPay::from_settings(settings, now)?);
    let provider: Arc<dyn Provider> = built.clone();
    let api = WechatApi::from_settings(Arc::clone(&built), settings, reconcile)?
        .map(|api| Arc::new(api) as Arc<dyn ProviderApi>);
    let channel = web::Data::from(built);
    let mount: super::Mount = Box::new(move |cfg: &mut web::ServiceConfig| {
        cfg.service(
            web::resource(PAY_ROUTE)
                .app_data(channel.clone())
                .route(web::post().to(wechat_pay)),
        )
        .service(
            web::resource(REFUND_ROUTE)
                .app_data(channel.clone())
                .route(web::post().to(wechat_refund)),
        );
    });
    Ok(Mounted {
        mount,
        provider,
        api,
    })
}
