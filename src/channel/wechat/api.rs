//! The API v3 client: query, close, refund and refund query, each answer verified (merchant
//! transfers are in `transfer.rs`).

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;

use super::verify::string_to_sign;
use super::wire::WechatRefundAmount;
use super::{Merchant, SIGNATURE_TYPE, TIMESTAMP_WINDOW_SECS, WechatPay, WechatSettings};
use crate::channel::api::{Account, Accounts, Failure, Miss, Received};
use crate::channel::keys;
use crate::config::value::{ConfigError, invalid};
use crate::https::ClientSettings;
use crate::time::Timestamp;

/// WeChat Pay API v3's production base URL.
pub const API_BASE: &str = "https://api.mch.weixin.qq.com";

/// One merchant's API credentials: its API private key and that key's certificate serial.
/// A sub-merchant's entry holds its service provider's (服务商模式): the SP signs and its
/// platform keys verify, and every call takes the partner form naming `sub_mchid`.
pub struct ApiMerchant {
    /// The merchant whose keys these are: a sub-merchant's service provider.
    pub(super) merchant: Arc<Merchant>,
    pub(super) serial: String,
    pub(super) key: Arc<keys::Signer>,
    pub(super) base: String,
    /// `certificates = "download"`: its platform certificates are fetched and kept fresh.
    pub(super) downloads: bool,
    /// A sub-merchant's entry: its `sub_mchid`, the id the calls are made for.
    pub(super) sub_mchid: Option<String>,
}

impl ApiMerchant {
    /// The entry of `sub_mchid`, served by this service provider's credentials.
    pub(super) fn for_sub(&self, sub_mchid: &str) -> Self {
        Self {
            merchant: Arc::clone(&self.merchant),
            serial: self.serial.clone(),
            key: Arc::clone(&self.key),
            base: self.base.clone(),
            downloads: false,
            sub_mchid: Some(sub_mchid.to_owned()),
        }
    }
}

impl Account for ApiMerchant {
    fn id(&self) -> &str {
        self.sub_mchid.as_deref().unwrap_or(&self.merchant.mchid)
    }
    const MISSING: &'static str = "API credentials for mchid";
}

/// The WeChat Pay API v3 client: query by `out_trade_no`, close, refund, refund query, for
/// every merchant with API credentials. Requests are signed with the merchant's API private
/// key; answers are verified with that merchant's platform keys, as notifications are.
pub struct WechatApi {
    pub(super) channel: Arc<WechatPay>,
    pub(super) merchants: Accounts<ApiMerchant>,
}

/// A transaction as the query answers it: `transaction_id` and `amount` only once paid. A
/// direct merchant's names `appid` and `mchid`; a partner transaction (服务商模式) names
/// `sp_appid`, `sp_mchid`, `sub_mchid` and perhaps `sub_appid` instead.
#[derive(Deserialize)]
pub(super) struct QueriedTransaction {
    #[serde(default)]
    pub(super) appid: Option<String>,
    #[serde(default)]
    pub(super) mchid: Option<String>,
    #[serde(default)]
    pub(super) sp_appid: Option<String>,
    #[serde(default)]
    pub(super) sp_mchid: Option<String>,
    #[serde(default)]
    pub(super) sub_appid: Option<String>,
    #[serde(default)]
    pub(super) sub_mchid: Option<String>,
    pub(super) out_trade_no: String,
    pub(super) transaction_id: Option<String>,
    pub(super) trade_state: String,
    pub(super) amount: Option<QueriedAmount>,
    pub(super) success_time: Option<String>,
}

/// An unpaid trade's `amount` may carry only `payer_currency`.
#[derive(Deserialize)]
pub(super) struct QueriedAmount {
    pub(super) total: Option<i64>,
    pub(super) currency: Option<String>,
}

/// A refund as the refund query answers it (no `mchid`: the asking merchant's).
#[derive(Deserialize)]
pub(super) struct QueriedRefund {
    pub(super) refund_id: String,
    pub(super) out_refund_no: String,
    pub(super) transaction_id: String,
    pub(super) out_trade_no: String,
    pub(super) status: String,
    pub(super) amount: WechatRefundAmount,
    pub(super) success_time: Option<String>,
}

/// WeChat Pay's error body (4xx/5xx): never signed, so only its documented codes count.
#[derive(Deserialize)]
pub(super) struct ApiError {
    pub(super) code: String,
    #[serde(default)]
    pub(super) message: String,
}

/// `/`-free path segment: `out_trade_no` allows `|` and `*`.
pub(super) const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'*');

