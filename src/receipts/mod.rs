//! Receipts: what arrived at a notify URL and what it was answered, kept for diagnosis
//! (`paynotify explain`, the admin endpoints, re-apply). Diagnostics, not the ledger: the
//! notify handler hands a receipt to a bounded queue and answers at once; a writer task
//! stores them in batches. When the queue is full the receipt is dropped and counted
//! (`paynotify_receipts_total{result="dropped"}`); the answer never waits for a receipt.
//!
//! A receipt holds only what arrived (the headers that matter and the raw body) and what
//! was answered: never anything from the configuration. Its text is stored with control
//! characters escaped (`crate::text`), so no byte a request chose can fail the insert.
//!
//! Anyone can post to a notify URL, so a receipt must not let anyone write to the database
//! at will. How much of a request is kept, and within which budget, is its [`Provenance`]:
//!
//! - one whose signature verified is the provider's word (refused later, say, for its
//!   amount): kept whole, whatever else arrives. That is the one an operator needs.
//! - one in its provider's shape that names a configured key but did not verify (a body a
//!   proxy re-serialised, a forgery: an Alipay `app_id` is in every order string a buyer
//!   sees) is kept whole within a byte budget a minute of its own
//!   (`receipts.keyed_bytes_per_minute`);
//! - one in its provider's shape refused for naming a key not known yet (a WeChat platform
//!   certificate rotated before it was downloaded) is kept whole within another
//!   (`receipts.unknown_key_bytes_per_minute`), so that no other flood crowds out the
//!   receipts re-applied after a certificate refresh;
//! - anything else, and one of those two past its budget, is anonymous: kept as a short
//!   prefix with its length and SHA-256, within a byte budget a minute, a number a minute per
//!   peer, and once per body a minute; past that it is counted (`result="limited"`) and
//!   dropped.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::sync::mpsc;

pub mod explain;
pub mod reapply;
pub mod store;

use crate::channel::{Standing, sha256_hex};
use crate::config::{ReceiptMode, ReceiptSettings};
use crate::metrics::{Metrics, ReceiptResult};
use crate::notice::ChannelId;
use crate::store::Store;
use crate::store::types::Payload;
use crate::text::storable;
use crate::time::Timestamp;
use store::NewReceipt;

/// Receipts per insert statement.
const WRITE_BATCH: usize = 200;

/// The request headers a receipt keeps: the provider's signature headers (those starting
/// with `signature_headers`, its [`crate::channel::Channel::signature_headers`]) and the few
/// that show what a proxy or framework did to the request.
pub fn kept_header(name: &str, signature_headers: Option<&str>) -> bool {
    let name = name.to_ascii_lowercase();
    signature_headers.is_some_and(|prefix| name.starts_with(prefix))
        || matches!(
            name.as_str(),
            "content-type" | "content-length" | "user-agent"
        )
}

/// The kept headers as `{"name": ["value", …]}` (names lower-case, values in arrival order).
pub fn headers_json(headers: &HeaderMap, signature_headers: Option<&str>) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, value) in headers {
        if !kept_header(name.as_str(), signature_headers) {
            continue;
        }
        let text = storable(&String::from_utf8_lossy(value.as_bytes())).into_owned();
        let entry = out
            .entry(name.as_str().to_owned())
            .or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if let serde_json::Value::Array(values) = entry {
            values.push(serde_json::Value::String(text));
        }
    }
    serde_json::Value::Object(out)
}

/// The headers of a stored receipt, as a request would carry them. Names or values that
/// are not valid in HTTP are left out.
pub fn header_map(headers: &serde_json::Value) -> HeaderMap {
    let mut map = HeaderMap::new();
    let Some(object) = headers.as_object() else {
        return map;
    };
    for (name, values) in object {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        let values: Vec<&str> = match values {
            serde_json::Value::Array(values) => values
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect(),
            serde_json::Value::String(value) => vec![value.as_str()],
            _ => Vec::new(),
        };
        for value in values {
            if let Ok(value) = HeaderValue::from_str(value) {
                map.append(name.clone(), value);
            }
        }
    }
    map
}

/// The body of a receipt, base64.
pub fn encode_body(body: &[u8]) -> String {
    BASE64.encode(body)
}

