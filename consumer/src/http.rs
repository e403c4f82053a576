//! paynotify's http sink (`relay.sink = "http"`): the signature checked, 2xx only after
//! the handler committed.
//!
//! paynotify POSTs each event as JSON (`{id, topic, biz_key, payload, created_at}`) to
//! `relay.http_url` with
//!
//! ```text
//! Idempotency-Key: {topic}:{biz_key}
//! Paynotify-Signature: t={unix seconds},v1={hex HMAC-SHA256(relay.http_secret, "{t}.{body}")}
//! ```
//!
//! Any 2xx is a delivery; anything else, or no answer within 10 s, is retried with backoff
//! until `relay.max_attempts`, after which the row is dead (an operator can redrive it).
//!
//! [`Verifier::verify`] checks a delivery: the header parsed strictly, the timestamp within
//! a window around now (5 minutes either way by default, so a captured delivery cannot be
//! replayed later), the HMAC compared in constant time (`ring::hmac::verify`), and only
//! then the body decoded as an [`Event`]. [`SignedEvent`] is the same check as an actix-web
//! extractor for a handler of one's own; [`resource`] is the whole endpoint.
//!
//! # What each answer means
//!
//! | Status | When | The handler | paynotify |
//! |---|---|---|---|
//! | 200 | the handler returned `Ok`: its transaction committed (or the event was applied before) | ran | delivered |
//! | 401 | no, a malformed, a stale/future or a non-verifying `Paynotify-Signature` ([`Refusal::is_unauthenticated`]) | did not run | retries, then dead |
//! | 400 | the body is signed but is not an [`Event`], or could not be read | did not run | retries, then dead |
//! | 413 | the body is larger than the limit (256 KiB by default) | did not run | retries, then dead |
//! | 405 | not a POST ([`resource`] only) | did not run | — |
//! | 503 | [`Failure::Transient`] (nothing was applied; worth another try) | ran, rolled back | retries |
//! | 422 | [`Failure::Permanent`] (will never apply) | ran, rolled back | retries, then dead |
//! | 500 | the handler panicked, or no [`Verifier`] is configured for [`SignedEvent`] | — | retries |
//!
//! paynotify does not tell statuses apart: everything but a 2xx is retried up to its
//! attempt limit. A permanent failure is 422 (not a 2xx) so that the row ends dead, where an
//! operator sees it and can redrive it once the consumer is fixed, instead of counting as
//! delivered. Every refusal and failure is logged once at `warn` (a permanent failure at
//! `error`) with its reason; the error bodies are JSON `{"error": …, "reason": …}` and never
//! contain the secret or a signature.
//!
//! # Guarantees
//!
//! - A forged, stale, unsigned or tampered delivery changes nothing: the handler never sees
//!   it.
//! - A 2xx is answered only after [`Handler::handle`] returned `Ok`, which by its contract
//!   means the effect committed. A crash or a failed commit before that answers nothing or
//!   a non-2xx, and paynotify delivers again; deduplicate with [`crate::apply_once`] on
//!   [`Event::message_id`].
//! - The handler runs to completion on its own task even if paynotify hangs up first (its
//!   10 s timeout): a transaction is never cut off half-way by a closed connection, and the
//!   retry that follows finds the committed inbox row.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, dev::Payload, web};
use ring::hmac;

use crate::{Event, Failure, Handler};

/// The header paynotify signs its deliveries with.
pub const SIGNATURE_HEADER: &str = "Paynotify-Signature";
/// How far a delivery's `t=` may be from now, either way, by default.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
/// The largest body read by default (paynotify's events are a few hundred bytes).
pub const DEFAULT_BODY_LIMIT: usize = 256 * 1024;
/// The most `v1=` entries one header may carry (a sender rotating its secret sends two).
pub const MAX_SIGNATURES: usize = 8;

/// The length of one `v1=` value: hex of an HMAC-SHA256 tag.
const SIGNATURE_HEX_LEN: usize = 64;

