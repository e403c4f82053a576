//! Redis Streams: a consumer group on paynotify's stream (`relay.sink = "redis-stream"`).
//!
//! paynotify's relay writes one entry per outbox message,
//! `XADD {stream} * id … topic … biz_key … payload … created_at …` (the payload a JSON
//! string). [`StreamConsumer::run`] reads them as one consumer of a consumer group and hands
//! each to a [`Handler`].
//!
//! # Guarantees
//!
//! - **At least once into the handler.** An entry is acknowledged (`XACK`) only after the
//!   handler returned `Ok`, which a handler does only once its transaction committed (see
//!   [`crate::apply_once`]). Anything delivered but not acknowledged stays in the group's
//!   pending list: a restarted process with the same consumer name re-reads its own pending
//!   entries first (`XREADGROUP … STREAMS s 0`), and entries a crashed consumer left pending
//!   longer than [`StreamSettings::claim_idle`] are taken over by another consumer with
//!   `XAUTOCLAIM`. A crash between the commit and the `XACK` therefore delivers the entry
//!   again: the handler must deduplicate on [`crate::Event::message_id`] (the inbox does).
//! - **Acknowledged after commit, per batch.** The entries of one read whose handler
//!   returned `Ok` are acknowledged together in one `XACK` after the whole batch ran.
//! - **Stream order within a batch, not across redeliveries.** Entries are handled one at a
//!   time in stream order; an entry retried after a transient failure, re-read after a
//!   reconnect or claimed from another consumer comes again after later entries were
//!   handled.
//! - **Bounded retries.** A [`crate::Failure::Transient`] leaves the entry pending; it is
//!   re-read after a pause of [`StreamSettings::retry_backoff`] doubled per delivery, at
//!   most [`StreamSettings::retry_backoff_max`]. Its delivery count (kept by Redis, read
//!   with `XPENDING`) counts the attempts. A transient failure parks the entry only when
//!   both hold: it has had [`StreamSettings::max_attempts`] deliveries, **and** at least
//!   [`StreamSettings::park_after`] has passed since this process first saw it fail (so a
//!   short outage of the handler's database parks nothing). That first failure is kept in
//!   memory per entry id (at most 100,000 entries, the oldest forgotten first): a restarted
//!   process, or one that took the entry over from another consumer, starts its clock
//!   again, which only parks later. While an entry is being retried the consumer re-reads
//!   its own pending list and reads nothing new: one entry failing transiently holds the
//!   consumer's progress for up to `park_after` (other consumers of the group go on; their
//!   `XAUTOCLAIM` takes over what this one leaves idle). A [`crate::Failure::Permanent`] and an entry that is not a paynotify event (a missing field, an `id` that is not an integer, a
//!   payload that is not JSON) are **parked**: copied with their original fields plus
//!   `reason` and `source_id` to [`StreamSettings::parked_stream`] (`XADD`), and
//!   acknowledged only once that `XADD` returned an id. A park that fails (a crash, or
//!   Redis refusing the `XADD`, e.g. `WRONGTYPE` when `parked_stream` names a key of
//!   another type) leaves the entry pending: it is logged and parked again on a later
//!   delivery, never acknowledged without being parked. (Not a `MULTI`/`EXEC`: Redis runs
//!   the rest of a transaction when one command in it fails.) A crash between the `XADD`
//!   and the `XACK` can park an entry twice; `source_id` tells the copies apart.
//! - **Reconnects.** A lost connection (Redis restarted, the client killed, a timeout) is
//!   made again with capped exponential backoff; [`StreamConsumer::run`] gives up with
//!   [`StreamError::GaveUp`] only after [`StreamSettings::reconnect_attempts`] consecutive
//!   failures. After every reconnect the consumer's own pending entries are re-read first.
//! - **Where a new group starts.** The group is created (when missing) at
//!   [`StreamSettings::start_id`] on the first connection: `$` by default, so a new
//!   consumer takes the events written from then on; `0` takes the stream's whole history.
//!   A group that goes missing while `run` runs (`NOGROUP`: destroyed with `XGROUP
//!   DESTROY`, the stream deleted, a Redis restarted without persistence) is not made
//!   again: `run` returns [`StreamError::GroupGone`], for an operator to decide.
//! - **Shutdown.** When the `shutdown` future completes, the batch in hand is finished and
//!   acknowledged, then `run` returns `Ok`. A read interrupted by shutdown may leave entries
//!   delivered to this consumer but never handled: they are pending, not lost.
//!
//! [`Handler`]: crate::Handler

mod consume;
mod settings;
mod wire;

pub use consume::StreamConsumer;
pub use settings::{BATCH_MAX, StreamSettings};

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A setting [`StreamConsumer::new`] refused; `what` names it.
    #[error("redis: invalid setting `{what}`: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// The consumer group disappeared while the consumer ran (`NOGROUP`: the group was
    /// destroyed or the stream deleted). It is not made again: the group held what was
    /// delivered and pending, and an operator must decide where a new one starts.
    #[error("redis: the consumer group {group:?} of stream {stream:?} is gone: {source}")]
    GroupGone {
        stream: String,
        group: String,
        #[source]
        source: redis::RedisError,
    },
    /// Reconnecting failed `attempts` times in a row.
    #[error("redis: gave up after {attempts} consecutive failed attempts: {last}")]
    GaveUp {
        attempts: u32,
        #[source]
        last: redis::RedisError,
    },
}