/// The raw body of a stored receipt; `None` when its base64 is damaged.
pub fn decode_body(body_b64: &str) -> Option<Vec<u8>> {
    BASE64.decode(body_b64).ok()
}

/// A notify request as it arrived and what it was answered: what its receipt is made of.
pub struct Arrival<'a> {
    pub channel: ChannelId,
    pub received_at: Timestamp,
    pub peer: Option<SocketAddr>,
    pub request_id: Option<String>,
    /// The notify route it came to, as registered.
    pub route: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// The channel's [`crate::channel::Channel::signature_headers`].
    pub signature_headers: Option<&'static str>,
    pub body: &'a [u8],
    pub status: u16,
    pub outcome: &'static str,
    pub detail: Option<String>,
    pub out_trade_no: Option<String>,
    pub provenance: Provenance,
}

/// How far a request showed that it is its provider's: what decides how much of it its
/// receipt keeps, and within which budget (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Its signature verified; a later check may have refused it. Kept whole.
    Signed,
    /// Not verified, in its provider's shape and naming a configured key: kept whole within
    /// `receipts.keyed_bytes_per_minute`, then as an anonymous one.
    Keyed,
    /// Not verified, in its provider's shape, refused for naming a key not known yet: kept
    /// whole within `receipts.unknown_key_bytes_per_minute`, then as an anonymous one.
    UnknownKey,
    /// Anything else: a prefix and a hash, within the limits on anonymous requests.
    Anonymous {
        /// Its body has the provider's shape (what its `detail` says of the prefix).
        shaped: bool,
    },
}

impl Provenance {
    /// The provenance of a request whose signature did not verify: what it shows of itself,
    /// and whether it was refused for naming a key not known yet.
    pub fn unsigned(standing: Standing, unknown_key: bool) -> Self {
        match standing {
            Standing { shaped: true, .. } if unknown_key => Self::UnknownKey,
            Standing {
                keyed: true,
                shaped: true,
            } => Self::Keyed,
            Standing { shaped, .. } => Self::Anonymous { shaped },
        }
    }
}

/// Where the notify handler leaves receipts.
pub struct Receipts {
    mode: ReceiptMode,
    queue: Option<mpsc::Sender<NewReceipt>>,
    metrics: Arc<Metrics>,
    junk_prefix_bytes: usize,
    limits: Limits,
}

impl Receipts {
    /// Starts the writer task on the current runtime (none with `receipts.store = "off"`).
    pub fn start(settings: &ReceiptSettings, store: Store, metrics: Arc<Metrics>) -> Self {
        let queue = (settings.store != ReceiptMode::Off).then(|| {
            let (tx, rx) = mpsc::channel(settings.queue.max(1));
            tokio::spawn(write(rx, store, Arc::clone(&metrics)));
            tx
        });
        Self {
            mode: settings.store,
            queue,
            metrics,
            junk_prefix_bytes: settings.junk_prefix_bytes,
            limits: Limits {
                bytes_per_minute: settings.anonymous_bytes_per_minute,
                per_peer: settings.anonymous_per_peer_per_minute,
                keyed_bytes_per_minute: settings.keyed_bytes_per_minute,
                unknown_key_bytes_per_minute: settings.unknown_key_bytes_per_minute,
                window: Mutex::default(),
            },
        }
    }

    /// Whether a request answered with (`success`) or without the provider's success leaves
    /// a receipt.
    pub fn wants(&self, success: bool) -> bool {
        match self.mode {
            ReceiptMode::Off => false,
            ReceiptMode::All => true,
            ReceiptMode::Rejected => !success,
        }
    }

