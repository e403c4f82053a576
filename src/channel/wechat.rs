//! WeChat Pay API v3 notifications (`/notify/wechat/pay`, `/notify/wechat/refund`).
//!
//! WeChat Pay v3: the signed message is `"{Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{body}\n"`
//! over the raw body bytes, RSASSA-PKCS1-v1_5 with SHA-256, base64; `Wechatpay-Serial` names
//! the platform key (a `PUB_KEY_ID_…` public key or a platform certificate serial) and so the
//! merchant. `resource` is AES-256-GCM with the merchant's APIv3 key, `resource.nonce` and
//! `resource.associated_data` as AAD, ciphertext‖tag in base64.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use actix_web::web;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use serde::Deserialize;
use std::path::PathBuf;
use utoipa::OpenApi;

use super::api::{
    ApiFuture, ClientSettings, CloseAnswer, Failure, Plumbing, ProviderApi, Received, RefundAnswer,
    TradeAnswer,
};
use super::keys::{self, RsaVerifier};
use super::{
    Answer, Channel, Explanation, Inbound, Mounted, Provider, Rejection, Reply, Standing, Verdict,
};
use crate::config::value::{ConfigError, Secret, invalid};
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use crate::time::Timestamp;

/// WeChat Pay's freshness rule: more than five minutes either way is refused.
pub const TIMESTAMP_WINDOW_SECS: i64 = 300;
/// The only signature type this build verifies (absent means this one).
pub const SIGNATURE_TYPE: &str = "WECHATPAY2-SHA256-RSA2048";
/// Signatures WeChat sends on purpose to check that merchants verify them.
const PROBE_PREFIX: &str = "WECHATPAY/SIGNTEST/";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WechatSettings {
    pub merchants: Vec<WechatMerchant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WechatMerchant {
    pub mchid: String,
    /// One app bound to this mchid; `appids` lists several (a mini-program and an official
    /// account, say). Either or both; together they are every app whose payment is ours.
    #[serde(default)]
    pub appid: Option<String>,
    #[serde(default)]
    pub appids: Vec<String>,
    pub apiv3_key: Secret,
    #[serde(default)]
    pub platform_keys: Vec<PlatformKey>,
    /// The merchant API private key (`apiclient_key.pem`). With `merchant_serial`, this
    /// merchant's unpaid orders are queried and closed at WeChat Pay (src/reconcile.rs).
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// The serial number of the merchant API certificate that goes with `private_key_file`.
    #[serde(default)]
    pub merchant_serial: Option<String>,
    /// WeChat Pay API v3's base URL; `https://api.mch.weixin.qq.com` when absent.
    #[serde(default)]
    pub api_base: Option<String>,
}

impl WechatMerchant {
    /// Every appid configured for this merchant, `appid` first.
    pub fn all_appids(&self) -> Vec<String> {
        let mut all: Vec<String> = self.appid.iter().cloned().collect();
        for id in &self.appids {
            if !all.contains(id) {
                all.push(id.clone());
            }
        }
        all
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformKey {
    /// Required with `public_key_file`; taken from the certificate with `certificate_file`.
    pub serial: Option<String>,
    pub public_key_file: Option<PathBuf>,
    pub certificate_file: Option<PathBuf>,
}

impl WechatSettings {
    /// What can be checked without reading key files (`Settings::validate`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, m) in self.merchants.iter().enumerate() {
            if m.apiv3_key.expose().len() != 32 {
                return Err(invalid(
                    format!("wechat.merchants[{i}].apiv3_key"),
                    "must be exactly 32 bytes",
                ));
            }
        }
        Ok(())
    }
}

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

/// The one value of a header that must appear exactly once.
fn single_header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, Rejection> {
    let mut values = headers.get_all(name);
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::BadRequest(format!(
            "header {name} appears more than once"
        )));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| Rejection::BadRequest(format!("header {name} is not visible ASCII")))
}

fn required_header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, Rejection> {
    single_header(headers, name)?
        .ok_or_else(|| Rejection::BadRequest(format!("missing header {name}")))
}

#[derive(Deserialize)]
struct Envelope {
    event_type: String,
    resource_type: Option<String>,
    resource: Resource,
}

