//! WeChat Pay API v3 notifications (`/notify/wechat/pay`, `/notify/wechat/refund`,
//! `/notify/wechat/transfer`).
//!
//! WeChat Pay v3: the signed message is `"{Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{body}\n"`
//! over the raw body bytes, RSASSA-PKCS1-v1_5 with SHA-256, base64; `Wechatpay-Serial` names
//! the platform key (a `PUB_KEY_ID_…` public key or a platform certificate serial) and so the
//! merchant. `resource` is AES-256-GCM with the merchant's APIv3 key, `resource.nonce` and
//! `resource.associated_data` as AAD, ciphertext‖tag in base64.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ring::aead::{AES_256_GCM, LessSafeKey, UnboundKey};

use utoipa::OpenApi;

use super::api::ProviderApi;
use super::keys::{self, RsaVerifier};
use super::platform::KeyOrigin;
#[cfg(feature = "fuzzing")]
use super::{Channel, Rejection};
use super::{Mounted, Provider};
use crate::config::value::{ConfigError, invalid};
use crate::https::ClientSettings;
#[cfg(feature = "fuzzing")]
use crate::notice::Notice;
use crate::time::Timestamp;

mod accounts;
mod api;
pub mod bill;
mod certificates;
mod combine;
mod explain;
pub mod settings;
#[cfg(test)]
mod tests;
mod trade;
mod transfer;
mod verify;
mod wire;

pub use api::{API_BASE, WechatApi};
pub use bill::{read_tradebill, verified_tradebill};
pub use settings::{CertificateMode, PlatformKey, WechatMerchant, WechatSettings};

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
/// The notify route of merchant transfers (`MCHTRANSFER.BILL.FINISHED`).
pub const TRANSFER_ROUTE: &str = "/notify/wechat/transfer";
/// Per-account notify routes: verified with that account's keys only (a sub-merchant's:
/// its service provider's). For merchants that share a platform certificate.
pub const PAY_ACCOUNT_ROUTE: &str = "/notify/wechat/pay/{account}";
pub const REFUND_ACCOUNT_ROUTE: &str = "/notify/wechat/refund/{account}";

/// A merchant with its own keys: its ids and its APIv3 decryption key.
pub struct Merchant {
    pub mchid: String,
    /// Every app bound to this mchid; a payment from any of them is ours.
    pub appids: Vec<String>,
    apiv3_key: LessSafeKey,
    /// SHA-256 of the APIv3 key: tells whether two merchants hold the same key.
    apiv3_digest: [u8; 32],
}

impl Merchant {
    /// `None` when `apiv3_key` is not exactly 32 bytes.
    pub(super) fn new(mchid: String, appids: Vec<String>, apiv3_key: &[u8]) -> Option<Self> {
        let key = UnboundKey::new(&AES_256_GCM, apiv3_key).ok()?;
        let digest = ring::digest::digest(&ring::digest::SHA256, apiv3_key);
        Some(Self {
            mchid,
            appids,
            apiv3_key: LessSafeKey::new(key),
            apiv3_digest: digest.as_ref().try_into().ok()?,
        })
    }
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
pub(super) struct PlatformVerifier {
    pub(super) key: RsaVerifier,
    pub(super) merchant: Arc<Merchant>,
    pub(super) origin: KeyOrigin,
    /// A certificate's validity; `None` for a public key (`PUB_KEY_ID_…`).
    pub(super) effective_at: Option<Timestamp>,
    pub(super) expire_at: Option<Timestamp>,
    pub(super) fetched_at: Option<Timestamp>,
}

impl PlatformVerifier {
    /// Whether the key may verify at `now`: a certificate past its expiry is not used.
    pub(super) fn usable_at(&self, now: Timestamp) -> bool {
        self.expire_at
            .is_none_or(|at| at.unix_seconds() > now.unix_seconds())
    }
}

/// The WeChat Pay channel: every merchant, file and database, and the platform keys it
/// verifies with, by serial: those configured, and those downloaded since start-up or read
/// from `platform_certificate` (`crate::certificates` adds them while the service runs). All
/// of it is one immutable [`Book`], swapped whole when an account or a key changes.
pub struct WechatPay {
    book: RwLock<Arc<Book>>,
    /// The merchants of the configuration file, in its order.
    pub(super) file: Vec<String>,
    /// When each merchant's certificates were last downloaded (`explain` says so).
    refreshed: RwLock<HashMap<String, Timestamp>>,
}

/// What the channel knows at one moment. Lookups by mchid, serial and sub-merchant are hash
/// lookups, however many accounts there are.
#[derive(Clone, Default)]
pub(super) struct Book {
    /// Every enabled merchant with its own keys.
    pub(super) merchants: HashMap<String, Arc<Merchant>>,
    /// Every platform key by upper-case serial: one merchant's, or, for a platform
    /// certificate several merchants hold (certificate mode), one entry per merchant.
    pub(super) keys: HashMap<String, Holders>,
    /// Every enabled sub-merchant (`partner_sub`) by `sub_mchid`.
    pub(super) subs: HashMap<String, Arc<SubMerchant>>,
}

/// The entries of one serial, each with its merchant. Shared between books until a change
/// edits it (`Arc::make_mut`): a batch of changes copies a serial's entries once.
pub(super) type Holders = Arc<Vec<Arc<PlatformVerifier>>>;

impl Book {
    /// `mchid`'s entry of the key `serial` (upper case), if it holds it.
    pub(super) fn key_of(&self, serial: &str, mchid: &str) -> Option<&Arc<PlatformVerifier>> {
        self.keys
            .get(serial)?
            .iter()
            .find(|p| p.merchant.mchid == mchid)
    }

