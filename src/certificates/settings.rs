//! `[certificates]`: how often downloaded platform certificates are fetched again.

use serde::Deserialize;

use crate::config::value::{ConfigError, Validate, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CertificateSettings {
    /// Every downloading merchant's certificates are fetched again this often.
    pub refresh_secs: u64,
    /// A notification or answer naming an unknown serial makes a merchant's certificates be
    /// fetched at most this often.
    pub on_unknown_serial_secs: u64,
}

impl Default for CertificateSettings {
    fn default() -> Self {
        Self {
            refresh_secs: 43_200,
            on_unknown_serial_secs: 60,
        }
    }
}

impl Validate for CertificateSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(60..=604_800).contains(&self.refresh_secs) {
            return Err(invalid(
                "certificates.refresh_secs",
                "must be between 60 and 604800 (a week)",
            ));
        }
        if !(1..=86_400).contains(&self.on_unknown_serial_secs) {
            return Err(invalid(
                "certificates.on_unknown_serial_secs",
                "must be between 1 and 86400",
            ));
        }
        Ok(())
    }
}