#[derive(Deserialize)]
struct Resource {
    algorithm: String,
    ciphertext: String,
    #[serde(default)]
    associated_data: String,
    nonce: String,
}

#[derive(Deserialize)]
struct Transaction {
    appid: String,
    mchid: String,
    out_trade_no: String,
    transaction_id: String,
    trade_state: String,
    amount: TransactionAmount,
    success_time: Option<String>,
}

#[derive(Deserialize)]
struct TransactionAmount {
    /// The order amount; not `payer_total`, which coupons reduce.
    total: i64,
    currency: Option<String>,
}

#[derive(Deserialize)]
struct RefundResource {
    mchid: String,
    transaction_id: String,
    out_trade_no: String,
    refund_id: String,
    out_refund_no: String,
    refund_status: String,
    amount: WechatRefundAmount,
    success_time: Option<String>,
}

#[derive(Deserialize)]
struct WechatRefundAmount {
    total: i64,
    refund: i64,
}

/// A payment's notice, from the transaction a notification or a query answer carries: the
/// same fields, so the same digest either way.
fn transaction_notice(m: &Merchant, t: Transaction, kind: NoticeKind) -> Notice {
    Notice {
        channel: ChannelId::Wechat,
        kind,
        merchant_matches: t.mchid == m.mchid && m.appids.contains(&t.appid),
        merchant: MerchantIds {
            merchant_id: t.mchid,
            app_id: Some(t.appid),
        },
        out_trade_no: t.out_trade_no,
        transaction_id: t.transaction_id,
        amount_fen: t.amount.total,
        currency: t.amount.currency.unwrap_or_else(|| "CNY".to_owned()),
        occurred_at: parse_time(t.success_time.as_deref()),
    }
}

fn parse_time(text: Option<&str>) -> Option<Timestamp> {
    text.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| Timestamp::new(t.with_timezone(&chrono::Utc)))
}

fn bad_json(what: &str) -> impl Fn(serde_json::Error) -> Rejection + '_ {
    move |e| Rejection::BadRequest(format!("{what}: {e}"))
}

