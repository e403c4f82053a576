//! Apply each paynotify event once.
//!
//! paynotify delivers every outbox message at least once: a crash between publishing and
//! marking the row sent publishes it again, and a sink that timed out is retried. A consumer
//! that must not decrement stock twice records each message it applied in its own
//! `processed_message` table, **in the same transaction** as the effect, and acknowledges the
//! delivery only after that transaction commits. This crate is that pattern, once:
//!
//! - [`inbox::apply_once`]: the inbox row and the handler's effects in one transaction; a
//!   redelivery returns the first run's stored result without running the handler.
//! - Adapters that acknowledge only after commit: [`redis_streams`] (consumer groups,
//!   `XACK` after commit, `XAUTOCLAIM` of what a crashed consumer left), [`amqp`] (manual
//!   ack, prefetch, requeue on a transient failure, poison messages parked) and [`http`]
//!   (the signature of paynotify's http sink checked, 2xx only after commit).
//!
//! Every adapter hands a [`Handler`] one [`Event`]; the id to deduplicate on is
//! [`Event::message_id`], `{topic}:{biz_key}`, the same on every sink.

#[cfg(any(feature = "redis", feature = "amqp"))]
mod backoff;
mod event;
pub mod inbox;

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "redis")]
pub mod redis_streams;

pub use event::{Event, Failure, Handled, Handler, topics};
pub use inbox::{InboxError, Outcome, apply_once};
