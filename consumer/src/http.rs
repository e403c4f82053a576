//! paynotify's http sink (`relay.sink = "http"`): the signature checked, 2xx only after
//! the handler committed.
//!
//! SEAM (replaced by the implementation): the public surface the example and the docs use.

use std::time::Duration;

use crate::{Event, Handler};

/// Checks `Paynotify-Signature: t={unix},v1={hex HMAC-SHA256(secret, "{t}.{body}")}`.
#[derive(Clone)]
pub struct Verifier {
    _tolerance: Duration,
}

/// Why a delivery was refused (401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no Paynotify-Signature header")]
    Missing,
}

impl Verifier {
    /// `secret`: paynotify's `relay.http_secret`. Timestamps older or newer than 5 minutes
    /// are refused.
    pub fn new(_secret: &[u8]) -> Self {
        Self {
            _tolerance: Duration::from_secs(300),
        }
    }

    /// The event, if `header` signs `body` within the window around `now`.
    pub fn verify(
        &self,
        _header: Option<&str>,
        _body: &[u8],
        _now: std::time::SystemTime,
    ) -> Result<Event, Refusal> {
        unimplemented!("SEAM")
    }
}

/// An actix-web resource at `path` taking paynotify's POSTs: 401 for a forged or stale
/// delivery (nothing runs), 200 once the handler returned `Ok` (committed), 503 for a
/// transient failure and 422 for a permanent one (paynotify retries both and parks the
/// message dead at its `relay.max_attempts`).
pub fn resource<H: Handler>(_path: &str, _verifier: Verifier, _handler: H) -> actix_web::Resource {
    unimplemented!("SEAM")
}