    /// Adds the key `serial` (upper case) of `p`'s merchant, replacing that merchant's
    /// earlier entry of it; other merchants' entries of the serial stay.
    pub(super) fn put_key(&mut self, serial: String, p: Arc<PlatformVerifier>) {
        let held = Arc::make_mut(self.keys.entry(serial).or_default());
        match held
            .iter()
            .position(|o| o.merchant.mchid == p.merchant.mchid)
        {
            Some(at) => held[at] = p,
            None => held.push(p),
        }
    }

    /// Adds the key `serial` (upper case) of `p`'s merchant, which holds no entry of it.
    pub(super) fn add_key(&mut self, serial: String, p: Arc<PlatformVerifier>) {
        debug_assert!(self.key_of(&serial, &p.merchant.mchid).is_none());
        Arc::make_mut(self.keys.entry(serial).or_default()).push(p);
    }

    /// Takes every key of `mchid` out, each with its serial; other merchants' entries of a
    /// shared serial stay.
    pub(super) fn take_keys_of(&mut self, mchid: &str) -> Vec<(String, Arc<PlatformVerifier>)> {
        let serials: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, held)| held.iter().any(|p| p.merchant.mchid == mchid))
            .map(|(s, _)| s.clone())
            .collect();
        let mut taken = Vec::new();
        for serial in serials {
            let Some(held) = self.keys.remove(&serial) else {
                continue;
            };
            let (mine, others): (Vec<_>, Vec<_>) = held
                .iter()
                .cloned()
                .partition(|p| p.merchant.mchid == mchid);
            if !others.is_empty() {
                self.keys.insert(serial.clone(), others.into());
            }
            taken.extend(mine.into_iter().map(|p| (serial.clone(), p)));
        }
        taken
    }

    /// Why `key` may not be `mchid`'s key `serial` (upper case): another merchant holds that
    /// serial with another public key. A serial names one key; only a platform certificate
    /// (the same key) is shared.
    pub(super) fn conflicting(
        &self,
        serial: &str,
        mchid: &str,
        key: &RsaVerifier,
    ) -> Option<String> {
        // Every holder of a serial holds its one key: the first other one tells.
        let other = self
            .keys
            .get(serial)?
            .iter()
            .find(|p| p.merchant.mchid != mchid)
            .filter(|p| !p.key.same_key(key))?;
        Some(format!(
            "{serial} is a key of merchant {} with another public key: a serial names one key",
            other.merchant.mchid
        ))
    }

    /// Why `merchant` may not hold the key `serial` (upper case): another merchant holding it
    /// has the same APIv3 key, so a notification under it would open for both and name
    /// either.
    pub(super) fn ambiguous(&self, serial: &str, merchant: &Merchant) -> Option<String> {
        let other = self.keys.get(serial)?.iter().find(|p| {
            p.merchant.mchid != merchant.mchid && p.merchant.apiv3_digest == merchant.apiv3_digest
        })?;
        Some(format!(
            "merchant {} holds the platform key {serial} with the same APIv3 key: a notification under it would open for both",
            other.merchant.mchid
        ))
    }
}