/// A signed body opened: the envelope read and `resource` decrypted with `merchant`'s APIv3
/// key. Only ever called on a body whose signature verified.
fn open(merchant: &Arc<Merchant>, body: &[u8]) -> Result<Verified, Rejection> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(bad_json("envelope"))?;
    if envelope
        .resource_type
        .as_deref()
        .is_some_and(|t| t != "encrypt-resource")
    {
        return Err(Rejection::BadRequest(
            "resource_type is not encrypt-resource".into(),
        ));
    }
    let r = envelope.resource;
    if r.algorithm != "AEAD_AES_256_GCM" {
        return Err(Rejection::BadRequest(format!(
            "unsupported algorithm {}",
            r.algorithm
        )));
    }
    let nonce = Nonce::try_assume_unique_for_key(r.nonce.as_bytes())
        .map_err(|_| Rejection::BadRequest("resource.nonce is not 12 bytes".into()))?;
    let mut sealed = BASE64
        .decode(&r.ciphertext)
        .map_err(|_| Rejection::BadRequest("resource.ciphertext is not base64".into()))?;
    let plaintext = merchant
        .apiv3_key
        .open_in_place(nonce, Aad::from(r.associated_data.as_bytes()), &mut sealed)
        .map_err(|_| {
            Rejection::Undecryptable(format!(
                "resource does not decrypt with the apiv3_key of merchant {}",
                merchant.mchid
            ))
        })?
        .to_vec();
    Ok(Verified {
        merchant: Arc::clone(merchant),
        event_type: envelope.event_type,
        plaintext,
    })
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
        open(&platform.merchant, body)
            .and_then(|v| self.decode(v))
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
    }
}

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
fn without_json_whitespace(body: &[u8]) -> Vec<u8> {
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
fn string_to_sign(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(timestamp.len() + nonce.len() + body.len() + 3);
    for part in [timestamp.as_bytes(), nonce.as_bytes(), body] {
        message.extend_from_slice(part);
        message.push(b'\n');
    }
    message
}

impl WechatPay {
    /// Why a signature that does not verify over the bytes received would have verified:
    /// the body WeChat signed recovered from what a proxy did to it, or another key.
    fn why_unsigned(
        &self,
        serial: &str,
        timestamp: &str,
        nonce: &str,
        body: &[u8],
        signature: &[u8],
    ) -> String {
        let verifies = |key: &RsaVerifier, body: &[u8]| {
            key.verify(&string_to_sign(timestamp, nonce, body), signature)
        };
        let key = self.keys.get(&serial.to_ascii_uppercase()).map(|p| &p.key);
        if let Some(key) = key {
            let compact = without_json_whitespace(body);
            if compact != body && verifies(key, &compact) {
                return "the body is not the bytes WeChat signed: it was re-serialised \
                        (whitespace differs); pass the raw request body through unchanged"
                    .to_owned();
            }
            for trimmed in [body.strip_suffix(b"\r\n"), body.strip_suffix(b"\n")]
                .into_iter()
                .flatten()
            {
                if verifies(key, trimmed) {
                    return "the body is not the bytes WeChat signed: a line ending was added \
                            at its end"
                        .to_owned();
                }
            }
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
                && let Ok(canonical) = serde_json::to_vec(&value)
                && canonical != body
                && verifies(key, &canonical)
            {
                return "the body is not the bytes WeChat signed: it was re-serialised \
                        (key order or escapes differ)"
                    .to_owned();
            }
        }
        let mut others: Vec<&String> = self
            .keys
            .iter()
            .filter(|(s, p)| !s.eq_ignore_ascii_case(serial) && verifies(&p.key, body))
            .map(|(s, _)| s)
            .collect();
        others.sort();
        if let Some(other) = others.first() {
            return format!(
                "signed with the platform key {other}, not with {serial} that Wechatpay-Serial \
                 names: the serial-to-key mapping in wechat.merchants[].platform_keys is wrong"
            );
        }
        "the signature does not verify over the bytes received: the body or a Wechatpay-* \
         header was changed on the way (a proxy or framework re-serialised or re-encoded it), \
         the platform key configured for this serial is not WeChat's, or WeChat did not send it"
            .to_owned()
    }
}

impl Provider for WechatPay {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn accounts(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .keys
            .values()
            .map(|p| p.merchant.mchid.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection> {
        super::admit(self, request)
    }

    fn explain(&self, request: &Inbound<'_>) -> Explanation {
        let mut e = Explanation::default();
        let h = request.headers;
        let mut found = HashMap::new();
        for name in [
            "Wechatpay-Timestamp",
            "Wechatpay-Nonce",
            "Wechatpay-Signature",
            "Wechatpay-Serial",
        ] {
            match single_header(h, name) {
                Ok(Some(value)) => {
                    e.push(format!("header {name}"), Verdict::Pass, format!("present once: {value}"));
                    found.insert(name, value);
                }
                Ok(None) => e.push(
                    format!("header {name}"),
                    Verdict::Fail,
                    format!("missing: WeChat always sends {name}; something on the way dropped it, or WeChat did not send this request"),
                ),
                Err(rejection) => e.push(format!("header {name}"), Verdict::Fail, rejection.to_string()),
            }
        }
        match single_header(h, "Wechatpay-Signature-Type") {
            Ok(None) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Pass,
                format!("absent (means {SIGNATURE_TYPE})"),
            ),
            Ok(Some(SIGNATURE_TYPE)) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Pass,
                SIGNATURE_TYPE,
            ),
            Ok(Some(other)) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Fail,
                format!("{other} is not supported (only {SIGNATURE_TYPE})"),
            ),
            Err(rejection) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Fail,
                rejection.to_string(),
            ),
        }
        let (Some(timestamp), Some(nonce), Some(signature), Some(serial)) = (
            found.get("Wechatpay-Timestamp").copied(),
            found.get("Wechatpay-Nonce").copied(),
            found.get("Wechatpay-Signature").copied(),
            found.get("Wechatpay-Serial").copied(),
        ) else {
            e.push(
                "signature",
                Verdict::Skipped,
                "a signature header is missing",
            );
            return e;
        };

        match timestamp.parse::<i64>() {
            Ok(seconds) => {
                let skew = request.now.unix_seconds().saturating_sub(seconds);
                if skew.abs() <= TIMESTAMP_WINDOW_SECS {
                    e.push("timestamp skew", Verdict::Pass, format!("{skew} s between Wechatpay-Timestamp and arrival (window ±{TIMESTAMP_WINDOW_SECS} s)"));
                } else {
                    e.push("timestamp skew", Verdict::Fail, format!("{skew} s between Wechatpay-Timestamp and arrival, outside WeChat's ±{TIMESTAMP_WINDOW_SECS} s: a replay, a request held back, or a clock that is off"));
                }
            }
            Err(_) => e.push(
                "timestamp skew",
                Verdict::Fail,
                format!("Wechatpay-Timestamp {timestamp:?} is not unix seconds"),
            ),
        }

        let platform = self.keys.get(&serial.to_ascii_uppercase());
        match platform {
            Some(p) => e.push(
                "serial",
                Verdict::Pass,
                format!(
                    "{serial} is a configured platform key of merchant {}",
                    p.merchant.mchid
                ),
            ),
            None => {
                let mut known: Vec<&String> = self.keys.keys().collect();
                known.sort();
                e.push("serial", Verdict::Fail, format!(
                    "{serial} is not a configured platform key (configured: {known:?}): WeChat signs with the key it names; add its public key or certificate to wechat.merchants[].platform_keys (a rotation, or a new merchant)"
                ));
            }
        }

        let message = string_to_sign(timestamp, nonce, request.body);
        e.push(
            "string to sign",
            Verdict::Info,
            format!(
                "{} bytes, SHA-256 {}: \"{}\"",
                message.len(),
                super::sha256_hex(&message),
                super::shown(&message)
            ),
        );

        if signature.starts_with(PROBE_PREFIX) {
            e.push("signature", Verdict::Fail, "a WECHATPAY/SIGNTEST/ probe: WeChat checks that merchants refuse it; refusing it is correct");
        } else {
            match (platform, BASE64.decode(signature)) {
                (_, Err(_)) => {
                    e.push(
                        "signature",
                        Verdict::Fail,
                        "Wechatpay-Signature is not base64",
                    );
                }
                (None, Ok(_)) => {
                    e.push("signature", Verdict::Skipped, "no key for this serial");
                }
                (Some(p), Ok(sig)) => {
                    if p.key.verify(&message, &sig) {
                        e.push(
                            "signature",
                            Verdict::Pass,
                            "verifies with the platform key of this serial",
                        );
                    } else {
                        let why = self.why_unsigned(serial, timestamp, nonce, request.body, &sig);
                        e.push("signature", Verdict::Fail, why);
                    }
                }
            }
        }

        let Some(platform) = platform else {
            e.push(
                "decryption",
                Verdict::Skipped,
                "no merchant for this serial",
            );
            return e;
        };
        let envelope: Envelope = match serde_json::from_slice(request.body) {
            Ok(envelope) => envelope,
            Err(err) => {
                e.push(
                    "decryption",
                    Verdict::Fail,
                    format!("the body is not WeChat's notification JSON: {err}"),
                );
                return e;
            }
        };
        let r = envelope.resource;
        let open = |key: &LessSafeKey| -> Option<Vec<u8>> {
            let nonce = Nonce::try_assume_unique_for_key(r.nonce.as_bytes()).ok()?;
            let mut sealed = BASE64.decode(&r.ciphertext).ok()?;
            key.open_in_place(nonce, Aad::from(r.associated_data.as_bytes()), &mut sealed)
                .ok()
                .map(|plain| plain.to_vec())
        };
        let merchant = Arc::clone(&platform.merchant);
        let Some(plaintext) = open(&merchant.apiv3_key) else {
            let mut others: Vec<&str> = self
                .keys
                .values()
                .filter(|p| {
                    p.merchant.mchid != merchant.mchid && open(&p.merchant.apiv3_key).is_some()
                })
                .map(|p| p.merchant.mchid.as_str())
                .collect();
            others.sort_unstable();
            others.dedup();
            let detail = match others.first() {
                Some(other) => format!(
                    "the resource does not decrypt with the apiv3_key of merchant {}, but does with merchant {other}'s: the platform key {serial} is configured under the wrong merchant",
                    merchant.mchid
                ),
                None if r.algorithm != "AEAD_AES_256_GCM" => {
                    format!("unsupported algorithm {}", r.algorithm)
                }
                None => format!(
                    "the resource does not decrypt with the apiv3_key of merchant {}: the key configured is not the APIv3 key set in the WeChat Pay merchant platform (it was changed, or mistyped); fix wechat.merchants[].apiv3_key, then re-apply the receipts",
                    merchant.mchid
                ),
            };
            e.push("decryption", Verdict::Fail, detail);
            return e;
        };
        e.push(
            "decryption",
            Verdict::Pass,
            format!(
                "decrypts with the apiv3_key of merchant {} ({} bytes)",
                merchant.mchid,
                plaintext.len()
            ),
        );

        let verified = Verified {
            merchant,
            event_type: envelope.event_type.clone(),
            plaintext,
        };
        match self
            .decode(verified)
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
        {
            Ok(notice) => {
                e.push("decoded fields", Verdict::Info, format!(
                    "event {}, out_trade_no {}, transaction_id {}, amount_fen {}, currency {}, mchid {}, appid {}",
                    envelope.event_type, notice.out_trade_no, notice.transaction_id, notice.amount_fen,
                    notice.currency, notice.merchant.merchant_id, notice.merchant.app_id.as_deref().unwrap_or("-")
                ));
                if notice.merchant_matches {
                    e.push(
                        "merchant",
                        Verdict::Pass,
                        "mchid and appid are those configured for this key",
                    );
                } else {
                    e.push("merchant", Verdict::Fail, format!("mchid {} / appid {} are not those configured for this key: recorded as a MERCHANT_MISMATCH anomaly, the order is not paid", notice.merchant.merchant_id, notice.merchant.app_id.as_deref().unwrap_or("-")));
                }
                // Decoded even when the signature failed: the order checks still tell the
                // reader whether re-applying it would pay the order.
                e.notice = Some(notice);
            }
            Err(rejection) => e.push("decoded fields", Verdict::Fail, rejection.to_string()),
        }
        e
    }
}

