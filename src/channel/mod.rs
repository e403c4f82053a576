//! The seam every payment provider plugs into: verify the raw request, decode it into a
//! [`Notice`], and answer in the provider's own shape. The core never sees provider details.
//!
//! A provider is a folder here, with the same files in each:
//! - `mod.rs`: the provider built from its settings (its keys loaded once, at start-up) and
//!   its `mount`, which hands back a [`Mounted`]: its notify routes as data (each a
//!   [`NotifyRoute`], a path and the channel that verifies what arrives there, all served by
//!   the HTTP room's one notify handler), its [`Provider`], its API client and its bill source. The routes'
//!   OpenAPI text is doc-only `#[utoipa::path]` functions gathered in its `NotifyApi`.
//! - `settings.rs`: its `[section]` and that section's validation.
//! - `wire.rs`: its notification on the wire.
//! - `verify.rs`: the walk of its checks, over a [`Trail`], and its [`Channel`] impl.
//! - `explain.rs`: its [`Provider`] impl, the same walk recorded.
//! - `api.rs`: its outbound calls, an [`api::ProviderClient`] and so an [`api::ProviderApi`]
//!   (query, close, refund, refund query), each answer verified before it counts.
//! - `bill/`: its daily bill, a [`bill::BillSource`]: `fetch.rs`, `archive.rs`, `read.rs`,
//!   `checks.rs`, with this folder's `bill.rs` for what every provider's bill shares.
//!
//! Besides, what one provider alone has: WeChat's `certificates.rs` (its platform
//! certificates, a [`platform::KeySource`]); Alipay's `cert_sn.rs` (certificate mode) and
//! `content.rs` (what its notices' content leaves out). `crate::providers` lists them all;
//! `docs/design.md` has the checklist for adding one.

use actix_web::http::header::HeaderMap;

use crate::notice::{ChannelId, Digest, Notice};
use crate::time::Timestamp;

pub mod accounts;
pub mod alipay;
pub mod api;
pub mod bill;
pub mod keys;
pub mod platform;
pub mod wechat;

/// One notification exactly as it arrived: nothing in it is trusted yet.
#[derive(Debug, Clone, Copy)]
pub struct Inbound<'a> {
    pub headers: &'a HeaderMap,
    /// The raw body bytes: signatures are over these, never over a re-serialised form.
    pub body: &'a [u8],
    pub now: Timestamp,
    /// The notify route it came to (`/notify/wechat/refund`): a provider with one route per
    /// kind of notification takes on each only its own kinds. `None` when not known (a
    /// receipt stored before routes were kept): every kind of the channel is taken. A
    /// per-account route comes with its account (`/notify/wechat/pay/1900000101`).
    pub route: Option<&'a str>,
}

/// Why a notification was refused before it reached the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Bad or missing signature, unknown app, a signature probe: 401.
    #[error("bad signature: {0}")]
    BadSignature(String),
    /// The key the request names (WeChat `Wechatpay-Serial`) is not among those known, or no
    /// longer usable: 401, once the channel has asked the provider for its current keys.
    #[error("unknown serial: {0}")]
    UnknownSerial(String),
    /// Timestamp outside the provider's window: 401.
    #[error("stale: {0}")]
    Stale(String),
    /// Verified, but for an account that is not enabled here: a sub-merchant (WeChat
    /// `sub_mchid`, Alipay `auth_app_id`) not registered under the account that verified it,
    /// or the account a per-account notify path names: 401, so the provider retries and
    /// registering it in time recovers the payment.
    #[error("unknown merchant: {0}")]
    UnknownMerchant(String),
    /// Missing header, malformed body, missing field, bad amount: 400.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Signed, but of a kind another notify route of the provider takes (a notify URL
    /// registered for the wrong kind of notification): 400, nothing written.
    #[error("wrong event type: {0}")]
    WrongEventType(String),
    /// Signature valid but the payload does not decrypt with our key: 500, so the provider
    /// retries while an operator fixes the key.
    #[error("cannot decrypt: {0}")]
    Undecryptable(String),
}