/// A sub-merchant (特约商户) served by a service provider's keys.
#[derive(Debug)]
pub struct SubMerchant {
    pub sub_mchid: String,
    /// The service provider's `mchid`.
    pub sp_mchid: String,
    /// Its `sub_appid`s.
    pub appids: Vec<String>,
}

impl std::fmt::Debug for WechatPay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut serials: Vec<String> = self.all_keys().into_iter().map(|(s, _)| s).collect();
        serials.dedup();
        f.debug_struct("WechatPay")
            .field("serials", &serials)
            .finish()
    }
}

/// A read of a lock whose writers cannot leave it half written (they only insert whole
/// entries), so a poisoned one is read as it is.
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl WechatPay {
    /// What the channel knows now: an `Arc` taken in nanoseconds, never waiting for a change
    /// being built.
    pub(super) fn book(&self) -> Arc<Book> {
        Arc::clone(&read(&self.book))
    }

    /// Builds the next book from the current one and swaps it in. Changes are rare (an
    /// account added, a key downloaded); the maps hold `Arc`s, so the copy is shallow.
    pub(super) fn change<T>(&self, edit: impl FnOnce(&mut Book) -> T) -> T {
        let mut book = write(&self.book);
        let mut next = Book::clone(&book);
        let out = edit(&mut next);
        *book = Arc::new(next);
        out
    }

    /// The platform keys `serial` names (any case), usable or not: one merchant's, or one
    /// entry per merchant of a shared platform certificate.
    pub(super) fn holders(&self, serial: &str) -> Option<Holders> {
        self.book().keys.get(&serial.to_ascii_uppercase()).cloned()
    }

    /// `mchid`'s platform key `serial` (any case), usable or not.
    pub(super) fn key_of(&self, serial: &str, mchid: &str) -> Option<Arc<PlatformVerifier>> {
        self.book()
            .key_of(&serial.to_ascii_uppercase(), mchid)
            .cloned()
    }

    /// Every platform key with its serial, sorted by serial, then merchant.
    pub(super) fn all_keys(&self) -> Vec<(String, Arc<PlatformVerifier>)> {
        let mut all: Vec<(String, Arc<PlatformVerifier>)> = self
            .book()
            .keys
            .iter()
            .flat_map(|(s, held)| held.iter().map(|p| (s.clone(), Arc::clone(p))))
            .collect();
        all.sort_by(|a, b| (&a.0, &a.1.merchant.mchid).cmp(&(&b.0, &b.1.merchant.mchid)));
        all
    }

    /// The serials of `mchid`'s keys usable at `now`.
    pub(super) fn serials_of(&self, mchid: &str, now: Timestamp) -> Vec<String> {
        self.all_keys()
            .into_iter()
            .filter(|(_, p)| p.merchant.mchid == mchid && p.usable_at(now))
            .map(|(s, _)| s)
            .collect()
    }

    /// The key a sensitive field sent to WeChat is encrypted with, and its serial: of
    /// `mchid`'s keys usable at `now`, its WeChat Pay public key (WeChat moves merchants from
    /// certificates to these), else its certificate that took effect last.
    pub(super) fn encryption_key(
        &self,
        mchid: &str,
        now: Timestamp,
    ) -> Option<(String, Arc<PlatformVerifier>)> {
        self.all_keys()
            .into_iter()
            .filter(|(_, p)| p.merchant.mchid == mchid && p.usable_at(now))
            .max_by_key(|(serial, p)| {
                let newest = p.effective_at.map(|at| at.unix_seconds());
                // A public key has no validity: it outranks every certificate; among
                // equals, the first serial in order wins (max_by_key keeps the last).
                (newest.is_none(), newest, std::cmp::Reverse(serial.clone()))
            })
    }

    pub(super) fn merchant(&self, mchid: &str) -> Option<Arc<Merchant>> {
        self.book().merchants.get(mchid).cloned()
    }

    /// Every enabled merchant with its own keys, by mchid.
    pub(super) fn merchants(&self) -> Vec<Arc<Merchant>> {
        let mut all: Vec<Arc<Merchant>> = self.book().merchants.values().cloned().collect();
        all.sort_by(|a, b| a.mchid.cmp(&b.mchid));
        all
    }

    /// Adds (or replaces) a merchant's downloaded key; whether the merchant did not hold its
    /// serial before. A configured key of the merchant with the same serial stays:
    /// configuration wins. A merchant that is not here (any more) learns nothing, and the
    /// key opens with the merchant's current APIv3 key (a download may outlive a rotation).
    pub(super) fn learn(&self, serial: &str, mut key: PlatformVerifier) -> bool {
        let serial = serial.to_ascii_uppercase();
        self.change(|book| {
            let Some(merchant) = book.merchants.get(&key.merchant.mchid) else {
                return false;
            };
            key.merchant = Arc::clone(merchant);
            let known = book.key_of(&serial, &key.merchant.mchid).map(|k| k.origin);
            if known == Some(KeyOrigin::Configured) {
                return false;
            }
            book.put_key(serial, Arc::new(key));
            known.is_none()
        })
    }

    /// Records a download of `mchid`'s certificates at `at` (the latest one counts).
    pub(super) fn mark_refreshed(&self, mchid: &str, at: Timestamp) {
        let mut refreshed = write(&self.refreshed);
        let latest = refreshed.entry(mchid.to_owned()).or_insert(at);
        if at.unix_seconds() > latest.unix_seconds() {
            *latest = at;
        }
    }

    /// When `mchid`'s certificates were last downloaded, by this process or (read from
    /// `platform_certificate`) another.
    pub(super) fn last_refresh(&self, mchid: &str) -> Option<Timestamp> {
        read(&self.refreshed).get(mchid).copied()
    }
}

