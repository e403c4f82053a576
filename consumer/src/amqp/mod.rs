//! RabbitMQ: a durable queue bound to paynotify's exchange (`relay.sink = "amqp"`).
//!
//! [`QueueConsumer::run`] connects, declares paynotify's exchange exactly as the service's
//! sink does (a durable topic exchange, no arguments, so both declarations agree), this
//! consumer's durable queue and its parked queue, binds the queue with each of
//! [`QueueSettings::bindings`], sets `basic.qos` to [`QueueSettings::prefetch`] and consumes
//! with manual acknowledgements:
//!
//! - each body is parsed into an [`Event`]; one that is not JSON, not an event, or whose
//!   `message_id` property is not the body's `{topic}:{biz_key}` is a poison message: logged
//!   once with its reason, parked, acknowledged, and no handler runs;
//! - the handler's `Ok` (returned only after its transaction committed) is `basic.ack`;
//! - [`Failure::Transient`] waits a growing delay ([`QueueSettings::retry_delay`] doubling
//!   up to [`QueueSettings::retry_delay_max`], 30 s by default), then `basic.nack` with
//!   requeue, so the message comes again; it is parked only once it failed on
//!   [`QueueSettings::max_attempts`] deliveries **and** at least
//!   [`QueueSettings::park_after`] (5 minutes by default) passed since its first failure,
//!   so that a database outage shorter than that parks nothing. [`Failure::Permanent`] and
//!   a poison message park at once.
//!
//! **Parking** publishes the original body and properties, its headers plus
//! `x-parked-reason`, `x-parked-attempts` and `x-parked-from` (this queue), persistent, to
//! [`QueueSettings::parked_queue`] through the default exchange, on a channel in confirm mode;
//! the parked queue is declared with the queue's `x-queue-type` only (plus
//! [`QueueSettings::parked_queue_arguments`]), never its TTL, length limit, dead-letter
//! exchange or delivery limit, so a parked message stays until someone takes it;
//! the original is acknowledged only after the broker confirmed the parked copy. A crash in
//! between parks it twice; a park that failed leaves the original unacknowledged (requeued),
//! so it is never lost.
//!
//! **Attempts.** RabbitMQ's classic queues do not count redeliveries (they only set
//! `redelivered`), so the consumer counts the failed deliveries of each message id, and when
//! this process first saw it fail, in memory: a restart of the process resets both, and a
//! message then gets up to `max_attempts` more deliveries and `park_after` more time (so
//! does every message once more than 100 000 ids failed at once: the memory is cleared
//! rather than grow without bound). Quorum queues (`x-queue-type = quorum` in [`QueueSettings::queue_arguments`]) carry
//! an `x-delivery-count` header; when it is present, the larger of the two counts is used.
//! Such a queue drops (or dead-letters) a message returned more than `x-delivery-limit`
//! times (RabbitMQ 4 sets 20 when none is given), so a message that reaches the limit is
//! parked then, whatever `park_after` says; the limit is read from `queue_arguments`, 20 for
//! a quorum queue without one. A queue's `x-message-ttl` also runs through requeues: one
//! shorter than `park_after` plus `retry_delay_max` can expire a failing message before it
//! is parked, which [`QueueConsumer::new`] warns about.
//!
//! **Concurrency.** Handlers run concurrently, each delivery in a task of its own, up to
//! `prefetch` at once (the broker sends no more unacknowledged deliveries than that): a
//! handler that waits on its database does not hold up the others, one that runs past
//! [`QueueSettings::handler_timeout`] (60 s by default) is cancelled and its delivery is a
//! transient failure (so a hung handler frees its slot), and acknowledging on one
//! channel from several tasks is safe with lapin. Events of different orders are
//! independent, and RabbitMQ does not keep the order of a requeued message anyway; a
//! handler whose work must be serial takes a lock (the example's SQLite connection is one).
//! Two deliveries of one message at once (a message published twice) are settled by the
//! inbox: one applies, the other is a duplicate.
//!
//! **Connection loss** (a closed connection, a broker restart, a channel the broker closed):
//! the session ends, the handlers in hand finish (their acknowledgements fail: the broker
//! redelivers what was unacknowledged, and the inbox makes those deliveries duplicates), and
//! the consumer connects again after a capped exponential backoff
//! ([`QueueSettings::reconnect_delay`] doubling up to
//! [`QueueSettings::reconnect_delay_max`]). [`QueueConsumer::run`] returns an error only after
//! [`QueueSettings::reconnect_attempts`] consecutive attempts failed to get as far as
//! consuming.
//!
//! **Shutdown**: when the `shutdown` future completes, the consumer cancels its
//! subscription, lets the handlers in hand finish and acknowledge, closes the channel and
//! the connection (which returns deliveries prefetched but not started to the queue) and
//! returns `Ok`.
//!
//! [`Event`]: crate::Event
//! [`Failure::Transient`]: crate::Failure::Transient
//! [`Failure::Permanent`]: crate::Failure::Permanent

mod consume;
mod settings;
mod wire;

use std::time::Duration;

pub use consume::QueueConsumer;
pub use settings::QueueSettings;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    /// A setting that cannot work (a malformed URL, a name longer than AMQP allows).
    #[error("amqp: invalid setting {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("amqp: {what}: no answer within {} ms", .after.as_millis())]
    Timeout { what: &'static str, after: Duration },
    /// The connection or channel closed, or the broker cancelled the subscription.
    #[error("amqp: {0}")]
    Lost(String),
    /// Every one of `attempts` consecutive attempts to connect and consume failed.
    #[error(
        "amqp: gave up after {attempts} consecutive failed connection attempts; the last: {last}"
    )]
    GaveUp {
        attempts: u32,
        last: Box<QueueError>,
    },
}
