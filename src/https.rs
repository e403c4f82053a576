//! The HTTPS client every outbound call is made with (the providers' APIs, the HTTP sink):
//! rustls on ring (neither aws-lc nor OpenSSL is linked), the system roots plus an optional
//! CA file, connect and request timeouts, and endpoint URLs that must be `https://`.

use std::sync::Once;
use std::time::Duration;

use crate::config::value::{ConfigError, invalid};

/// Makes ring the process's rustls provider (once): reqwest is built without one, so that
/// neither aws-lc nor OpenSSL is linked.
pub fn install_crypto() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // An error means a provider is installed already; that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Checks a provider endpoint from the configuration (`key` names it in the error): `https://`,
/// or `http://` to a loopback address (a stand-in on this machine). Over plain HTTP anyone on
/// the path answers for the provider, and a "closed" answer closes an order that stays payable.
pub fn provider_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| invalid(key, format!("{url} is not an https URL: {e}")))?;
    let loopback = is_loopback(&parsed);
    match parsed.scheme() {
        "https" if parsed.host_str().is_some() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(invalid(
            key,
            format!("{url}: use https:// (plain http:// only to a loopback stand-in)"),
        )),
        _ => Err(invalid(key, format!("{url} is not an https URL"))),
    }
}

/// Whether `url` names this machine (`localhost`, `127.0.0.0/8`, `[::1]`): a stand-in that
/// may be spoken to over plain HTTP.
pub fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host_str() {
        Some(host) if host.eq_ignore_ascii_case("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// How the provider clients connect (from `[provider_api]`).
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub connect_timeout_ms: u64,
    pub timeout_ms: u64,
    /// Extra trusted CA certificates (PEM), beside the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Requests per second to one provider.
    pub max_qps: u32,
}

/// The extra CA certificates of `provider_api.ca_file`.
fn extra_roots(settings: &ClientSettings) -> Result<Vec<reqwest::Certificate>, ConfigError> {
    let Some(path) = &settings.ca_file else {
        return Ok(Vec::new());
    };
    let pem = std::fs::read(path).map_err(|e| {
        invalid(
            "provider_api.ca_file",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        invalid(
            "provider_api.ca_file",
            format!("{}: not PEM certificates: {e}", path.display()),
        )
    })?;
    if certs.is_empty() {
        return Err(invalid(
            "provider_api.ca_file",
            format!("{}: no certificate in it", path.display()),
        ));
    }
    Ok(certs)
}

/// A client builder with the TLS settings of `[provider_api]`: the system's roots plus
/// `ca_file`, and `connect_timeout_ms`. The provider clients and the `http` relay sink start
/// from it.
pub fn client_builder(settings: &ClientSettings) -> Result<reqwest::ClientBuilder, ConfigError> {
    install_crypto();
    Ok(reqwest::Client::builder()
        .user_agent(concat!("paynotify/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
        .tls_certs_merge(extra_roots(settings)?))
}

/// The provider clients' HTTPS client: [`client_builder`] with `timeout_ms` for the whole
/// request, and no redirects followed: a signed request goes only where it was addressed,
/// and a bill is downloaded only from the URL its signed answer gave.
pub fn http_client(settings: &ClientSettings) -> Result<reqwest::Client, ConfigError> {
    client_builder(settings)?
        .timeout(Duration::from_millis(settings.timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| invalid("reconcile", format!("cannot build the HTTPS client: {e}")))
}
