//! What every sink delivers, and what a consumer does with it.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// The topics paynotify emits (docs/interface.md, "Outbox topics").
pub mod topics {
    /// `WAIT_PAY → PAID`; biz_key `{order_no}`.
    pub const ORDER_PAID: &str = "ORDER_PAID";
    /// A refund succeeded (partial or full); biz_key `{order_no}:{out_refund_no}`.
    pub const ORDER_REFUNDED: &str = "ORDER_REFUNDED";
    /// `WAIT_PAY → CLOSED`; biz_key `{order_no}`.
    pub const ORDER_CLOSED: &str = "ORDER_CLOSED";
    /// Money arrived that must not mark the order paid; biz_key
    /// `{order_no}:{channel}:{provider transaction id}`.
    pub const PAYMENT_ANOMALY: &str = "PAYMENT_ANOMALY";
    /// A merchant transfer became `SUCCESS`; biz_key `{out_bill_no}:{channel}`.
    pub const TRANSFER_SUCCEEDED: &str = "TRANSFER_SUCCEEDED";
    /// A merchant transfer became `FAIL`; biz_key `{out_bill_no}:{channel}`.
    pub const TRANSFER_FAILED: &str = "TRANSFER_FAILED";
    /// A merchant transfer became `CANCELLED`; biz_key `{out_bill_no}:{channel}`.
    pub const TRANSFER_CANCELLED: &str = "TRANSFER_CANCELLED";
    /// A verified transfer notification that must not move a transfer (one never started
    /// here, another amount or merchant); biz_key `{out_bill_no}:{channel}:{provider bill no}`.
    pub const TRANSFER_ANOMALY: &str = "TRANSFER_ANOMALY";
}

/// One outbox message as every sink delivers it: the http sink's JSON body, the RabbitMQ
/// message body, the Redis stream entry's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The outbox row id: unique per message, but not the id to deduplicate on (a redriven
    /// dead letter keeps it; use [`Event::message_id`]).
    pub id: i64,
    pub topic: String,
    pub biz_key: String,
    pub payload: serde_json::Value,
    /// RFC 3339.
    pub created_at: String,
}

impl Event {
    /// `{topic}:{biz_key}`: unique for the life of an order, the same on every sink (the
    /// http sink's `Idempotency-Key`, the RabbitMQ `message_id`).
    pub fn message_id(&self) -> String {
        format!("{}:{}", self.topic, self.biz_key)
    }
}

/// Why a handler did not apply an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Worth another try (a database that did not answer, a lock timeout): the adapter
    /// leaves the delivery unacknowledged so it comes again, up to its attempt limit.
    #[error("transient: {0}")]
    Transient(String),
    /// Will never apply (a payload this consumer cannot read): parked at once.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl<E: std::fmt::Display> From<crate::inbox::InboxError<E>> for Failure {
    /// A database error is transient (the transaction rolled back; nothing was applied); a
    /// stored result that no longer decodes and an over-long id are permanent; the
    /// handler's own error is transient (return [`Failure::Permanent`] from a [`Handler`]
    /// to park instead). `InTransaction` is transient too, which only helps when the next
    /// attempt gets another connection: take connections from a pool (diesel-async's pools
    /// discard one left inside a transaction), never share one across deliveries.
    fn from(e: crate::inbox::InboxError<E>) -> Self {
        use crate::inbox::InboxError as I;
        match e {
            I::Database(_) | I::Handler(_) | I::Vanished | I::InTransaction => {
                Failure::Transient(e.to_string())
            }
            I::TooLong { .. } | I::Encode(_) | I::Decode(_) => Failure::Permanent(e.to_string()),
        }
    }
}

/// What [`Handler::handle`] returns.
pub type Handled = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send>>;

/// The consumer's work for one event. `Ok` only once the effect is committed (typically:
/// [`crate::apply_once`] returned `Applied` or `Duplicate`); the adapters acknowledge then
/// and only then.
///
/// Any `Fn(Event) -> impl Future<Output = Result<(), Failure>>` is a handler.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, event: Event) -> Handled;
}

impl<F, Fut> Handler for F
where
    F: Fn(Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Failure>> + Send + 'static,
{
    fn handle(&self, event: Event) -> Handled {
        Box::pin(self(event))
    }
}