/// What verification hands to decoding: the merchant and the decrypted resource.
#[derive(Debug)]
pub struct Verified {
    merchant: Arc<Merchant>,
    event_type: String,
    plaintext: Vec<u8>,
    /// The account a per-account notify path named.
    account: Option<String>,
}

impl Verified {
    /// The decrypted `resource`, exactly as WeChat encrypted it.
    pub fn plaintext(&self) -> &[u8] {
        &self.plaintext
    }
}

impl WechatPay {
    /// Loads every merchant's configured keys once, at start-up. `now` decides certificate
    /// expiry. A merchant whose certificates are downloaded may have none configured.
    pub fn from_settings(settings: &WechatSettings, now: Timestamp) -> Result<Self, ConfigError> {
        let mut book = Book::default();
        let mut merchants = Vec::new();
        for (i, m) in settings.merchants.iter().enumerate() {
            let prefix = format!("wechat.merchants[{i}]");
            let appids = m.all_appids();
            if appids.iter().all(|id| id.is_empty()) {
                return Err(invalid(
                    format!("{prefix}.appid"),
                    "set appid or appids: the apps bound to this mchid",
                ));
            }
            if merchants
                .iter()
                .any(|known: &Arc<Merchant>| known.mchid == m.mchid)
            {
                return Err(invalid(
                    format!("{prefix}.mchid"),
                    format!("{} is configured twice", m.mchid),
                ));
            }
            let merchant = Merchant::new(m.mchid.clone(), appids, m.apiv3_key.expose().as_bytes())
                .map(Arc::new)
                .ok_or_else(|| {
                    invalid(format!("{prefix}.apiv3_key"), "must be exactly 32 bytes")
                })?;
            merchants.push(Arc::clone(&merchant));
            if m.platform_keys.is_empty() && !m.downloads() {
                return Err(invalid(
                    format!("{prefix}.platform_keys"),
                    "at least one key is needed (or certificates = \"download\" with API credentials)",
                ));
            }
            // This merchant's serials: it holds nothing in the book yet.
            let mut serials = std::collections::HashSet::new();
            for (j, k) in m.platform_keys.iter().enumerate() {
                let key_name = format!("{prefix}.platform_keys[{j}]");
                let (serial, entry) = match (&k.public_key_file, &k.certificate_file) {
                    (Some(path), None) => {
                        let serial = k.serial.clone().ok_or_else(|| {
                            invalid(
                                format!("{key_name}.serial"),
                                "required with public_key_file",
                            )
                        })?;
                        let key =
                            keys::public_key_file(&format!("{key_name}.public_key_file"), path)?;
                        (
                            serial,
                            PlatformVerifier {
                                key,
                                merchant: Arc::clone(&merchant),
                                origin: KeyOrigin::Configured,
                                effective_at: None,
                                expire_at: None,
                                fetched_at: None,
                            },
                        )
                    }
                    (None, Some(path)) => {
                        let name = format!("{key_name}.certificate_file");
                        let cert = keys::read_certificate(&name, path, now)?;
                        if let Some(given) = &k.serial
                            && !given.eq_ignore_ascii_case(&cert.serial)
                        {
                            return Err(invalid(
                                format!("{key_name}.serial"),
                                format!(
                                    "{given} differs from the certificate's serial {}",
                                    cert.serial
                                ),
                            ));
                        }
                        (
                            cert.serial,
                            PlatformVerifier {
                                key: cert.key,
                                merchant: Arc::clone(&merchant),
                                origin: KeyOrigin::Configured,
                                effective_at: Some(cert.not_before),
                                expire_at: Some(cert.not_after),
                                fetched_at: None,
                            },
                        )
                    }
                    _ => {
                        return Err(invalid(
                            key_name,
                            "set exactly one of public_key_file and certificate_file",
                        ));
                    }
                };
                let serial = serial.to_ascii_uppercase();
                if !serials.insert(serial.clone()) {
                    return Err(invalid(
                        format!("{key_name}.serial"),
                        format!("{serial} is configured twice"),
                    ));
                }
                if let Some(why) = book.conflicting(&serial, &merchant.mchid, &entry.key) {
                    return Err(invalid(format!("{key_name}.serial"), why));
                }
                if let Some(why) = book.ambiguous(&serial, &merchant) {
                    return Err(invalid(format!("{prefix}.apiv3_key"), why));
                }
                book.add_key(serial, Arc::new(entry));
            }
        }
        let file = merchants.iter().map(|m| m.mchid.clone()).collect();
        book.merchants = merchants
            .into_iter()
            .map(|m| (m.mchid.clone(), m))
            .collect();
        Ok(Self {
            file,
            book: RwLock::new(Arc::new(book)),
            refreshed: RwLock::new(HashMap::new()),
        })
    }
}