impl Rejection {
    /// The HTTP status the provider is answered with.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadSignature(_)
            | Self::UnknownSerial(_)
            | Self::Stale(_)
            | Self::UnknownMerchant(_) => 401,
            Self::BadRequest(_) | Self::WrongEventType(_) => 400,
            Self::Undecryptable(_) => 500,
        }
    }

    /// A short name for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadSignature(_) => "bad_signature",
            Self::UnknownSerial(_) => "unknown_serial",
            Self::Stale(_) => "stale",
            Self::UnknownMerchant(_) => "unknown_merchant",
            Self::BadRequest(_) => "bad_request",
            Self::WrongEventType(_) => "wrong_event_type",
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

    /// [`Channel::verify`], saying also whether the provider's signature verified: a request
    /// refused by a check after it (its decryption, its fields) is still the provider's word,
    /// and its receipt is kept whole (`crate::receipts`). A provider whose walk reports its
    /// signature check as [`SIGNATURE`] walks it with [`Signed`]; by default, only a request
    /// that verified counts as signed.
    fn verify_signed(&self, request: &Inbound<'_>) -> (Result<Self::Verified, Rejection>, bool) {
        let verified = self.verify(request);
        let signed = verified.is_ok();
        (verified, signed)
    }

    /// Turns what was verified into a notice, checking fields, amounts and merchant ids.
    fn decode(&self, verified: Self::Verified) -> Result<Notice, Rejection>;

    /// Renders `reply` the way the provider expects it.
    fn render(&self, reply: Reply<'_>) -> Answer;

    /// What a request whose signature did not verify shows of where it came from, for its
    /// receipt (`crate::receipts`). Asked only when a receipt is wanted.
    fn standing(&self, request: &Inbound<'_>) -> Standing;

    /// The prefix (lower-case) of the request headers this provider signs with, which a
    /// receipt keeps beside the few that show what a proxy did; `None` for a provider that
    /// signs in the body.
    fn signature_headers(&self) -> Option<&'static str> {
        None
    }
}

/// Whether a request whose signature did not verify looks like its provider's: with what
/// it was refused, what decides how much of it a receipt keeps and within which budget.
/// Anyone can post to a notify URL and name a configured key (an Alipay `app_id` is in every
/// order string a buyer sees), so looking right alone never has a receipt kept whole beyond
/// a budget (`crate::receipts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// It names one of the configured keys (WeChat `Wechatpay-Serial`, Alipay `app_id`).
    pub keyed: bool,
    /// Its body has the provider's shape (WeChat's JSON envelope, Alipay's signed form).
    pub shaped: bool,
}

/// Verification, decoding and the length checks: everything between the raw request and a
/// notice the ledger may apply. The notify handler and re-apply both go through it.
pub fn admit<C: Channel + ?Sized>(channel: &C, request: &Inbound<'_>) -> Result<Notice, Rejection> {
    admit_signed(channel, request).0
}

/// [`admit`], saying also whether the request's signature verified
/// ([`Channel::verify_signed`]): true for one refused by a later check too.
pub fn admit_signed<C: Channel + ?Sized>(
    channel: &C,
    request: &Inbound<'_>,
) -> (Result<Notice, Rejection>, bool) {
    let (verified, signed) = channel.verify_signed(request);
    let admitted = verified
        .and_then(|v| channel.decode(v))
        .and_then(|n| n.checked().map_err(Rejection::BadRequest));
    (admitted, signed)
}

/// How one check of [`Provider::explain`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// Facts shown for the reader (the string to sign, decoded fields).
    Info,
    /// Not run: an earlier check it depends on failed.
    Skipped,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Self::Pass => "ok",
            Self::Fail => "FAIL",
            Self::Info => "info",
            Self::Skipped => "skip",
        }
    }
}

/// One check of a notification, in the order the channel makes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    /// What was found, in plain words.
    pub detail: String,
    /// For a failed check that refuses the request: what [`admit`] answers for it (a merchant
    /// mismatch or a missing order fails a check without refusing the request).
    pub rejection: Option<Rejection>,
}

impl Check {
    pub fn new(name: impl Into<String>, verdict: Verdict, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict,
            detail: detail.into(),
            rejection: None,
        }
    }
}

/// Every check a channel makes of one request, and the notice when they all passed.
#[derive(Debug, Clone, Default)]
pub struct Explanation {
    pub checks: Vec<Check>,
    pub notice: Option<Notice>,
}

impl Explanation {
    pub fn push(&mut self, name: impl Into<String>, verdict: Verdict, detail: impl Into<String>) {
        self.checks.push(Check::new(name, verdict, detail));
    }

    /// The first check that failed.
    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| c.verdict == Verdict::Fail)
    }
}

