//! The seam every payment provider plugs into: verify the raw request, decode it into a
//! [`Notice`], and answer in the provider's own shape. The core never sees provider details.
//!
//! Adding a provider means one new file implementing [`Channel`] and one route line in
//! `startup`.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::HeaderMap;

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
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadSignature(_) | Self::Stale(_) => StatusCode::UNAUTHORIZED,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Undecryptable(_) => StatusCode::INTERNAL_SERVER_ERROR,
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
    Failure {
        status: StatusCode,
        message: &'a str,
    },
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
    fn render(&self, reply: Reply<'_>) -> HttpResponse;
}
