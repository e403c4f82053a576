//! Redis Streams: a consumer group on paynotify's stream (`relay.sink = "redis-stream"`).
//!
//! SEAM (replaced by the implementation): the public surface the example and the docs use.

use std::future::Future;
use std::time::Duration;

use crate::Handler;

/// Where and how to read.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// paynotify's `relay.redis_stream` (default `paynotify:events`).
    pub stream: String,
    /// The consumer group: one per consuming service (created at the stream's start, `0`,
    /// with MKSTREAM, when missing).
    pub group: String,
    /// This process's name in the group (unique per running instance).
    pub consumer: String,
    /// Entries per `XREADGROUP`.
    pub batch: usize,
    /// How long one `XREADGROUP` blocks waiting for entries.
    pub block: Duration,
    /// Entries pending longer than this (a crashed or stuck consumer's) are taken over
    /// with `XAUTOCLAIM`.
    pub claim_idle: Duration,
    /// Deliveries of one entry before it is parked on `parked_stream` and acknowledged.
    pub max_attempts: u32,
    /// Where poison entries go (`{stream}:parked` by default).
    pub parked_stream: String,
}

impl StreamSettings {
    pub fn new(stream: &str, group: &str, consumer: &str) -> Self {
        Self {
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            batch: 64,
            block: Duration::from_secs(2),
            claim_idle: Duration::from_secs(60),
            max_attempts: 5,
            parked_stream: format!("{stream}:parked"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Reads the group, hands each entry to the handler, `XACK`s only what the handler
/// finished (committed).
pub struct StreamConsumer {
    _settings: StreamSettings,
}

impl StreamConsumer {
    /// Checks the URL; connects in [`StreamConsumer::run`].
    pub fn new(_redis_url: &str, settings: StreamSettings) -> Result<Self, StreamError> {
        Ok(Self {
            _settings: settings,
        })
    }

    /// Runs until `shutdown` completes (finishing the batch in hand) or an error that
    /// reconnecting did not cure.
    pub async fn run<H: Handler>(
        &self,
        _handler: H,
        _shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), StreamError> {
        unimplemented!("SEAM")
    }
}
