//! Every payment provider of this build, and how the service builds them from its settings.
//! A new provider is its folder under `channel/` and one entry in [`PROVIDERS`].

use utoipa::OpenApi;

use crate::channel::{Mounted, alipay, wechat};
use crate::config::{ConfigError, Settings};
use crate::https::ClientSettings;
use crate::time::Timestamp;

/// How the service knows a provider: it builds the provider's channel from its settings
/// (loading keys once, at start-up) and describes its notify routes.
pub struct Registration {
    pub build: fn(&Settings, Timestamp) -> Result<Mounted, ConfigError>,
    pub openapi: fn() -> utoipa::openapi::OpenApi,
}

/// How every provider's API client connects, from `[provider_api]`.
pub fn client_settings(settings: &Settings) -> ClientSettings {
    let r = &settings.provider_api;
    ClientSettings {
        connect_timeout_ms: r.connect_timeout_ms,
        timeout_ms: r.timeout_ms,
        ca_file: r.ca_file.clone(),
        max_qps: r.max_qps,
    }
}

/// Every provider of this build: a new provider is one more entry here.
pub const PROVIDERS: [Registration; 2] = [
    Registration {
        build: |s, now| wechat::mount(&s.wechat, &client_settings(s), now),
        openapi: wechat::NotifyApi::openapi,
    },
    Registration {
        build: |s, now| alipay::mount(&s.alipay, &client_settings(s), now),
        openapi: alipay::NotifyApi::openapi,
    },
];

/// Builds every provider's routes; the first bad key or setting stops start-up.
pub fn mount_all(settings: &Settings, now: Timestamp) -> Result<Vec<Mounted>, ConfigError> {
    PROVIDERS.iter().map(|p| (p.build)(settings, now)).collect()
}