/// Checks `Paynotify-Signature: t={unix},v1={hex HMAC-SHA256(secret, "{t}.{body}")}`.
///
/// It accepts one secret, or several while `relay.http_secret` is rotated
/// ([`Verifier::from_secrets`], [`Verifier::also_accept`]): add the new secret here, change
/// paynotify's, then drop the old one here once paynotify signs with the new one only.
///
/// Cheap to clone (the keys are shared). Its `Debug` does not show a secret.
#[derive(Clone)]
pub struct Verifier {
    keys: Arc<[hmac::Key]>,
    tolerance: Duration,
    body_limit: usize,
}

/// [`Verifier::from_secrets`] was given no secret: every delivery would be refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no secret given: every delivery would be refused")]
pub struct NoSecret;

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &format_args!("<{} redacted>", self.keys.len()))
            .field("tolerance", &self.tolerance)
            .field("body_limit", &self.body_limit)
            .finish()
    }
}

/// Why a delivery was refused.
///
/// The messages name what was wrong without the secret, the expected signature or the
/// header's value; they are what the sender is told in the error body and what is logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No `Paynotify-Signature` header (401).
    #[error("no Paynotify-Signature header")]
    Missing,
    /// The header is not `t={digits},v1={64 hex}[,v1=…]` (401); the reason says which part.
    #[error("malformed Paynotify-Signature header: {0}")]
    Malformed(&'static str),
    /// `t=` is older than the window allows (401): a replay, or a delivery that waited
    /// too long; paynotify signs each attempt anew.
    #[error("the signature timestamp is {age_secs} s old; at most {tolerance_secs} s is accepted")]
    Expired { age_secs: u64, tolerance_secs: u64 },
    /// `t=` is further in the future than the window allows (401): a clock out of step.
    #[error(
        "the signature timestamp is {ahead_secs} s in the future; at most {tolerance_secs} s is accepted"
    )]
    Future {
        ahead_secs: u64,
        tolerance_secs: u64,
    },
    /// No `v1=` verifies `"{t}.{body}"` under the secret (401): a forgery, a tampered
    /// body, or a different `relay.http_secret`.
    #[error("no v1 signature matches the body")]
    BadSignature,
    /// The signature verified but the body is not an [`Event`] (400): the sender and this
    /// crate disagree on the format; nothing was applied.
    #[error("the signed body is not an event: {0}")]
    NotAnEvent(String),
    /// The body is larger than the limit (413); only the extractor reads bodies.
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The body could not be read (400): the connection broke off, say.
    #[error("the body could not be read: {0}")]
    Unreadable(String),
}

impl Refusal {
    /// A refusal of the delivery's authenticity (401): the sender is not known to be
    /// paynotify, so nothing about the body was looked at.
    pub fn is_unauthenticated(&self) -> bool {
        matches!(
            self,
            Refusal::Missing
                | Refusal::Malformed(_)
                | Refusal::Expired { .. }
                | Refusal::Future { .. }
                | Refusal::BadSignature
        )
    }

    /// A short machine-readable name, the `error` of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Missing => "signature_missing",
            Refusal::Malformed(_) => "signature_malformed",
            Refusal::Expired { .. } => "signature_expired",
            Refusal::Future { .. } => "signature_in_future",
            Refusal::BadSignature => "signature_mismatch",
            Refusal::NotAnEvent(_) => "not_an_event",
            Refusal::TooLarge { .. } => "body_too_large",
            Refusal::Unreadable(_) => "body_unreadable",
        }
    }
}

