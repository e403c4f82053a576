//! Platform keys a provider hands out itself: WeChat Pay's platform certificates, downloaded
//! with `GET /v3/certificates` and renewed before they expire. The neutral side: what a
//! download brings, what is stored, and the [`KeySource`] a provider's API client implements
//! so `crate::certificates` can keep its keys fresh without knowing the provider.

use serde::Serialize;

use super::api::{ApiFuture, Failure};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// One downloaded platform certificate, checked (decrypted, parsed, its serial the one
/// announced, not expired, an RSA key): a row of `platform_certificate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformCertificate {
    pub channel: ChannelId,
    /// The merchant it belongs to (WeChat `mchid`).
    pub account: String,
    /// Upper-case hex, as `Wechatpay-Serial` names it.
    pub serial: String,
    /// The certificate, PEM.
    pub pem: String,
    pub effective_at: Timestamp,
    pub expire_at: Timestamp,
    pub fetched_at: Timestamp,
}

/// What one download brought: the certificates that passed every check, and why each of the
/// others was refused.
#[derive(Debug, Clone, Default)]
pub struct Download {
    pub certificates: Vec<PlatformCertificate>,
    pub refused: Vec<String>,
    /// No key of this merchant was known, so the answer was verified with a certificate it
    /// carries (what the providers' SDKs do on first use).
    pub first_use: bool,
}

/// Where a key a channel verifies with came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyOrigin {
    /// A file named in the configuration (`platform_keys`).
    Configured,
    /// Downloaded from the provider (or read from `platform_certificate`).
    Downloaded,
}

impl KeyOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Configured => "configured",
            Self::Downloaded => "downloaded",
        }
    }
}

/// A key a channel verifies with, as `GET /admin/certificates` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct KnownKey {
    #[schema(value_type = String)]
    pub channel: ChannelId,
    pub mchid: String,
    pub serial: String,
    pub source: KeyOrigin,
    /// `null` for a public key (`PUB_KEY_ID_…`), which has no validity period.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub effective_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub expire_at: Option<Timestamp>,
    /// When it was last downloaded; `null` for a configured key.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub fetched_at: Option<Timestamp>,
}

/// A provider whose platform keys can be downloaded: its API client, for the merchants set
/// to download them.
pub trait KeySource: Send + Sync + 'static {
    fn channel(&self) -> ChannelId;

    /// The merchants whose keys are downloaded (`certificates = "download"`).
    fn downloading(&self) -> Vec<String>;

    /// Downloads the platform certificates of `account` and checks each; the answer itself
    /// must verify (see [`Download::first_use`]).
    fn download<'a>(
        &'a self,
        account: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Download, Failure>>;

    /// Verifies with `certificates` from now on (downloaded now, or read from the table);
    /// returns how many were not known before. A certificate that no longer parses, of a
    /// merchant not configured, or expired at `now` is skipped, with a warning.
    fn install(&self, certificates: &[PlatformCertificate], now: Timestamp) -> usize;

    /// Records that `account`'s certificates were downloaded at `at`, for `explain` (the
    /// latest `fetched_at` installed counts as well).
    fn refreshed(&self, account: &str, at: Timestamp);

    /// Every key the channel verifies with, configured and downloaded, by merchant and serial.
    fn keys(&self) -> Vec<KnownKey>;
}