    /// Makes the receipt of `arrival` and queues it, whole or as a prefix and a hash, within
    /// the budget of its [`Provenance`] (see the module's documentation); never waits.
    pub fn keep(&self, arrival: Arrival<'_>) {
        if self.queue.is_none() {
            return;
        }
        let minute = arrival.received_at.unix_seconds().div_euclid(60);
        let (budget, shaped) = match arrival.provenance {
            Provenance::Signed => {
                self.submit(receipt(&arrival, arrival.body, None));
                return;
            }
            Provenance::Keyed => (Some(Budget::Keyed), true),
            Provenance::UnknownKey => (Some(Budget::UnknownKey), true),
            Provenance::Anonymous { shaped } => (None, shaped),
        };
        if let Some(budget) = budget {
            let whole = receipt(&arrival, arrival.body, None);
            if self
                .limits
                .admit_whole(minute, budget, stored_bytes(&whole))
            {
                self.submit(whole);
                return;
            }
        }
        let digest = sha256_hex(arrival.body);
        let prefix = &arrival.body[..arrival.body.len().min(self.junk_prefix_bytes)];
        let what = if shaped {
            "signature not verified".to_owned()
        } else {
            format!("body not in {}'s shape", arrival.channel)
        };
        let kept = format!(
            "{what}: its first {} of {} bytes kept, SHA-256 {digest}",
            prefix.len(),
            arrival.body.len()
        );
        let anonymous = receipt(&arrival, prefix, Some(kept));
        let peer = arrival.peer.map(|a| peer_key(a.ip()));
        if self
            .limits
            .admit(minute, peer, digest, stored_bytes(&anonymous))
        {
            self.submit(anonymous);
        } else {
            self.metrics.receipts(ReceiptResult::Limited, 1);
        }
    }

    /// Queues a receipt as it is, without waiting; a full queue drops it (counted).
    pub fn submit(&self, receipt: NewReceipt) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(receipt).is_err() {
            self.metrics.receipts(ReceiptResult::Dropped, 1);
        }
    }
}

/// The receipt of `arrival` keeping `body` (all of it, or a prefix), with `kept` (what was
/// kept of it) after its `detail`.
fn receipt(arrival: &Arrival<'_>, body: &[u8], kept: Option<String>) -> NewReceipt {
    let detail = arrival.detail.as_deref().map(|d| storable(d).into_owned());
    let detail = match (detail, kept) {
        (Some(why), Some(kept)) => Some(format!("{why}; {kept}")),
        (why, kept) => why.or(kept),
    };
    NewReceipt {
        channel: arrival.channel.as_str().to_owned(),
        route: arrival.route.map(|r| storable(r).into_owned()),
        received_at: arrival.received_at,
        peer: arrival.peer.map(|a| a.to_string()),
        request_id: arrival
            .request_id
            .as_deref()
            .map(|id| storable(id).into_owned()),
        headers: headers_payload(arrival.headers, arrival.signature_headers),
        body_b64: encode_body(body),
        body_bytes: i32::try_from(arrival.body.len()).unwrap_or(i32::MAX),
        status: i16::try_from(arrival.status).unwrap_or(i16::MAX),
        outcome: arrival.outcome.to_owned(),
        detail,
        out_trade_no: arrival
            .out_trade_no
            .as_deref()
            .map(|n| storable(n).into_owned()),
    }
}

/// The address a peer is counted under: an IPv6 peer by its /64, the block one host
/// usually holds whole (counting each address would let it take 2^64 shares).
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// What a receipt takes in its table, near enough: the length of its text columns.
fn stored_bytes(r: &NewReceipt) -> usize {
    let text = [
        Some(&r.channel),
        r.route.as_ref(),
        r.peer.as_ref(),
        r.request_id.as_ref(),
        Some(&r.body_b64),
        Some(&r.outcome),
        r.detail.as_ref(),
        r.out_trade_no.as_ref(),
    ];
    text.into_iter().flatten().map(String::len).sum::<usize>() + r.headers.0.to_string().len()
}

/// The budgets of receipts kept whole although their signature did not verify.
#[derive(Debug, Clone, Copy)]
enum Budget {
    /// `receipts.keyed_bytes_per_minute`.
    Keyed,
    /// `receipts.unknown_key_bytes_per_minute`.
    UnknownKey,
}

/// The limits on receipts of requests that did not verify, counted over one minute of the
/// service's clock.
struct Limits {
    /// Anonymous ones: bytes, and receipts per peer.
    bytes_per_minute: usize,
    per_peer: u32,
    keyed_bytes_per_minute: usize,
    unknown_key_bytes_per_minute: usize,
    window: Mutex<Window>,
}

/// What was kept in the current minute. It holds at most one entry per anonymous receipt
/// kept, and those are bounded by the byte budget.
#[derive(Default)]
struct Window {
    minute: i64,
    bytes: usize,
    peers: HashMap<Option<IpAddr>, u32>,
    bodies: HashSet<String>,
    keyed_bytes: usize,
    unknown_key_bytes: usize,
}