/// WeChat Pay API v3's production base URL.
pub const API_BASE: &str = "https://api.mch.weixin.qq.com";

/// One merchant's API credentials: its API private key and that key's certificate serial.
struct ApiMerchant {
    merchant: Arc<Merchant>,
    serial: String,
    key: keys::RsaSigner,
    base: String,
}

/// The WeChat Pay API v3 client: query by `out_trade_no`, close, refund query, for every
/// merchant with API credentials. Requests are signed with the merchant's API private key;
/// answers are verified with that merchant's platform keys, as notifications are.
pub struct WechatApi {
    channel: Arc<WechatPay>,
    merchants: Vec<ApiMerchant>,
    plumbing: Plumbing,
}

/// A transaction as the query answers it: `transaction_id` and `amount` only once paid.
#[derive(Deserialize)]
struct QueriedTransaction {
    appid: String,
    mchid: String,
    out_trade_no: String,
    transaction_id: Option<String>,
    trade_state: String,
    amount: Option<QueriedAmount>,
    success_time: Option<String>,
}

/// An unpaid trade's `amount` may carry only `payer_currency`.
#[derive(Deserialize)]
struct QueriedAmount {
    total: Option<i64>,
    currency: Option<String>,
}

/// A refund as the refund query answers it (no `mchid`: the asking merchant's).
#[derive(Deserialize)]
struct QueriedRefund {
    refund_id: String,
    out_refund_no: String,
    transaction_id: String,
    out_trade_no: String,
    status: String,
    amount: WechatRefundAmount,
    success_time: Option<String>,
}