impl ResponseError for Refusal {
    fn status_code(&self) -> StatusCode {
        match self {
            r if r.is_unauthenticated() => StatusCode::UNAUTHORIZED,
            Refusal::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if self.is_unauthenticated() {
            response.insert_header((
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(SIGNATURE_HEADER),
            ));
        }
        response.json(serde_json::json!({
            "error": self.code(),
            "reason": self.to_string(),
        }))
    }
}

impl Verifier {
    /// `secret`: paynotify's `relay.http_secret`, as bytes. Timestamps older or newer than
    /// 5 minutes are refused; bodies over 256 KiB are refused by the extractor.
    ///
    /// An empty secret is accepted (HMAC allows it) but anyone can sign with it; paynotify
    /// should be configured with a long random one.
    pub fn new(secret: &[u8]) -> Self {
        Self {
            keys: Arc::from([hmac::Key::new(hmac::HMAC_SHA256, secret)]),
            tolerance: DEFAULT_TOLERANCE,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }

    /// A verifier accepting a delivery signed with any of `secrets` (at least one), for a
    /// rotation of `relay.http_secret`; otherwise as [`Verifier::new`]. Each secret is tried
    /// on every delivery: keep the list to the rotation's two.
    ///
    /// ```
    /// # use paynotify_consumer::http::Verifier;
    /// let verifier = Verifier::from_secrets([b"new-secret".as_slice(), b"old-secret"])?;
    /// # Ok::<(), paynotify_consumer::http::NoSecret>(())
    /// ```
    pub fn from_secrets<I, S>(secrets: I) -> Result<Self, NoSecret>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let keys: Vec<hmac::Key> = secrets
            .into_iter()
            .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s.as_ref()))
            .collect();
        if keys.is_empty() {
            return Err(NoSecret);
        }
        Ok(Self {
            keys: Arc::from(keys),
            tolerance: DEFAULT_TOLERANCE,
            body_limit: DEFAULT_BODY_LIMIT,
        })
    }

    /// Accepts deliveries signed with `secret` too (the next one, while paynotify's is
    /// rotated).
    pub fn also_accept(mut self, secret: &[u8]) -> Self {
        let mut keys = self.keys.to_vec();
        keys.push(hmac::Key::new(hmac::HMAC_SHA256, secret));
        self.keys = Arc::from(keys);
        self
    }

    /// How many secrets are accepted.
    pub fn secrets(&self) -> usize {
        self.keys.len()
    }

    /// How far `t=` may be from now, in either direction (whole seconds; the bound itself
    /// is accepted). Keep it well above the clocks' skew and well below the time a captured
    /// delivery is worth replaying.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The largest body [`SignedEvent`] reads (bytes); larger ones are refused with 413
    /// before any of them is verified.
    pub fn with_body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// The event, if `header` (the `Paynotify-Signature` value, `None` if absent) signs
    /// `body` with a timestamp within the window around `now`.
    ///
    /// In order: the header is parsed strictly ([`Refusal::Missing`],
    /// [`Refusal::Malformed`]); the timestamp is checked ([`Refusal::Expired`],
    /// [`Refusal::Future`]); each `v1=` is verified in constant time under each accepted
    /// secret and any one matching passes (a sender rotating its secret signs with both; a
    /// receiver rotating accepts both) ([`Refusal::BadSignature`]);
    /// only a verified body is decoded ([`Refusal::NotAnEvent`]). Keys other than `t` and
    /// `v1` are ignored.
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: SystemTime,
    ) -> Result<Event, Refusal> {
        let header = header.ok_or(Refusal::Missing)?;
        let parsed = parse_header(header)?;
        self.check_window(parsed.timestamp, now)?;
        let mut message = Vec::with_capacity(parsed.t_text.len() + 1 + body.len());
        message.extend_from_slice(parsed.t_text.as_bytes());
        message.push(b'.');
        message.extend_from_slice(body);
        // Every entry under every key is tried, so the time taken does not depend on which
        // one matched.
        let matched = self.keys.iter().fold(false, |any, key| {
            parsed.signatures.iter().fold(any, |any, tag| {
                hmac::verify(key, &message, tag).is_ok() | any
            })
        });
        if !matched {
            return Err(Refusal::BadSignature);
        }
        serde_json::from_slice::<Event>(body).map_err(|e| Refusal::NotAnEvent(e.to_string()))
    }

    fn check_window(&self, timestamp: i64, now: SystemTime) -> Result<(), Refusal> {
        let now = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i128::from(d.as_secs()),
            Err(e) => -i128::from(e.duration().as_secs()),
        };
        let tolerance = i128::from(self.tolerance.as_secs());
        let tolerance_secs = self.tolerance.as_secs();
        let age = now - i128::from(timestamp);
        let saturate = |v: i128| u64::try_from(v).unwrap_or(u64::MAX);
        if age > tolerance {
            Err(Refusal::Expired {
                age_secs: saturate(age),
                tolerance_secs,
            })
        } else if -age > tolerance {
            Err(Refusal::Future {
                ahead_secs: saturate(-age),
                tolerance_secs,
            })
        } else {
            Ok(())
        }
    }
}

