//! The OpenAPI client: trade query, close, refund and refund query, each answer verified;
//! the transfer calls are in `transfer.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{FixedOffset, NaiveDateTime, TimeZone};
use serde::Deserialize;

use super::{Alipay, AlipayApp, AlipaySettings, App, cert_sn};
use crate::channel::api::{Account, Accounts, Failure, Miss};
use crate::channel::keys::{self, RsaVerifier};
use crate::config::value::{ConfigError, invalid};
use crate::https::ClientSettings;
use crate::money::yuan_to_fen;
use crate::time::Timestamp;

/// Alipay's production OpenAPI gateway.
pub const GATEWAY: &str = "https://openapi.alipay.com/gateway.do";

/// One app's API credentials. An authorized app's entry (第三方应用代调用) holds its ISV app's:
/// the ISV's app signs and its Alipay key verifies, and every call carries the merchant's
/// `app_auth_token`.
pub struct ApiApp {
    /// The app whose keys these are: an authorized app's ISV app.
    pub(super) app: Arc<App>,
    pub(super) key: Arc<keys::Signer>,
    pub(super) gateway: String,
    /// Certificate mode: what every request carries besides the common parameters.
    pub(super) cert_sn: Option<CertSn>,
    /// An authorized app's entry: the merchant the calls are made for.
    pub(super) authorized: Option<Authorized>,
}

/// The merchant an ISV's app calls for: its `auth_app_id`, the token it granted and its PID.
pub(super) struct Authorized {
    pub(super) auth_app_id: String,
    pub(super) app_auth_token: String,
    /// The merchant's PID, when configured: a paid answer naming another seller is not ours.
    pub(super) seller_id: Option<String>,
}

impl ApiApp {
    /// The entry of the app `authorized`, served by this ISV app's credentials.
    pub(super) fn for_authorized(&self, authorized: Authorized) -> Self {
        Self {
            app: Arc::clone(&self.app),
            key: Arc::clone(&self.key),
            gateway: self.gateway.clone(),
            cert_sn: self.cert_sn.clone(),
            authorized: Some(authorized),
        }
    }
}

/// Alipay's signed refusals of an ISV call for a merchant: the token is not (or no longer)
/// valid, or does not cover the API. Never an answer about the trade.
const TOKEN_REFUSALS: [&str; 3] = [
    "aop.invalid-app-auth-token",
    "aop.app-auth-token-time-out",
    "aop.invalid-app-auth-token-no-api",
];

/// Merchant transfers and bills are a direct app's calls: an authorized app's entry has none.
pub(super) fn not_for_authorized(a: &ApiApp) -> Result<(), Failure> {
    match &a.authorized {
        Some(auth) => Err(Failure::Unexpected(format!(
            "transfers and bills are not available for an authorized app ({})",
            auth.auth_app_id
        ))),
        None => Ok(()),
    }
}

/// Certificate mode (公钥证书): Alipay's gateway refuses a request of such an app without
/// these two parameters, both part of the signed content. Computed once, at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSn {
    /// `app_cert_sn`: the SN of `appCertPublicKey_<app_id>.crt`.
    pub app: String,
    /// `alipay_root_cert_sn`: the SNs of `alipayRootCert.crt`'s RSA certificates.
    pub root: String,
}

impl CertSn {
    /// From an app's settings: `None` in public-key mode or without API credentials. The
    /// two files are required together with `app_private_key_file` in certificate mode and
    /// refused anywhere else, so a file set by mistake is never silently unused.
    pub fn from_settings(
        prefix: &str,
        a: &AlipayApp,
        now: Timestamp,
    ) -> Result<Option<Self>, ConfigError> {
        let files = [
            ("app_cert_file", &a.app_cert_file),
            ("alipay_root_cert_file", &a.alipay_root_cert_file),
        ];
        let certificate_mode = a.alipay_cert_file.is_some();
        let api = a.app_private_key_file.is_some();
        for (name, file) in files {
            match (file, certificate_mode, api) {
                (None, true, true) => {
                    return Err(invalid(
                        format!("{prefix}.{name}"),
                        "required in certificate mode (alipay_cert_file) with app_private_key_file: Alipay refuses API calls without its SN",
                    ));
                }
                (Some(_), false, _) => {
                    return Err(invalid(
                        format!("{prefix}.{name}"),
                        "only for certificate mode (alipay_cert_file), not with alipay_public_key_file",
                    ));
                }
                (Some(_), true, false) => {
                    return Err(invalid(
                        format!("{prefix}.{name}"),
                        "only used with app_private_key_file (API calls)",
                    ));
                }
                _ => {}
            }
        }
        let (Some(app_path), Some(root_path)) = (&a.app_cert_file, &a.alipay_root_cert_file) else {
            return Ok(None);
        };
        let app_key = format!("{prefix}.app_cert_file");
        let app_certs = keys::certificates_file(&app_key, app_path)?;
        let [app_cert] = app_certs.as_slice() else {
            return Err(invalid(
                app_key,
                format!(
                    "{}: {} certificates; the app certificate file holds one",
                    app_path.display(),
                    app_certs.len()
                ),
            ));
        };
        keys::not_expired(&app_key, app_path, app_cert, now)?;
        let root_key = format!("{prefix}.alipay_root_cert_file");
        let root = cert_sn::alipay_root_cert_sn(&keys::certificates_file(&root_key, root_path)?);
        // alipay-sdk-java-all refuses an empty one too ("AlipayRootCert Is Invalid").
        if root.is_empty() {
            return Err(invalid(
                root_key,
                format!(
                    "{}: no RSA certificate in it; is it alipayRootCert.crt?",
                    root_path.display()
                ),
            ));
        }
        Ok(Some(Self {
            app: cert_sn::alipay_cert_sn(app_cert),
            root,
        }))
    }
}