#[cfg(feature = "fuzzing")]
impl WechatPay {
    /// Fuzzing only (the `fuzzing` feature, never in the service): [`Channel::admit`]'s
    /// steps after the signature check, for a body as if signed with the key `serial`.
    pub fn admit_signed_body(&self, serial: &str, body: &[u8]) -> Result<Notice, Rejection> {
        let holders = self.holders(serial).ok_or_else(|| {
            Rejection::UnknownSerial(format!("unknown Wechatpay-Serial {serial}"))
        })?;
        let merchants: Vec<Arc<Merchant>> =
            holders.iter().map(|p| Arc::clone(&p.merchant)).collect();
        self.open(&merchants, serial, body, None, &mut super::Halt)
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

// The OpenAPI text of `PAY_ROUTE` (served by the HTTP room's one notify handler); a line
// comment, since utoipa would publish a doc comment as the summary.
#[utoipa::path(post, path = "/notify/wechat/pay", tag = "notify",
    description = "WeChat Pay API v3 payment result (TRANSACTION.SUCCESS). Authenticated by the Wechatpay-* signature headers over the raw body.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, or recorded anomaly (including a second payment under the same key)"),
        (status = 400, description = "Missing header, malformed body or field, unsupported signature type; a signed REFUND.* or MCHTRANSFER.* event (wrong_event_type: refunds go to /notify/wechat/refund, transfers to /notify/wechat/transfer)", body = WechatFail),
        (status = 401, description = "Bad or missing signature, unknown serial, probe, stale timestamp", body = WechatFail),
        (status = 404, description = "Unknown order (WeChat retries)", body = WechatFail),
        (status = 409, description = "The same payment or refund as before (same transaction id or refund key) with other amount, currency or merchant", body = WechatFail),
        (status = 413, description = "Body larger than server.max_body_bytes", body = WechatFail),
        (status = 500, description = "Signature valid, resource does not decrypt (our apiv3_key is wrong)", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
#[allow(dead_code)]
fn wechat_pay() {}

// The OpenAPI text of `REFUND_ROUTE`.
#[utoipa::path(post, path = "/notify/wechat/refund", tag = "notify",
    description = "WeChat Pay API v3 refund result (REFUND.SUCCESS, REFUND.ABNORMAL, REFUND.CLOSED); answers as /notify/wechat/pay.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, recorded anomaly, or acknowledged without change"),
        (status = 400, description = "Bad request; a signed TRANSACTION.* or MCHTRANSFER.* event (wrong_event_type: payments go to /notify/wechat/pay, transfers to /notify/wechat/transfer)", body = WechatFail),
        (status = 401, description = "Bad signature or stale", body = WechatFail),
        (status = 404, description = "Unknown order, or its payment not in yet", body = WechatFail),
        (status = 409, description = "The same payment or refund as before (same transaction id or refund key) with other amount, currency or merchant", body = WechatFail),
        (status = 413, description = "Body too large", body = WechatFail),
        (status = 500, description = "Resource does not decrypt", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
#[allow(dead_code)]
fn wechat_refund() {}

// The OpenAPI text of `TRANSFER_ROUTE`.
#[utoipa::path(post, path = "/notify/wechat/transfer", tag = "notify",
    description = "WeChat Pay API v3 merchant transfer result (MCHTRANSFER.BILL.FINISHED: SUCCESS, FAIL, CANCELLED); verified as /notify/wechat/pay.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, or recorded anomaly (TRANSFER_ANOMALY: a transfer never started here, another amount or merchant)"),
        (status = 400, description = "Bad request; any other event type (wrong_event_type: payments go to /notify/wechat/pay, refunds to /notify/wechat/refund)", body = WechatFail),
        (status = 401, description = "Bad signature, unknown serial or stale", body = WechatFail),
        (status = 413, description = "Body too large", body = WechatFail),
        (status = 500, description = "Resource does not decrypt", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
#[allow(dead_code)]
fn wechat_transfer() {}

// The OpenAPI text of `PAY_ACCOUNT_ROUTE`.
#[utoipa::path(post, path = "/notify/wechat/pay/{account}", tag = "notify",
    description = "As /notify/wechat/pay, verified with the keys of the account the path names only (a sub-merchant's: its service provider's). Register it when several merchants share a platform certificate.",
    params(("account" = String, Path, description = "A mchid, or a sub-merchant's sub_mchid")),
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "As /notify/wechat/pay"),
        (status = 401, description = "Bad signature, a key not of this account, or an account not enabled here (unknown_merchant)", body = WechatFail)))]
