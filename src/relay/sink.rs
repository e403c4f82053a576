//! Where relayed events go: the one seam every sink implements (interface.md, "Relay
//! sinks"). The sinks themselves are in `sinks/`; a new broker is one more implementation of
//! [`Sink`] there and one line of `sinks::from_settings`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

/// One outbox row as consumers receive it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub id: i64,
    pub topic: String,
    pub biz_key: String,
    pub payload: serde_json::Value,
    /// RFC 3339.
    pub created_at: String,
}

/// Why one event was not delivered; the relay records it in `last_error` and retries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    #[error("redis: {0}")]
    Redis(#[source] Arc<redis::RedisError>),
    #[error("redis: no answer within {} ms", .0.as_millis())]
    RedisTimeout(Duration),
    #[error("redis: XADD answered {ids} ids for {events} events")]
    RedisShortAnswer { ids: usize, events: usize },
    /// `WAIT` answered fewer replicas than `redis.wait_replicas`: a failover could lose the
    /// batch, so it is not marked sent.
    #[error("redis: WAIT answered {acked} replica(s) of the {wanted} asked for")]
    RedisNotReplicated { acked: u64, wanted: u32 },
    #[error("http: {0}")]
    Http(#[source] Arc<reqwest::Error>),
    #[error("http: the receiver answered {0}")]
    HttpStatus(u16),
    #[error("amqp: {0}")]
    Amqp(#[source] Arc<lapin::Error>),
    #[error("amqp: no connection within {} ms", .0.as_millis())]
    AmqpTimeout(Duration),
    #[error("amqp: the broker refused the message (nack)")]
    AmqpNack,
    /// `mandatory` and no queue is bound for the routing key.
    #[error("amqp: the broker returned the message unroutable ({code} {text})")]
    AmqpReturned { code: u16, text: String },
    #[error("amqp: no confirm within {} s", .0.as_secs())]
    AmqpConfirmTimeout(Duration),
    #[error("amqp: the channel is not in confirm mode")]
    AmqpNotConfirmed,
    /// The broker returned a message that matches no publish of the batch, so no return can
    /// be ruled out for any ack in it.
    #[error(
        "amqp: the broker returned a message this batch did not publish ({code} {text}); no ack in the batch is trusted"
    )]
    AmqpReturnUnmatched { code: u16, text: String },
    /// Acked, but some confirm of the batch never came: a return for this event may still
    /// be owed.
    #[error("amqp: acked, but the batch's confirms did not all arrive, so a return may be owed")]
    AmqpReturnsUnsettled,
    #[error("the event could not be encoded: {0}")]
    Encode(#[source] Arc<serde_json::Error>),
    /// The batch ended before this event was tried.
    #[error("not sent")]
    NotSent,
    /// The sink refused the event; its own words.
    #[error("{0}")]
    Refused(String),
}

pub type Published<'a> = Pin<Box<dyn Future<Output = Vec<Result<(), SinkError>>> + Send + 'a>>;
/// The answer of [`Sink::is_up`].
pub type Health<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// Delivers a batch; one result per event, in order. An `Err` is retried with backoff.
pub trait Sink: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a>;
    /// Whether the sink can take events now, for `/readyz` (bounded in time; never an
    /// error). Sinks that cannot be down say `true`.
    fn is_up(&self) -> Health<'_> {
        Box::pin(async { true })
    }
}