impl Account for ApiApp {
    fn id(&self) -> &str {
        match &self.authorized {
            Some(auth) => &auth.auth_app_id,
            None => &self.app.app_id,
        }
    }
    const MISSING: &'static str = "app private key for app";
}

/// The Alipay OpenAPI client (`alipay.trade.query`, `alipay.trade.close`,
/// `alipay.trade.refund`, `alipay.trade.fastpay.refund.query`, the bill's download URL:
/// `bill/fetch.rs`, the transfer and its query: `transfer.rs`) for every app with an app
/// private key. Requests are
/// signed RSA2 with it; answers are verified over the exact bytes of their `…_response` value
/// with the app's Alipay public key, the one notifications are verified with.
pub struct AlipayApi {
    pub(super) apps: Accounts<ApiApp>,
    /// The `app_auth_token` of every enabled authorized app, by `auth_app_id`, whether or not
    /// its ISV app can be asked now: its entry is built from it when the ISV app can.
    tokens: std::sync::RwLock<HashMap<String, String>>,
    /// `alipay.bill_hosts`: where a bill may be downloaded from.
    pub(super) bill_hosts: Vec<String>,
}

/// The fields of a `…_response` value this client reads.
#[derive(Deserialize)]
pub(super) struct ApiResponse {
    pub(super) code: String,
    #[serde(default)]
    pub(super) msg: String,
    pub(super) sub_code: Option<String>,
    pub(super) sub_msg: Option<String>,
    pub(super) out_trade_no: Option<String>,
    pub(super) trade_no: Option<String>,
    pub(super) trade_status: Option<String>,
    pub(super) total_amount: Option<String>,
    /// What the buyer paid; `0.00` (or absent) while nothing was paid.
    pub(super) buyer_pay_amount: Option<String>,
    pub(super) send_pay_date: Option<String>,
    pub(super) refund_status: Option<String>,
    pub(super) out_request_no: Option<String>,
    /// Not in the documented query answer; checked when an answer carries it.
    pub(super) seller_id: Option<String>,
    /// `alipay.data.dataservice.bill.downloadurl.query`: where the day's bill zip is.
    pub(super) bill_download_url: Option<String>,
    /// `alipay.trade.refund`: `Y` when money moved with this call; `N` when it was refunded
    /// before under the same `out_request_no`, or not yet.
    pub(super) fund_change: Option<String>,
    /// `alipay.trade.refund`: the trade's refunded total so far (yuan), as a refund
    /// notification's `refund_fee`.
    pub(super) refund_fee: Option<String>,
    /// `alipay.trade.refund`: when the refund was paid out (Beijing time).
    pub(super) gmt_refund_pay: Option<String>,
}

