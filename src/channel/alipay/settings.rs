//! `[alipay]`: the apps, their keys and API credentials.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::value::{ConfigError, Validate, invalid};

/// The hosts Alipay serves bill files from: `dwbillcenter.alipay.com`, and
/// `dwbillcenter.alipaydev.com` for the sandbox.
pub const BILL_HOSTS: [&str; 2] = ["dwbillcenter.alipay.com", "dwbillcenter.alipaydev.com"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlipaySettings {
    pub apps: Vec<AlipayApp>,
    /// The only hosts a `bill_download_url` may name (host names, no scheme or port). An
    /// Alipay bill carries no hash or signature: what vouches for it is that it comes over
    /// HTTPS from one of these (Alipay's `http://` URL is fetched as `https://`; plain HTTP
    /// only from a loopback stand-in).
    pub bill_hosts: Vec<String>,
}

impl Default for AlipaySettings {
    fn default() -> Self {
        Self {
            apps: Vec::new(),
            bill_hosts: BILL_HOSTS.iter().map(|h| (*h).to_owned()).collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlipayApp {
    pub app_id: String,
    pub seller_id: String,
    pub alipay_public_key_file: Option<PathBuf>,
    pub alipay_cert_file: Option<PathBuf>,
    /// The app private key. With it, this app's unpaid orders are queried and closed at
    /// Alipay (`crate::reconcile`).
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
/// (`Alipay::from_settings`, `AlipayApi::from_settings`). `bill_hosts` is checked here.
impl Validate for AlipaySettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.bill_hosts.is_empty() {
            return Err(invalid(
                "alipay.bill_hosts",
                format!("must name at least one host ({})", BILL_HOSTS[0]),
            ));
        }
        for host in &self.bill_hosts {
            let bare = !host.is_empty()
                && host.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'
                });
            if !bare {
                return Err(invalid(
                    "alipay.bill_hosts",
                    format!(
                        "{host:?} is not a lower-case host name without scheme, port or path ({})",
                        BILL_HOSTS[0]
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bill_hosts_are_bare_host_names() {
        let with = |hosts: &[&str]| AlipaySettings {
            bill_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            ..AlipaySettings::default()
        };
        assert!(AlipaySettings::default().validate().is_ok());
        assert!(
            with(&["dwbillcenter.alipay.com", "127.0.0.1"])
                .validate()
                .is_ok()
        );
        for bad in [
            &[][..],
            &["http://dwbillcenter.alipay.com"],
            &["dwbillcenter.alipay.com:443"],
            &["dwbillcenter.alipay.com/"],
            &["DWBILLCENTER.alipay.com"],
            &[""],
        ] {
            let e = with(bad).validate().expect_err("refused");
            assert!(e.to_string().contains("alipay.bill_hosts"), "{bad:?}: {e}");
        }
    }
}