/// The header's parts: `t=` as sent (the signed text) and as a number, and every `v1=`.
struct Parsed<'h> {
    t_text: &'h str,
    timestamp: i64,
    signatures: Vec<[u8; 32]>,
}

/// `t={digits},v1={64 hex}[,v1=…][,other=…]`: comma-separated `key=value` elements, no
/// blanks, keys of lower-case letters and digits, exactly one `t`, at least one `v1`.
fn parse_header(header: &str) -> Result<Parsed<'_>, Refusal> {
    if header.is_empty() {
        return Err(Refusal::Malformed("the header is empty"));
    }
    let mut t = None;
    let mut signatures = Vec::new();
    for element in header.split(',') {
        let Some((key, value)) = element.split_once('=') else {
            return Err(Refusal::Malformed("an element is not key=value"));
        };
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(Refusal::Malformed(
                "a key is empty or not lower-case letters and digits",
            ));
        }
        match key {
            "t" => {
                if t.is_some() {
                    return Err(Refusal::Malformed("t= appears more than once"));
                }
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Refusal::Malformed("t= is not a unix time in digits"));
                }
                let timestamp = value
                    .parse::<i64>()
                    .map_err(|_| Refusal::Malformed("t= is out of range"))?;
                t = Some((value, timestamp));
            }
            "v1" => {
                if signatures.len() == MAX_SIGNATURES {
                    return Err(Refusal::Malformed("too many v1= entries"));
                }
                let tag = decode_hex32(value)
                    .ok_or(Refusal::Malformed("v1= is not 64 hexadecimal digits"))?;
                signatures.push(tag);
            }
            // Another scheme's entry (v0=, v2=…): not ours to judge.
            _ => {}
        }
    }
    let (t_text, timestamp) = t.ok_or(Refusal::Malformed("no t= timestamp"))?;
    if signatures.is_empty() {
        return Err(Refusal::Malformed("no v1= signature"));
    }
    Ok(Parsed {
        t_text,
        timestamp,
        signatures,
    })
}

/// 64 hexadecimal digits (either case) as 32 bytes.
fn decode_hex32(text: &str) -> Option<[u8; 32]> {
    fn nibble(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if bytes.len() != SIGNATURE_HEX_LEN {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *slot = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

/// A verified delivery, as an actix-web extractor: `async fn h(SignedEvent(e): SignedEvent)`.
///
/// Takes the [`Verifier`] from `app_data` (a `Verifier` or a `web::Data<Verifier>`; the
/// innermost scope's first), reads at most [`Verifier::body_limit`] bytes and verifies
/// them at the time of the request. A refusal is logged once at `warn` with its reason and
/// answered with its status and a JSON body (see the module's table); the handler does not
/// run. Without a verifier in `app_data` the answer is 500 (logged at `error`): a
/// configuration mistake must not accept unsigned deliveries.
///
/// A handler of one's own must answer 2xx only after its effect committed.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedEvent(pub Event);

impl SignedEvent {
    pub fn into_inner(self) -> Event {
        self.0
    }
}

impl FromRequest for SignedEvent {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let verifier = req.app_data::<Verifier>().cloned().or_else(|| {
            req.app_data::<web::Data<Verifier>>()
                .map(|d| d.get_ref().clone())
        });
        let req = req.clone();
        let payload = payload.take();
        Box::pin(async move {
            let Some(verifier) = verifier else {
                tracing::error!(
                    path = %req.path(),
                    "paynotify delivery not checked: no Verifier in app_data; answering 500"
                );
                return Err(actix_web::error::ErrorInternalServerError(
                    "the endpoint has no signature verifier configured",
                ));
            };
            match read_and_verify(&req, payload, &verifier).await {
                Ok(event) => Ok(SignedEvent(event)),
                Err(refusal) => {
                    tracing::warn!(
                        path = %req.path(),
                        peer = ?req.peer_addr(),
                        code = refusal.code(),
                        reason = %refusal,
                        "paynotify delivery refused"
                    );
                    Err(refusal.into())
                }
            }
        })
    }
}

async fn read_and_verify(
    req: &HttpRequest,
    payload: Payload,
    verifier: &Verifier,
) -> Result<Event, Refusal> {
    let header = match req.headers().get(SIGNATURE_HEADER) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| Refusal::Malformed("the header is not visible ASCII"))?,
        ),
    };
    // Refused before the body is read when it cannot be authentic anyway.
    if header.is_none() {
        return Err(Refusal::Missing);
    }
    let limit = verifier.body_limit;
    let mut payload = payload;
    let stream = web::Payload::from_request(req, &mut payload)
        .await
        .map_err(|e| Refusal::Unreadable(e.to_string()))?;
    let body = stream
        .to_bytes_limited(limit)
        .await
        .map_err(|_| Refusal::TooLarge { limit })?
        .map_err(|e| Refusal::Unreadable(e.to_string()))?;
    verifier.verify(header, &body, SystemTime::now())
}

