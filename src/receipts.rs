//! Receipts: what arrived at a notify URL and what it was answered, kept for diagnosis
//! (`paynotify explain`, the admin endpoints, re-apply). Diagnostics, not the ledger: the
//! notify handler hands a receipt to a bounded queue and answers at once; a writer task
//! stores them in batches. When the queue is full the receipt is dropped and counted
//! (`paynotify_receipts_total{result="dropped"}`); the answer never waits for a receipt.
//!
//! A receipt holds only what arrived (the headers that matter and the raw body) and what
//! was answered: never anything from the configuration.

use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::sync::mpsc;

use crate::config::{ReceiptMode, ReceiptSettings};
use crate::metrics::{Metrics, ReceiptResult};
use crate::store::Store;
use crate::store::receipts::NewReceipt;
use crate::store::types::Payload;

/// Receipts per insert statement.
const WRITE_BATCH: usize = 200;

/// The request headers a receipt keeps: the provider's signature headers and the few that
/// show what a proxy or framework did to the request.
pub fn kept_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("wechatpay-")
        || matches!(
            name.as_str(),
            "content-type" | "content-length" | "user-agent"
        )
}

/// The kept headers as `{"name": ["value", …]}` (names lower-case, values in arrival order).
pub fn headers_json(headers: &HeaderMap) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, value) in headers {
        if !kept_header(name.as_str()) {
            continue;
        }
        let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
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

/// Where the notify handler leaves receipts.
pub struct Receipts {
    mode: ReceiptMode,
    queue: Option<mpsc::Sender<NewReceipt>>,
    metrics: Arc<Metrics>,
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

    /// Queues a receipt without waiting; a full queue drops it (counted).
    pub fn submit(&self, receipt: NewReceipt) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(receipt).is_err() {
            self.metrics.receipts(ReceiptResult::Dropped, 1);
        }
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
            Err(e) => {
                tracing::warn!(error = %e, receipts = batch.len(), "receipts not stored");
                metrics.receipts(ReceiptResult::Dropped, batch.len());
            }
        }
    }
}

/// A receipt's headers column.
pub fn headers_payload(headers: &HeaderMap) -> Payload {
    Payload(headers_json(headers))
}
