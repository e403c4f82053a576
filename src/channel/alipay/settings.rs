//! `[alipay]`: the apps, their keys and API credentials.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::value::Validate;

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
    /// Certificate mode with API credentials: the app's public-key certificate
    /// (`appCertPublicKey_<app_id>.crt`), whose SN every request carries as `app_cert_sn`.
    #[serde(default)]
    pub app_cert_file: Option<PathBuf>,
    /// Certificate mode with API credentials: Alipay's root certificates
    /// (`alipayRootCert.crt`), whose RSA entries' SNs every request carries as
    /// `alipay_root_cert_sn`.
    #[serde(default)]
    pub alipay_root_cert_file: Option<PathBuf>,
    /// The OpenAPI gateway; `https://openapi.alipay.com/gateway.do` when absent.
    #[serde(default)]
    pub gateway: Option<String>,
}

/// Every check of an app needs its key files: they are made as the channel loads them
/// (`Alipay::from_settings`, `AlipayApi::from_settings`).
impl Validate for AlipaySettings {}