/// An actix-web resource at `path` taking paynotify's POSTs and handing each verified
/// event to `handler`.
///
/// 401 for a forged, stale or unsigned delivery (the handler does not run), 400 for a
/// signed body that is not an event, 200 once the handler returned `Ok` (committed), 503
/// for [`Failure::Transient`] and 422 for [`Failure::Permanent`] (paynotify retries both
/// and parks the message dead at its `relay.max_attempts`), 405 for any other method.
/// The answer bodies are JSON: `{"message_id": …}` on 200, `{"error": …, "reason": …}`
/// otherwise (a handler failure's own text is logged, not sent).
///
/// The handler runs on a task of its own, so it finishes (and commits or rolls back) even
/// when paynotify hangs up before the answer; a handler that panics answers 500.
///
/// ```ignore
/// let verifier = Verifier::new(secret.as_bytes());
/// HttpServer::new(move || App::new().service(resource("/events", verifier.clone(), handle)))
/// ```
pub fn resource<H: Handler>(path: &str, verifier: Verifier, handler: H) -> actix_web::Resource {
    let handler: Arc<dyn Handler> = Arc::new(handler);
    web::resource(path).app_data(verifier).route(web::post().to(
        move |SignedEvent(event): SignedEvent| {
            let handler = handler.clone();
            async move { run(handler, event).await }
        },
    ))
}

/// Runs the handler to completion on its own task and turns its result into the answer.
async fn run(handler: Arc<dyn Handler>, event: Event) -> HttpResponse {
    let message_id = event.message_id();
    let id = event.id;
    let outcome = tokio::spawn(handler.handle(event)).await;
    match outcome {
        Ok(Ok(())) => HttpResponse::Ok().json(serde_json::json!({ "message_id": message_id })),
        Ok(Err(Failure::Transient(reason))) => {
            tracing::warn!(%message_id, id, %reason, "paynotify delivery failed transiently; answering 503");
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "transient",
                "the event was not applied; deliver it again",
                &message_id,
            )
        }
        Ok(Err(Failure::Permanent(reason))) => {
            tracing::error!(%message_id, id, %reason, "paynotify delivery failed permanently; answering 422");
            failure(
                StatusCode::UNPROCESSABLE_ENTITY,
                "permanent",
                "this consumer cannot apply the event; nothing was applied",
                &message_id,
            )
        }
        Err(join) => {
            tracing::error!(%message_id, id, error = %join, "paynotify delivery handler did not finish; answering 500");
            failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "handler_panicked",
                "the handler did not finish",
                &message_id,
            )
        }
    }
}

fn failure(status: StatusCode, code: &str, reason: &str, message_id: &str) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({
        "error": code,
        "reason": reason,
        "message_id": message_id,
    }))
}
