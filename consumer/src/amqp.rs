//! RabbitMQ: a durable queue bound to paynotify's exchange (`relay.sink = "amqp"`).
//!
//! SEAM (replaced by the implementation): the public surface the example and the docs use.

use std::future::Future;

use crate::Handler;

/// Where and how to read.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// This consumer's durable queue (declared when missing).
    pub queue: String,
    /// paynotify's `relay.amqp_exchange` (a durable topic exchange; default
    /// `paynotify.events`), declared when missing.
    pub exchange: String,
    /// Routing keys the queue is bound with: topics (`ORDER_PAID`) or `#` for all.
    pub bindings: Vec<String>,
    /// `basic.qos` prefetch: unacknowledged messages in hand at once.
    pub prefetch: u16,
    /// Deliveries of one message before it is parked on `parked_queue` and acknowledged.
    pub max_attempts: u32,
    /// Where poison messages go (`{queue}.parked` by default).
    pub parked_queue: String,
}

impl QueueSettings {
    pub fn new(queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            exchange: "paynotify.events".to_owned(),
            bindings: vec!["#".to_owned()],
            prefetch: 32,
            max_attempts: 5,
            parked_queue: format!("{queue}.parked"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
}

/// Consumes the queue with manual acknowledgements: `basic.ack` only after the handler
/// finished (committed).
pub struct QueueConsumer {
    _settings: QueueSettings,
}

impl QueueConsumer {
    /// Checks the URL; connects in [`QueueConsumer::run`].
    pub fn new(_amqp_url: &str, settings: QueueSettings) -> Result<Self, QueueError> {
        Ok(Self {
            _settings: settings,
        })
    }

    /// Runs until `shutdown` completes or an error that reconnecting did not cure.
    pub async fn run<H: Handler>(
        &self,
        _handler: H,
        _shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), QueueError> {
        unimplemented!("SEAM")
    }
}
