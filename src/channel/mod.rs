//! The seam every payment provider plugs into: verify the raw request, decode it into a
//! [`Notice`], and answer in the provider's own shape. The core never sees provider details.
//!
//! A provider is one file here: its settings, its key loading, its [`Channel`] impl, its
//! notify routes with their OpenAPI description, and a `mount`. [`PROVIDERS`] lists them
//! all; `docs/design.md` has the checklist for adding one.

use actix_web::http::header::HeaderMap;
use actix_web::web;

use utoipa::OpenApi;

use crate::config::{ConfigError, Settings};
use crate::notice::{ChannelId, Notice};
use crate::time::Timestamp;

pub mod alipay;
pub mod keys;
pub mod wechat;

/// One notification exactly as it arrived: nothing in it is trusted yet.
#[derive(Debug, Clone, Copy)]
pub struct Inbound<'a> {
    pub headers: &'a HeaderMap,
    /// The raw body bytes: signatures are over these, never over a re-serialised form.
    pub body: &'a [u8],
    pub now: Timestamp,
}

/// Why a notification was refused before it reached the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Bad or missing signature, unknown key serial or app, a signature probe: 401.
    #[error("bad signature: {0}")]
    BadSignature(String),
    /// Timestamp outside the provider's window: 401.
    #[error("stale: {0}")]
    Stale(String),
    /// Missing header, malformed body, missing field, bad amount: 400.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Signature valid but the payload does not decrypt with our key: 500, so the provider
    /// retries while an operator fixes the key.
    #[error("cannot decrypt: {0}")]
    Undecryptable(String),
}

impl Rejection {
    /// The HTTP status the provider is answered with.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadSignature(_) | Self::Stale(_) => 401,
            Self::BadRequest(_) => 400,
            Self::Undecryptable(_) => 500,
        }
    }

    /// A short name for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadSignature(_) => "bad_signature",
            Self::Stale(_) => "stale",
            Self::BadRequest(_) => "bad_request",
            Self::Undecryptable(_) => "undecryptable",
        }
    }
}

/// The answer to send, before the provider's shape is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// Accepted (first delivery, duplicate, anomaly recorded): the provider stops retrying.
    Success,
    /// Anything else: the provider retries (or a forger learns nothing useful).
    Failure { status: u16, message: &'a str },
}

/// A provider's answer in its own shape, as plain data: the route turns it into a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// `None` for an empty body.
    pub content_type: Option<&'static str>,
    pub body: Vec<u8>,
}

impl Answer {
    /// A status and no body (WeChat's `204`).
    pub fn empty(status: u16) -> Self {
        Self {
            status,
            content_type: None,
            body: Vec::new(),
        }
    }

    pub fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: Some("text/plain"),
            body: body.as_bytes().to_vec(),
        }
    }

    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Self {
            status,
            content_type: Some("application/json"),
            body: body.to_string().into_bytes(),
        }
    }
}

/// A payment provider's notify endpoint.
pub trait Channel: Send + Sync + 'static {
    /// What verification hands to decoding (for WeChat, the decrypted resource).
    type Verified;

    fn id(&self) -> ChannelId;

    /// Authenticates the request over its raw bytes. Runs before any lookup or write.
    fn verify(&self, request: &Inbound<'_>) -> Result<Self::Verified, Rejection>;

    /// Turns what was verified into a notice, checking fields, amounts and merchant ids.
    fn decode(&self, verified: Self::Verified) -> Result<Notice, Rejection>;

    /// Renders `reply` the way the provider expects it.
    fn render(&self, reply: Reply<'_>) -> Answer;
}

/// Registers a provider's notify routes (with its channel as their app data) on each worker.
pub type Mount = Box<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

/// How the service knows a provider: it builds the provider's channel from its settings
/// (loading keys once, at start-up) and describes its notify routes.
pub struct Registration {
    pub build: fn(&Settings, Timestamp) -> Result<Mount, ConfigError>,
    pub openapi: fn() -> utoipa::openapi::OpenApi,
}

/// Every provider of this build: a new provider is one more entry here.
pub const PROVIDERS: [Registration; 2] = [
    Registration {
        build: |s, now| wechat::mount(&s.wechat, now),
        openapi: wechat::NotifyApi::openapi,
    },
    Registration {
        build: |s, now| alipay::mount(&s.alipay, now),
        openapi: alipay::NotifyApi::openapi,
    },
];

/// Builds every provider's routes; the first bad key or setting stops start-up.
pub fn mount_all(settings: &Settings, now: Timestamp) -> Result<Vec<Mount>, ConfigError> {
    PROVIDERS.iter().map(|p| (p.build)(settings, now)).collect()
}
