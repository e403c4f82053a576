//! `[wechat]`: the merchants, their keys and API credentials.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::value::{ConfigError, Secret, Validate, invalid};

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
    /// merchant's unpaid orders are queried and closed at WeChat Pay (`crate::reconcile`).
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// The serial number of the merchant API certificate that goes with `private_key_file`.
    #[serde(default)]
    pub merchant_serial: Option<String>,
    /// WeChat Pay API v3's base URL; `https://api.mch.weixin.qq.com` when absent.
    #[serde(default)]
    pub api_base: Option<String>,
    /// Whether this merchant's platform certificates are downloaded (`GET /v3/certificates`)
    /// and kept fresh, or only `platform_keys` are used; download when absent and the
    /// merchant has API credentials.
    #[serde(default)]
    pub certificates: Option<CertificateMode>,
}

/// `wechat.merchants[].certificates`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CertificateMode {
    Download,
    Static,
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

    /// Whether this merchant's platform certificates are downloaded.
    pub fn downloads(&self) -> bool {
        match self.certificates {
            Some(mode) => mode == CertificateMode::Download,
            None => self.private_key_file.is_some(),
        }
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

/// What can be checked without reading key files; the keys are checked as the channel loads
/// them (`WechatPay::from_settings`).
impl Validate for WechatSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        for (i, m) in self.merchants.iter().enumerate() {
            if m.apiv3_key.expose().len() != 32 {
                return Err(invalid(
                    format!("wechat.merchants[{i}].apiv3_key"),
                    "must be exactly 32 bytes",
                ));
            }
            if m.certificates == Some(CertificateMode::Download) && m.private_key_file.is_none() {
                return Err(invalid(
                    format!("wechat.merchants[{i}].certificates"),
                    "\"download\" needs the merchant's API credentials (private_key_file, merchant_serial) to sign GET /v3/certificates; set them, or \"static\"",
                ));
            }
        }
        Ok(())
    }
}