impl WechatApi {
    /// The client of the file's merchants with API credentials (merchants added through
    /// `/admin/merchants` join it later).
    pub(super) fn from_settings(
        channel: Arc<WechatPay>,
        settings: &WechatSettings,
        reconcile: &ClientSettings,
    ) -> Result<Self, ConfigError> {
        let mut merchants = Vec::new();
        for (i, m) in settings.merchants.iter().enumerate() {
            let prefix = format!("wechat.merchants[{i}]");
            let (path, serial) = match (&m.private_key_file, &m.merchant_serial) {
                (None, None) => continue,
                (Some(path), Some(serial)) if !serial.is_empty() => (path, serial),
                (Some(_), _) => {
                    return Err(invalid(
                        format!("{prefix}.merchant_serial"),
                        "required with private_key_file: the serial of the merchant API certificate",
                    ));
                }
                (None, Some(_)) => {
                    return Err(invalid(
                        format!("{prefix}.private_key_file"),
                        "required with merchant_serial: the merchant API private key (apiclient_key.pem)",
                    ));
                }
            };
            let key = keys::private_key_file(&format!("{prefix}.private_key_file"), path)?;
            let base = m.api_base.clone().unwrap_or_else(|| API_BASE.to_owned());
            let base = base.trim_end_matches('/').to_owned();
            crate::https::provider_url(&format!("{prefix}.api_base"), &base)?;
            let Some(merchant) = channel.merchant(&m.mchid) else {
                return Err(invalid(
                    format!("{prefix}.mchid"),
                    "not a configured merchant",
                ));
            };
            merchants.push(ApiMerchant {
                merchant,
                serial: serial.clone(),
                key: Arc::new(keys::Signer::parsed(key)),
                base,
                downloads: m.downloads(),
                sub_mchid: None,
            });
        }
        Ok(Self {
            channel,
            merchants: Accounts::new(merchants, reconcile)?,
        })
    }