/// Where a channel's walk of its checks reports each outcome. The walk is written once per
/// provider, in the order [`Channel::verify`] makes the checks; the trail decides what is
/// kept. `verify` walks with [`Halt`], which keeps nothing and ends the walk at the first
/// failure; [`Provider::explain`] walks with an [`Explanation`], which records every check
/// in words and goes on where a later check does not need the failed one. So the two cannot
/// disagree on which check refuses a request, or with which [`Rejection`]. The closures are
/// called only by a trail that records: the hot path formats nothing.
pub trait Trail {
    /// `check` passed; `detail` says what was found.
    fn pass(&mut self, check: &'static str, detail: impl FnOnce() -> String);

    /// `check` failed and `why` is the refusal. `Err(why)` ends the walk; `Ok(why)` hands
    /// it back to a walk that goes on, and that ends with it once a check needs this one.
    fn fail(
        &mut self,
        check: &'static str,
        why: Rejection,
        hint: impl FnOnce(&Rejection) -> String,
    ) -> Result<Rejection, Rejection>;

    /// `check` was not made: one it needs failed.
    fn skip(&mut self, check: &'static str, why: impl FnOnce() -> String);

    /// Facts for the reader (the string to sign), neither pass nor fail.
    fn info(&mut self, check: &'static str, detail: impl FnOnce() -> String);

    /// `check` failed and every later check needs it: the walk ends with `why` whatever
    /// the trail.
    fn stop(
        &mut self,
        check: &'static str,
        why: Rejection,
        hint: impl FnOnce(&Rejection) -> String,
    ) -> Rejection {
        match self.fail(check, why, hint) {
            Ok(why) | Err(why) => why,
        }
    }
}

/// The trail of [`Channel::verify`]: keeps nothing, ends the walk at the first failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct Halt;

/// The name every walk gives the check of the provider's signature.
pub const SIGNATURE: &str = "signature";

/// [`Halt`], noting whether the [`SIGNATURE`] check passed before the walk ended: the trail
/// of [`Channel::verify_signed`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Signed {
    pub signed: bool,
}

impl Trail for Signed {
    fn pass(&mut self, check: &'static str, _: impl FnOnce() -> String) {
        if check == SIGNATURE {
            self.signed = true;
        }
    }

    fn fail(
        &mut self,
        _: &'static str,
        why: Rejection,
        _: impl FnOnce(&Rejection) -> String,
    ) -> Result<Rejection, Rejection> {
        Err(why)
    }

    fn skip(&mut self, _: &'static str, _: impl FnOnce() -> String) {}

    fn info(&mut self, _: &'static str, _: impl FnOnce() -> String) {}
}

impl Trail for Halt {
    fn pass(&mut self, _: &'static str, _: impl FnOnce() -> String) {}

    fn fail(
        &mut self,
        _: &'static str,
        why: Rejection,
        _: impl FnOnce(&Rejection) -> String,
    ) -> Result<Rejection, Rejection> {
        Err(why)
    }

    fn skip(&mut self, _: &'static str, _: impl FnOnce() -> String) {}

    fn info(&mut self, _: &'static str, _: impl FnOnce() -> String) {}
}

impl Trail for Explanation {
    fn pass(&mut self, check: &'static str, detail: impl FnOnce() -> String) {
        self.push(check, Verdict::Pass, detail());
    }

    fn fail(
        &mut self,
        check: &'static str,
        why: Rejection,
        hint: impl FnOnce(&Rejection) -> String,
    ) -> Result<Rejection, Rejection> {
        self.checks.push(Check {
            name: check.to_owned(),
            verdict: Verdict::Fail,
            detail: hint(&why),
            rejection: Some(why.clone()),
        });
        Ok(why)
    }

    fn skip(&mut self, check: &'static str, why: impl FnOnce() -> String) {
        self.push(check, Verdict::Skipped, why());
    }

    fn info(&mut self, check: &'static str, detail: impl FnOnce() -> String) {
        self.push(check, Verdict::Info, detail());
    }
}

/// The SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::text::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Bytes shown on one line: text with `\n`, `\r`, `\t` and quotes escaped, other bytes
/// that are not UTF-8 as `\xNN`.
pub fn shown(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A provider as the operations side sees it: re-verify a stored request with the keys
/// configured now, and explain every check made of it.
pub trait Provider: Send + Sync + 'static {
    fn channel(&self) -> ChannelId;

    /// [`admit`]: verify and decode exactly as the notify route does.
    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection>;

    /// Every check of `request` in order, each with what it found; the first failure in
    /// plain words (a re-serialised body, a re-encoded charset, a wrong key).
    fn explain(&self, request: &Inbound<'_>) -> Explanation;

    /// Every configured merchant/app id (WeChat `mchid`, Alipay `app_id`): what
    /// `POST /orders` may name.
    fn accounts(&self) -> Vec<String>;

    /// Whether `id` is one of [`Provider::accounts`] now: a hash lookup, however many
    /// accounts there are.
    fn has_account(&self, id: &str) -> bool;

    /// The `POST /orders` field that names one of [`Provider::accounts`] for an order
    /// (`wechat_mchid`): the account stored for the order on this provider's channel.
    fn order_field(&self) -> &'static str;
}

/// A notify endpoint as the HTTP room sees it: [`Channel`] without its `Verified` type, so
/// every provider's routes are served by the HTTP room's one notify handler. Every `Channel` is
/// one.
pub trait Endpoint: Send + Sync + 'static {
    fn id(&self) -> ChannelId;

    /// [`admit_signed`] with this channel.
    fn admit_signed(&self, request: &Inbound<'_>) -> (Result<Notice, Rejection>, bool);

    /// [`Channel::render`].
    fn render(&self, reply: Reply<'_>) -> Answer;

    /// [`Channel::standing`].
    fn standing(&self, request: &Inbound<'_>) -> Standing;

    /// [`Channel::signature_headers`].
    fn signature_headers(&self) -> Option<&'static str>;
}

impl<C: Channel> Endpoint for C {
    fn id(&self) -> ChannelId {
        Channel::id(self)
    }

    fn admit_signed(&self, request: &Inbound<'_>) -> (Result<Notice, Rejection>, bool) {
        admit_signed(self, request)
    }

    fn render(&self, reply: Reply<'_>) -> Answer {
        Channel::render(self, reply)
    }

    fn standing(&self, request: &Inbound<'_>) -> Standing {
        Channel::standing(self, request)
    }

    fn signature_headers(&self) -> Option<&'static str> {
        Channel::signature_headers(self)
    }
}

/// A notify route a provider takes, as data: its path and the channel that verifies what
/// arrives there. The HTTP room mounts it beside the others; the provider's OpenAPI text
/// for it is its `NotifyApi`. A provider with one route per kind of notification (WeChat's
/// payments and refunds) checks the event type against the path it is told (`Inbound::route`).
#[derive(Clone)]
pub struct NotifyRoute {
    pub path: &'static str,
    pub channel: std::sync::Arc<dyn Endpoint>,
}

impl std::fmt::Debug for NotifyRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyRoute")
            .field("path", &self.path)
            .field("channel", &self.channel.id())
            .finish()
    }
}

/// A provider built from its settings: its notify routes and its operations side.
pub struct Mounted {
    pub routes: Vec<NotifyRoute>,
    pub provider: std::sync::Arc<dyn Provider>,
    /// The provider's API client, when some merchant/app has API credentials.
    pub api: Option<std::sync::Arc<dyn api::ProviderApi>>,
    /// The provider's platform keys, when it hands them out itself (WeChat's certificates).
    pub keys: Option<std::sync::Arc<dyn platform::KeySource>>,
    /// The provider's daily bills, when some merchant/app has API credentials.
    pub bills: Option<std::sync::Arc<dyn bill::BillSource>>,
    /// Its live accounts, which `/admin/merchants` changes.
    pub accounts: std::sync::Arc<dyn accounts::AccountBook>,
}

/// A notice's business content as its provider defines it: the neutral content
/// ([`Notice::content_digest`]) less what the provider leaves out (`alipay::content`).
impl Notice {
    /// The digest of the business content: two deliveries are the same exactly when their
    /// digests are equal.
    pub fn digest(&self) -> Digest {
        let app_id = match self.channel {
            ChannelId::Wechat => self.merchant.app_id.as_deref(),
            ChannelId::Alipay => alipay::content::app_in_content(self),
        };
        self.content_digest(app_id)
    }

    /// Whether `seen`, the digest of a recorded delivery, is this notice's content (`digest`
    /// is [`Notice::digest`], computed once by the caller), in its current or earlier form.
    pub fn same_content(&self, digest: &Digest, seen: &str) -> bool {
        let earlier = match self.channel {
            ChannelId::Wechat => None,
            ChannelId::Alipay => alipay::content::earlier_digest(self),
        };
        seen == digest.as_str() || earlier.is_some_and(|d| d.as_str() == seen)
    }
}

/// The `reason` label a rejection is counted under.
impl From<&Rejection> for crate::metrics::Refusal {
    fn from(rejection: &Rejection) -> Self {
        match rejection {
            Rejection::BadSignature(_) => Self::BadSignature,
            Rejection::UnknownSerial(_) => Self::UnknownSerial,
            Rejection::Stale(_) => Self::Stale,
            Rejection::UnknownMerchant(_) => Self::UnknownMerchant,
            Rejection::BadRequest(_) => Self::BadRequest,
            Rejection::WrongEventType(_) => Self::WrongEventType,
            Rejection::Undecryptable(_) => Self::Undecryptable,
        }
    }
}