impl ApiResponse {
    /// Whether a query answer shows money paid: `send_pay_date` (when the buyer paid) or a
    /// `buyer_pay_amount` above zero. A trade closed unpaid has neither. An amount that does
    /// not parse counts as a payment, so the paid path refuses the answer instead of it
    /// closing the order.
    pub(super) fn carries_a_payment(&self) -> bool {
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
    pub(super) fn retry_later(&self) -> bool {
        self.code == "20000" || self.sub_code.as_deref() == Some("ACQ.SYSTEM_ERROR")
    }

    /// A `10000` answer; `ACQ.TRADE_NOT_EXIST` is [`Miss::NotFound`], any other its failure.
    pub(super) fn found(self) -> Result<Self, Miss> {
        if self.code == "10000" {
            Ok(self)
        } else if self.sub_code.as_deref() == Some("ACQ.TRADE_NOT_EXIST") {
            Err(Miss::NotFound)
        } else {
            Err(self.failure().into())
        }
    }

    pub(super) fn failure(&self) -> Failure {
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

/// An answer's time, Beijing `yyyy-MM-dd HH:mm:ss` (perhaps with fractions of a second).
pub(super) fn beijing_time(text: &str) -> Option<Timestamp> {
    let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").ok()?;
    let at = FixedOffset::east_opt(8 * 3600)?
        .from_local_datetime(&naive)
        .single()?;
    Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
}

/// Alipay's times: Beijing, `yyyy-MM-dd HH:mm:ss`.
pub(super) fn beijing(at: Timestamp) -> String {
    (at.as_datetime().naive_utc() + chrono::Duration::hours(8))
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

impl AlipayApi {
    /// The client of the file's apps with an app private key (apps added through
    /// `/admin/merchants` join it later).
    pub(super) fn from_settings(
        channel: &Alipay,
        settings: &AlipaySettings,
        client: &ClientSettings,
        now: Timestamp,
    ) -> Result<Self, ConfigError> {
        let mut apps = Vec::new();
        for (i, a) in settings.apps.iter().enumerate() {
            let prefix = format!("alipay.apps[{i}]");
            let cert_sn = CertSn::from_settings(&prefix, a, now)?;
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
            crate::https::provider_url(&format!("{prefix}.gateway"), &gateway)?;
            let Some(app) = channel.app(&a.app_id) else {
                return Err(invalid(format!("{prefix}.app_id"), "not loaded"));
            };
            apps.push(ApiApp {
                app,
                key: Arc::new(keys::Signer::parsed(key)),
                gateway,
                cert_sn,
                authorized: None,
            });
        }
        Ok(Self {
            apps: Accounts::new(apps, client)?,
            tokens: std::sync::RwLock::default(),
            bill_hosts: settings.bill_hosts.clone(),
        })
    }

    /// The token authorized app `auth_app_id` granted, while it is enabled.
    pub(super) fn token(&self, auth_app_id: &str) -> Option<String> {
        self.tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(auth_app_id)
            .cloned()
    }

    /// Keeps the tokens `put` and forgets those of `gone`.
    pub(super) fn change_tokens(&self, put: HashMap<String, String>, gone: &[&String]) {
        let mut tokens = self
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in gone {
            tokens.remove(*id);
        }
        tokens.extend(put);
    }

    /// Calls `method` and returns its verified `…_response` value, read as a trade call's
    /// answer.
    pub(super) async fn call(
        &self,
        a: &ApiApp,
        method: &str,
        biz_content: &serde_json::Value,
        now: Timestamp,
    ) -> Result<ApiResponse, Failure> {
        self.call_as(a, method, biz_content, now).await
    }

    /// Calls `method` and returns its verified `…_response` value, read as `T`. Alipay: sign
    /// every non-empty parameter but `sign`, sorted by key, `k=v` joined with `&`, raw values.
    pub(super) async fn call_as<T: serde::de::DeserializeOwned>(
        &self,
        a: &ApiApp,
        method: &str,
        biz_content: &serde_json::Value,
        now: Timestamp,
    ) -> Result<T, Failure> {
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
        if let Some(sn) = &a.cert_sn {
            params.push(("app_cert_sn", sn.app.clone()));
            params.push(("alipay_root_cert_sn", sn.root.clone()));
        }
        if let Some(auth) = &a.authorized {
            // A common parameter beside app_id, signed like every other (python-alipay-sdk
            // `ISVAliPay.build_body`, jeepay `putApiIsvInfo`).
            params.push(("app_auth_token", auth.app_auth_token.clone()));
        }
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
        let plumbing = self.apps.plumbing();
        let request = plumbing
            .client()
            .post(&a.gateway)
            .header(
                "Content-Type",
                "application/x-www-form-urlencoded;charset=utf-8",
            )
            .body(body);
        let r = plumbing.send(request).await?;
        if r.status == 429 || r.status >= 500 {
            return Err(Failure::Unreachable(format!("HTTP {}", r.status)));
        }
        if !(200..300).contains(&r.status) {
            return Err(Failure::Unexpected(format!("HTTP {}", r.status)));
        }
        let response_key = format!("{}_response", method.replace('.', "_"));
        let value = signed_response(&a.app.key, &r.body, &response_key)?;
        if let Some(auth) = &a.authorized {
            token_refusal(auth, value)?;
        }
        serde_json::from_str(value).map_err(|e| Failure::Unexpected(format!("{response_key}: {e}")))
    }
}

/// An authorized app's call refused for its token, as Alipay signs it (`20001`
/// `aop.invalid-app-auth-token`, …): [`Failure::Unexpected`] naming the refusal.
pub(super) fn token_refusal(auth: &Authorized, value: &str) -> Result<(), Failure> {
    #[derive(Deserialize)]
    struct Codes {
        #[serde(default)]
        code: String,
        sub_code: Option<String>,
        sub_msg: Option<String>,
    }
    let Ok(codes) = serde_json::from_str::<Codes>(value) else {
        return Ok(());
    };
    match codes.sub_code.as_deref() {
        Some(sub) if TOKEN_REFUSALS.contains(&sub) => Err(Failure::Unexpected(format!(
            "code {} {sub} {}: the app_auth_token of authorized app {} was refused",
            codes.code,
            codes.sub_msg.as_deref().unwrap_or(""),
            auth.auth_app_id
        ))),
        _ => Ok(()),
    }
}

/// The exact bytes of `response_key`'s value in `body`, once `sign` verifies over them with
/// the app's Alipay public key. An answer without `sign` (Alipay's answer to an unknown
/// app) is never evidence.
pub(super) fn signed_response<'b>(
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