    /// Sends one signed request. WeChat Pay v3: the string to sign is
    /// `METHOD\npath?query\ntimestamp\nnonce\nbody\n`, RSA-SHA256 with the API private key.
    pub(super) async fn call(
        &self,
        m: &ApiMerchant,
        post: bool,
        path: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<Received, Failure> {
        self.call_naming(m, post, path, body, None, now).await
    }

    /// [`WechatApi::call`] with `Wechatpay-Serial` naming `platform_serial`, the platform key
    /// a field of `body` is encrypted with (WeChat Pay v3: it must know which key to decrypt
    /// with).
    pub(super) async fn call_naming(
        &self,
        m: &ApiMerchant,
        post: bool,
        path: &str,
        body: &str,
        platform_serial: Option<&str>,
        now: Timestamp,
    ) -> Result<Received, Failure> {
        let method = if post { "POST" } else { "GET" };
        let authorization = Self::authorization(m, method, path, body, now)?;
        let url = format!("{}{path}", m.base);
        let client = self.merchants.plumbing().client();
        let request = if post {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .body(body.to_owned())
        } else {
            client.get(url)
        };
        let mut request = request
            .header("Accept", "application/json")
            .header("Authorization", authorization);
        if let Some(serial) = platform_serial {
            request = request.header("Wechatpay-Serial", serial);
        }
        self.merchants.plumbing().send(request).await
    }

    /// The `Authorization` header of one request: `path` with its query exactly as sent.
    pub(super) fn authorization(
        m: &ApiMerchant,
        method: &str,
        path: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<String, Failure> {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let nonce = crate::random::token(ALNUM, 32)
            .map_err(|_| Failure::Unexpected("random number generator failed".into()))?;
        let timestamp = now.unix_seconds();
        let message = format!("{method}\n{path}\n{timestamp}\n{nonce}\n{body}\n");
        let signature = m
            .key
            .sign_base64(message.as_bytes())
            .map_err(|e| Failure::Unexpected(format!("signing failed: {e}")))?;
        Ok(format!(
            "{SIGNATURE_TYPE} mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{timestamp}\",serial_no=\"{}\"",
            m.merchant.mchid, m.serial
        ))
    }

    /// Checks a 2xx answer's signature, as a notification's: `Wechatpay-*` headers over
    /// `timestamp\nnonce\nbody\n`, a usable platform key of the merchant that asked, fresh.
    /// A key it names that is not known is [`Failure::UnknownKey`].
    pub(super) fn verify(
        &self,
        m: &ApiMerchant,
        r: &Received,
        now: Timestamp,
    ) -> Result<(), Failure> {
        let serial = r
            .header("Wechatpay-Serial")
            .ok_or_else(|| Failure::BadSignature("answer without Wechatpay-Serial".into()))?;
        let platform = self
            .channel
            .key_of(serial, &m.merchant.mchid)
            .filter(|p| p.usable_at(now))
            .ok_or_else(|| {
                Failure::UnknownKey(format!(
                    "Wechatpay-Serial {serial} is not a usable platform key of merchant {}",
                    m.merchant.mchid
                ))
            })?;
        self.verify_with(r, now, &platform.key)
    }

    /// Checks a 2xx answer's `Wechatpay-*` headers and its signature with `key`.
    pub(super) fn verify_with(
        &self,
        r: &Received,
        now: Timestamp,
        key: &keys::RsaVerifier,
    ) -> Result<(), Failure> {
        let unsigned = |what: &str| Failure::BadSignature(format!("answer without {what}"));
        if let Some(kind) = r.header("Wechatpay-Signature-Type")
            && kind != SIGNATURE_TYPE
        {
            return Err(Failure::BadSignature(format!(
                "unsupported Wechatpay-Signature-Type {kind}"
            )));
        }
        let timestamp = r
            .header("Wechatpay-Timestamp")
            .ok_or_else(|| unsigned("Wechatpay-Timestamp"))?;
        let nonce = r
            .header("Wechatpay-Nonce")
            .ok_or_else(|| unsigned("Wechatpay-Nonce"))?;
        let signature = r
            .header("Wechatpay-Signature")
            .ok_or_else(|| unsigned("Wechatpay-Signature"))?;
        let seconds: i64 = timestamp
            .parse()
            .map_err(|_| Failure::BadSignature("Wechatpay-Timestamp is not unix seconds".into()))?;
        let skew = now.unix_seconds().saturating_sub(seconds);
        if skew.abs() > TIMESTAMP_WINDOW_SECS {
            return Err(Failure::BadSignature(format!(
                "answer timestamp is {skew} s from now"
            )));
        }
        let signature = BASE64
            .decode(signature)
            .map_err(|_| Failure::BadSignature("Wechatpay-Signature is not base64".into()))?;
        if signature.is_empty()
            || !key.verify(&string_to_sign(timestamp, nonce, &r.body), &signature)
        {
            return Err(Failure::BadSignature(
                "the answer's signature does not verify with the platform key".into(),
            ));
        }
        Ok(())
    }

    /// What a non-2xx answer means: its `code` (unsigned, so only the documented ones
    /// count), or "retry later".
    pub(super) fn error_code(r: &Received) -> Result<String, Failure> {
        if r.status == 429 || r.status >= 500 {
            return Err(Failure::Unreachable(format!("HTTP {}", r.status)));
        }
        match serde_json::from_slice::<ApiError>(&r.body) {
            Ok(e) => Ok(e.code),
            Err(_) => Err(Failure::Unexpected(format!(
                "HTTP {} without an error code",
                r.status
            ))),
        }
    }

    pub(super) fn unexpected(r: &Received) -> Failure {
        let message = serde_json::from_slice::<ApiError>(&r.body)
            .map(|e| format!("{}: {}", e.code, e.message))
            .unwrap_or_default();
        Failure::Unexpected(format!("HTTP {} {message}", r.status))
    }

    /// GETs `path` and reads its verified 2xx answer (`what` names it in a parse error); an
    /// error answer with one of the `not_found` codes is [`Miss::NotFound`].
    pub(super) async fn get_verified<T: serde::de::DeserializeOwned>(
        &self,
        m: &ApiMerchant,
        path: &str,
        not_found: [&str; 2],
        what: &str,
        now: Timestamp,
    ) -> Result<T, Miss> {
        let r = self.call(m, false, path, "", now).await?;
        if !(200..300).contains(&r.status) {
            partner_error(m, &r)?;
            let code = Self::error_code(&r)?;
            return Err(if not_found.contains(&code.as_str()) {
                Miss::NotFound
            } else {
                Miss::Failed(Self::unexpected(&r))
            });
        }
        self.verify(m, &r, now)?;
        Ok(serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("{what}: {e}")))?)
    }
}

/// Merchant transfers and bills are a direct merchant's calls: a sub-merchant's entry has
/// none of its own.
pub(super) fn not_for_sub(m: &ApiMerchant) -> Result<(), Failure> {
    match &m.sub_mchid {
        Some(sub) => Err(Failure::Unexpected(format!(
            "merchant transfers and bills are not available for a sub-merchant ({sub})"
        ))),
        None => Ok(()),
    }
}

/// A service provider's call answered with an error: never an answer about the trade. WeChat
/// does not document its error for a `sub_mchid` not bound to the service provider, and
/// its error bodies are never signed, so no 4xx of a partner call is taken as a "no such
/// trade" or a refusal: the call is retried as unanswered.
pub(super) fn partner_error(m: &ApiMerchant, r: &Received) -> Result<(), Failure> {
    let Some(sub) = &m.sub_mchid else {
        return Ok(());
    };
    WechatApi::error_code(r)?;
    Err(Failure::Unexpected(format!(
        "{} (a partner call for sub-merchant {sub}: not asked)",
        WechatApi::unexpected(r).detail()
    )))
}