impl Window {
    /// The window of `minute`: this one, or a new one when the minute has changed.
    fn of(&mut self, minute: i64) -> &mut Self {
        if self.minute != minute {
            *self = Window {
                minute,
                ..Window::default()
            };
        }
        self
    }
}

impl Limits {
    /// Whether a receipt of `bytes` kept whole fits what is left of `budget` in `minute`;
    /// counts it when so.
    fn admit_whole(&self, minute: i64, budget: Budget, bytes: usize) -> bool {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let w = window.of(minute);
        let (used, limit) = match budget {
            Budget::Keyed => (&mut w.keyed_bytes, self.keyed_bytes_per_minute),
            Budget::UnknownKey => (&mut w.unknown_key_bytes, self.unknown_key_bytes_per_minute),
        };
        if used.saturating_add(bytes) > limit {
            return false;
        }
        *used += bytes;
        true
    }

    /// Whether an anonymous receipt of `bytes` from `peer`, whose body has `digest`, may be
    /// kept in `minute`; counts it when so.
    fn admit(&self, minute: i64, peer: Option<IpAddr>, digest: String, bytes: usize) -> bool {
        // A panic elsewhere while holding the lock leaves counts, nothing half written.
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let w = window.of(minute);
        let from_peer = w.peers.get(&peer).copied().unwrap_or(0);
        if w.bodies.contains(&digest)
            || from_peer >= self.per_peer
            || w.bytes.saturating_add(bytes) > self.bytes_per_minute
        {
            return false;
        }
        w.peers.insert(peer, from_peer + 1);
        w.bytes += bytes;
        w.bodies.insert(digest);
        true
    }
}

/// The writer: takes what is queued (up to a batch), stores it in one statement, repeats
/// until every sender is gone.
async fn write(mut rx: mpsc::Receiver<NewReceipt>, store: Store, metrics: Arc<Metrics>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    loop {
        batch.clear();
        if rx.recv_many(&mut batch, WRITE_BATCH).await == 0 {
            return;
        }
        match store.insert_receipts(&batch).await {
            Ok(_) => metrics.receipts(ReceiptResult::Written, batch.len()),
            Err(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, receipts = batch.len(), "receipts not stored: the database is out of reach");
                metrics.receipts(ReceiptResult::Dropped, batch.len());
            }
            // One row the database refuses fails its whole batch: store the rest one by one.
            Err(_) => write_one_by_one(&batch, &store, &metrics).await,
        }
    }
}

async fn write_one_by_one(batch: &[NewReceipt], store: &Store, metrics: &Metrics) {
    for (i, receipt) in batch.iter().enumerate() {
        match store.insert_receipts(std::slice::from_ref(receipt)).await {
            Ok(_) => metrics.receipts(ReceiptResult::Written, 1),
            Err(e) if e.is_unavailable() => {
                // Each of the rest would wait as long again.
                let rest = batch.len() - i;
                tracing::warn!(error = %e, receipts = rest, "receipts not stored: the database is out of reach");
                metrics.receipts(ReceiptResult::Dropped, rest);
                return;
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    channel = %receipt.channel,
                    outcome = %receipt.outcome,
                    request_id = receipt.request_id.as_deref().unwrap_or("-"),
                    "receipt refused by the database; the rest of its batch is stored"
                );
                metrics.receipts(ReceiptResult::Refused, 1);
            }
        }
    }
}

/// A receipt's headers column.
pub fn headers_payload(headers: &HeaderMap, signature_headers: Option<&str>) -> Payload {
    Payload(headers_json(headers, signature_headers))
}

/// The body as text when it is UTF-8 without control characters (tabs and line ends aside).
pub fn printable(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
        .then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::kept_header;

    #[test]
    fn a_receipt_keeps_its_own_providers_signature_headers_and_no_others() {
        assert!(kept_header("Wechatpay-Serial", Some("wechatpay-")));
        assert!(!kept_header("Wechatpay-Serial", None));
        assert!(!kept_header("Wechatpay-Serial", Some("stripe-")));
        for generic in ["Content-Type", "content-length", "User-Agent"] {
            assert!(kept_header(generic, None), "{generic}");
        }
        for private in ["Authorization", "Cookie", "X-Forwarded-For"] {
            assert!(!kept_header(private, Some("wechatpay-")), "{private}");
        }
    }
}