/// WeChat Pay's error body (4xx/5xx): never signed, so only its documented codes count.
#[derive(Deserialize)]
struct ApiError {
    code: String,
    #[serde(default)]
    message: String,
}

/// `/`-free path segment: `out_trade_no` allows `|` and `*`.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'*');

impl WechatApi {
    /// `None` when no merchant has API credentials.
    fn from_settings(
        channel: Arc<WechatPay>,
        settings: &WechatSettings,
        reconcile: &ClientSettings,
    ) -> Result<Option<Self>, ConfigError> {
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
            super::api::provider_url(&format!("{prefix}.api_base"), &base)?;
            let Some(merchant) = channel
                .keys
                .values()
                .find(|p| p.merchant.mchid == m.mchid)
                .map(|p| Arc::clone(&p.merchant))
            else {
                return Err(invalid(
                    format!("{prefix}.platform_keys"),
                    "at least one key is needed",
                ));
            };
            merchants.push(ApiMerchant {
                merchant,
                serial: serial.clone(),
                key,
                base,
            });
        }
        if merchants.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            channel,
            merchants,
            plumbing: Plumbing::new(reconcile)?,
        }))
    }

    fn merchant(&self, mchid: &str) -> Result<&ApiMerchant, Failure> {
        self.merchants
            .iter()
            .find(|m| m.merchant.mchid == mchid)
            .ok_or_else(|| Failure::Unexpected(format!("no API credentials for mchid {mchid}")))
    }

    /// Sends one signed request. WeChat Pay v3: the string to sign is
    /// `METHOD\npath?query\ntimestamp\nnonce\nbody\n`, RSA-SHA256 with the API private key.
    async fn call(
        &self,
        m: &ApiMerchant,
        post: bool,
        path: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<Received, Failure> {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let nonce = crate::random::token(ALNUM, 32)
            .map_err(|_| Failure::Unexpected("random number generator failed".into()))?;
        let timestamp = now.unix_seconds();
        let method = if post { "POST" } else { "GET" };
        let message = format!("{method}\n{path}\n{timestamp}\n{nonce}\n{body}\n");
        let signature = m
            .key
            .sign_base64(message.as_bytes())
            .map_err(|e| Failure::Unexpected(format!("signing failed: {e}")))?;
        let authorization = format!(
            "{SIGNATURE_TYPE} mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{timestamp}\",serial_no=\"{}\"",
            m.merchant.mchid, m.serial
        );
        let url = format!("{}{path}", m.base);
        let client = self.plumbing.client();
        let request = if post {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .body(body.to_owned())
        } else {
            client.get(url)
        };
        let request = request
            .header("Accept", "application/json")
            .header("Authorization", authorization);
        self.plumbing.send(request).await
    }

    /// Checks a 2xx answer's signature, as a notification's: `Wechatpay-*` headers over
    /// `timestamp\nnonce\nbody\n`, a platform key of the merchant that asked, fresh.
    fn verify(&self, m: &ApiMerchant, r: &Received, now: Timestamp) -> Result<(), Failure> {
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
        let serial = r
            .header("Wechatpay-Serial")
            .ok_or_else(|| unsigned("Wechatpay-Serial"))?;
        let seconds: i64 = timestamp
            .parse()
            .map_err(|_| Failure::BadSignature("Wechatpay-Timestamp is not unix seconds".into()))?;
        let skew = now.unix_seconds().saturating_sub(seconds);
        if skew.abs() > TIMESTAMP_WINDOW_SECS {
            return Err(Failure::BadSignature(format!(
                "answer timestamp is {skew} s from now"
            )));
        }
        let platform = self
            .channel
            .keys
            .get(&serial.to_ascii_uppercase())
            .filter(|p| p.merchant.mchid == m.merchant.mchid)
            .ok_or_else(|| {
                Failure::BadSignature(format!(
                    "Wechatpay-Serial {serial} is not a platform key of merchant {}",
                    m.merchant.mchid
                ))
            })?;
        let signature = BASE64
            .decode(signature)
            .map_err(|_| Failure::BadSignature("Wechatpay-Signature is not base64".into()))?;
        if signature.is_empty()
            || !platform
                .key
                .verify(&string_to_sign(timestamp, nonce, &r.body), &signature)
        {
            return Err(Failure::BadSignature(
                "the answer's signature does not verify with the platform key".into(),
            ));
        }
        Ok(())
    }

    /// What a non-2xx answer means: its `code` (unsigned, so only the documented ones
    /// count), or "retry later".
    fn error_code(r: &Received) -> Result<String, Failure> {
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

    fn unexpected(r: &Received) -> Failure {
        let message = serde_json::from_slice::<ApiError>(&r.body)
            .map(|e| format!("{}: {}", e.code, e.message))
            .unwrap_or_default();
        Failure::Unexpected(format!("HTTP {} {message}", r.status))
    }

    async fn do_query(&self, mchid: &str, out_trade_no: &str, now: Timestamp) -> TradeAnswer {
        let m = match self.merchant(mchid) {
            Ok(m) => m,
            Err(f) => return TradeAnswer::Failed(f),
        };
        let path = format!(
            "/v3/pay/transactions/out-trade-no/{}?mchid={}",
            percent_encoding::utf8_percent_encode(out_trade_no, SEGMENT),
            percent_encoding::utf8_percent_encode(&m.merchant.mchid, SEGMENT)
        );
        let r = match self.call(m, false, &path, "", now).await {
            Ok(r) => r,
            Err(f) => return TradeAnswer::Failed(f),
        };
        if !(200..300).contains(&r.status) {
            return match Self::error_code(&r) {
                Ok(code) if code == "ORDER_NOT_EXIST" || code == "ORDERNOTEXIST" => {
                    TradeAnswer::NotFound
                }
                Ok(_) => TradeAnswer::Failed(Self::unexpected(&r)),
                Err(f) => TradeAnswer::Failed(f),
            };
        }
        if let Err(f) = self.verify(m, &r, now) {
            return TradeAnswer::Failed(f);
        }
        let t: QueriedTransaction = match serde_json::from_slice(&r.body) {
            Ok(t) => t,
            Err(e) => {
                return TradeAnswer::Failed(Failure::Unexpected(format!("query answer: {e}")));
            }
        };
        // Every id the answer carries is checked: a signed answer about another order or
        // merchant (replayed from elsewhere) says nothing about this one.
        if t.out_trade_no != out_trade_no || t.mchid != m.merchant.mchid {
            return TradeAnswer::Failed(Failure::Unexpected(format!(
                "asked about {out_trade_no} of merchant {}, answered about {} of merchant {}",
                m.merchant.mchid, t.out_trade_no, t.mchid
            )));
        }
        match t.trade_state.as_str() {
            // REFUND: paid, then refunded; the payment happened all the same.
            "SUCCESS" | "REFUND" => {
                let (
                    Some(transaction_id),
                    Some(QueriedAmount {
                        total: Some(total),
                        currency,
                    }),
                ) = (t.transaction_id, t.amount)
                else {
                    return TradeAnswer::Failed(Failure::Unexpected(
                        "a paid answer without transaction_id or amount".into(),
                    ));
                };
                if total <= 0 {
                    return TradeAnswer::Failed(Failure::Unexpected(
                        "amount.total must be positive".into(),
                    ));
                }
                let paid = Transaction {
                    appid: t.appid,
                    mchid: t.mchid,
                    out_trade_no: t.out_trade_no,
                    transaction_id,
                    trade_state: t.trade_state,
                    amount: TransactionAmount { total, currency },
                    success_time: t.success_time,
                };
                let notice = transaction_notice(&m.merchant, paid, NoticeKind::Paid);
                match notice.checked() {
                    Ok(notice) => TradeAnswer::Paid(Box::new(notice)),
                    Err(e) => TradeAnswer::Failed(Failure::Unexpected(e)),
                }
            }
            "CLOSED" | "REVOKED" => TradeAnswer::Closed,
            _ => TradeAnswer::Unpaid(t.trade_state),
        }
    }

    async fn do_close(&self, mchid: &str, out_trade_no: &str, now: Timestamp) -> CloseAnswer {
        let m = match self.merchant(mchid) {
            Ok(m) => m,
            Err(f) => return CloseAnswer::Failed(f),
        };
        let path = format!(
            "/v3/pay/transactions/out-trade-no/{}/close",
            percent_encoding::utf8_percent_encode(out_trade_no, SEGMENT)
        );
        let body = serde_json::json!({ "mchid": m.merchant.mchid }).to_string();
        let r = match self.call(m, true, &path, &body, now).await {
            Ok(r) => r,
            Err(f) => return CloseAnswer::Failed(f),
        };
        if (200..300).contains(&r.status) {
            // An empty 204 names no order: valid for any close of this merchant within 300 s.
            // The caller confirms with a query (WeChat answers 204 also for a trade it never
            // saw).
            return match self.verify(m, &r, now) {
                Ok(()) => CloseAnswer::Closed,
                Err(f) => CloseAnswer::Failed(f),
            };
        }
        match Self::error_code(&r) {
            Ok(code) if code == "ORDERPAID" => CloseAnswer::NotClosable,
            Ok(code) if code == "ORDER_NOT_EXIST" || code == "ORDERNOTEXIST" => {
                CloseAnswer::NotFound
            }
            Ok(_) => CloseAnswer::Failed(Self::unexpected(&r)),
            Err(f) => CloseAnswer::Failed(f),
        }
    }

    async fn do_refund_query(
        &self,
        mchid: &str,
        out_trade_no: &str,
        out_refund_no: &str,
        now: Timestamp,
    ) -> RefundAnswer {
        let m = match self.merchant(mchid) {
            Ok(m) => m,
            Err(f) => return RefundAnswer::Failed(f),
        };
        let path = format!(
            "/v3/refund/domestic/refunds/{}",
            percent_encoding::utf8_percent_encode(out_refund_no, SEGMENT)
        );
        let r = match self.call(m, false, &path, "", now).await {
            Ok(r) => r,
            Err(f) => return RefundAnswer::Failed(f),
        };
        if !(200..300).contains(&r.status) {
            return match Self::error_code(&r) {
                Ok(code) if code == "RESOURCE_NOT_EXISTS" || code == "ORDER_NOT_EXIST" => {
                    RefundAnswer::NotFound
                }
                Ok(_) => RefundAnswer::Failed(Self::unexpected(&r)),
                Err(f) => RefundAnswer::Failed(f),
            };
        }
        if let Err(f) = self.verify(m, &r, now) {
            return RefundAnswer::Failed(f);
        }
        let q: QueriedRefund = match serde_json::from_slice(&r.body) {
            Ok(q) => q,
            Err(e) => {
                return RefundAnswer::Failed(Failure::Unexpected(format!("refund answer: {e}")));
            }
        };
        if q.out_trade_no != out_trade_no || q.out_refund_no != out_refund_no {
            return RefundAnswer::Failed(Failure::Unexpected(format!(
                "asked about refund {out_refund_no} of {out_trade_no}, answered about {} of {}",
                q.out_refund_no, q.out_trade_no
            )));
        }
        if q.status != "SUCCESS" {
            return RefundAnswer::NotRefunded(q.status);
        }
        if q.amount.refund <= 0 || q.amount.total <= 0 {
            return RefundAnswer::Failed(Failure::Unexpected(
                "amount.refund and amount.total must be positive".into(),
            ));
        }
        // The same fields as REFUND.SUCCESS decodes to, so the same digest.
        let notice = Notice {
            channel: ChannelId::Wechat,
            kind: NoticeKind::Refunded(Refund {
                out_refund_no: q.out_refund_no,
                refund_id: q.refund_id,
                amount: RefundAmount::This(q.amount.refund),
            }),
            merchant_matches: true,
            merchant: MerchantIds {
                merchant_id: m.merchant.mchid.clone(),
                app_id: None,
            },
            out_trade_no: q.out_trade_no,
            transaction_id: q.transaction_id,
            amount_fen: q.amount.total,
            currency: "CNY".to_owned(),
            occurred_at: parse_time(q.success_time.as_deref()),
        };
        match notice.checked() {
            Ok(notice) => RefundAnswer::Refunded(Some(Box::new(notice))),
            Err(e) => RefundAnswer::Failed(Failure::Unexpected(e)),
        }
    }
}

impl ProviderApi for WechatApi {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn accounts(&self) -> Vec<String> {
        self.merchants
            .iter()
            .map(|m| m.merchant.mchid.clone())
            .collect()
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
        (status = 400, description = "Missing header, malformed body or field, unsupported signature type", body = WechatFail),
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
        (status = 400, description = "Bad request", body = WechatFail),
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
            web::resource("/notify/wechat/pay")
                .app_data(channel.clone())
                .route(web::post().to(wechat_pay)),
        )
        .service(
            web::resource("/notify/wechat/refund")
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