#[allow(dead_code)]
fn wechat_pay_account() {}

// The OpenAPI text of `REFUND_ACCOUNT_ROUTE`.
#[utoipa::path(post, path = "/notify/wechat/refund/{account}", tag = "notify",
    description = "As /notify/wechat/refund, verified with the keys of the account the path names only.",
    params(("account" = String, Path, description = "A mchid, or a sub-merchant's sub_mchid")),
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "As /notify/wechat/refund"),
        (status = 401, description = "Bad signature, a key not of this account, or an account not enabled here (unknown_merchant)", body = WechatFail)))]
#[allow(dead_code)]
fn wechat_refund_account() {}

/// The OpenAPI description of the notify routes.
#[derive(OpenApi)]
#[openapi(
    paths(
        wechat_pay,
        wechat_refund,
        wechat_transfer,
        wechat_pay_account,
        wechat_refund_account
    ),
    components(schemas(WechatFail))
)]
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
    let client = Arc::new(WechatApi::from_settings(
        Arc::clone(&built),
        settings,
        reconcile,
    )?);
    let keys = Arc::new(certificates::WechatKeys {
        channel: Arc::clone(&built),
        api: Arc::clone(&client),
    });
    let bills: Arc<dyn super::bill::BillSource> = client.clone();
    let api: Arc<dyn ProviderApi> = client.clone();
    let accounts = Arc::new(accounts::WechatBook {
        channel: Arc::clone(&built),
        api: client,
    });
    let channel: Arc<dyn super::Endpoint> = built;
    let routes = [
        PAY_ROUTE,
        REFUND_ROUTE,
        TRANSFER_ROUTE,
        PAY_ACCOUNT_ROUTE,
        REFUND_ACCOUNT_ROUTE,
    ]
    .into_iter()
    .map(|path| super::NotifyRoute {
        path,
        channel: Arc::clone(&channel),
    })
    .collect();
    Ok(Mounted {
        routes,
        provider,
        api: Some(api),
        keys: Some(keys),
        bills: Some(bills),
        accounts,
    })
}
