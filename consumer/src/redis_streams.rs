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

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::{Event, Failure, Handler};

/// Where and how to read.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// paynotify's `relay.redis_stream` (default `paynotify:events`).
    pub stream: String,
    /// The consumer group: one per consuming service (created at `start_id`, with
    /// MKSTREAM, when missing at start).
    pub group: String,
    /// Where a group created now starts: `"$"` (the default) takes only entries added
    /// from now on; `"0"` takes the whole stream's history (paynotify's relay does not
    /// trim the stream, so that can be every event ever written). Used only when the
    /// group does not exist; an existing group continues where it is.
    pub start_id: String,
    /// This process's name in the group (unique per running instance; a restarted instance
    /// that keeps its name finishes what it held).
    pub consumer: String,
    /// Entries per `XREADGROUP`.
    pub batch: usize,
    /// How long one `XREADGROUP` blocks waiting for entries.
    pub block: Duration,
    /// Entries pending longer than this (a crashed or stuck consumer's) are taken over
    /// with `XAUTOCLAIM`. Keep it well above the time one batch takes to handle: an entry
    /// claimed while its first consumer still works on it runs twice (the inbox makes the
    /// second run a duplicate).
    pub claim_idle: Duration,
    /// How often the group is scanned with `XAUTOCLAIM` (also once at start).
    pub claim_every: Duration,
    /// Deliveries of one transiently failing entry before it may be parked on
    /// `parked_stream` and acknowledged (once `park_after` has passed too).
    pub max_attempts: u32,
    /// How long a transiently failing entry keeps being retried, from the first failure
    /// this process saw, before it may be parked (once it had `max_attempts` deliveries
    /// too). Default 5 minutes.
    pub park_after: Duration,
    /// Where poison entries go (`{stream}:parked` by default).
    pub parked_stream: String,
    /// The pause before an entry that failed transiently is read again, after its first
    /// delivery; doubled per further delivery up to `retry_backoff_max`.
    pub retry_backoff: Duration,
    /// The longest pause before a transiently failed entry is read again (default 30 s).
    pub retry_backoff_max: Duration,
    /// The first pause after a lost connection; doubled per consecutive failure up to
    /// `reconnect_backoff_max`.
    pub reconnect_backoff: Duration,
    pub reconnect_backoff_max: Duration,
    /// Consecutive failed attempts (to connect, or a command failing on a fresh
    /// connection) before [`StreamConsumer::run`] gives up.
    pub reconnect_attempts: u32,
    /// The longest wait for a connection and for an answer (beyond `block` for a blocking
    /// read).
    pub command_timeout: Duration,
    /// The connection's `CLIENT SETNAME` (default [`StreamSettings::default_client_name`]),
    /// so an operator can find it in `CLIENT LIST`.
    pub client_name: Option<String>,
}

impl StreamSettings {
    pub fn new(stream: &str, group: &str, consumer: &str) -> Self {
        Self {
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            start_id: "$".to_owned(),
            batch: 64,
            block: Duration::from_secs(2),
            claim_idle: Duration::from_secs(60),
            claim_every: Duration::from_secs(30),
            max_attempts: 5,
            park_after: Duration::from_secs(300),
            parked_stream: format!("{stream}:parked"),
            retry_backoff: Duration::from_millis(200),
            retry_backoff_max: Duration::from_secs(30),
            reconnect_backoff: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            reconnect_attempts: 10,
            command_timeout: Duration::from_secs(5),
            client_name: None,
        }
    }

    /// `pnc:{stream}:{group}:{consumer}`, with whitespace and control characters (which
    /// Redis refuses in a client name) replaced by `_`.
    pub fn default_client_name(&self) -> String {
        format!("pnc:{}:{}:{}", self.stream, self.group, self.consumer)
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .collect()
    }

    /// The name the connection is given.
    pub fn effective_client_name(&self) -> String {
        self.client_name
            .clone()
            .unwrap_or_else(|| self.default_client_name())
    }
}

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

/// Reads the group, hands each entry to the handler, `XACK`s only what the handler
/// finished (committed). See the [module documentation](self) for the guarantees.
pub struct StreamConsumer {
    client: redis::Client,
    settings: StreamSettings,
}

/// One stream entry as read: its id and its fields, `None` when the entry was deleted
/// from the stream while pending.
struct Entry {
    id: String,
    fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// What the next read is.
#[derive(Debug)]
enum Source {
    /// This consumer's own pending entries, after `cursor`.
    Own { cursor: String },
    /// Other consumers' idle entries, `XAUTOCLAIM` from `cursor`.
    Claim { cursor: String },
    /// New entries (`>`).
    New,
}

/// How one step ended.
enum Step {
    Continue,
    Stop,
}

/// What one entry came to.
enum Verdict {
    Ack,
    Park(String),
    /// Failed transiently at this many deliveries.
    Retry(u64),
}

/// The most entries whose first failure is remembered.
const FIRST_FAILURES_MAX: usize = 100_000;

/// When this process first saw each failing entry fail, bounded by [`FIRST_FAILURES_MAX`].
#[derive(Default)]
struct FirstFailures(HashMap<String, Instant>);

impl FirstFailures {
    /// The first failure of `id`, recorded now when it is new.
    fn since(&mut self, id: &str) -> Instant {
        if let Some(at) = self.0.get(id) {
            return *at;
        }
        if self.0.len() >= FIRST_FAILURES_MAX {
            // Forgetting the oldest restarts its clock: it is parked later, never sooner.
            if let Some(oldest) = self
                .0
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
            {
                self.0.remove(&oldest);
            }
        }
        let now = Instant::now();
        self.0.insert(id.to_owned(), now);
        now
    }

    fn forget(&mut self, id: &str) {
        self.0.remove(id);
    }
}

impl StreamConsumer {
    /// Checks the URL and the settings ([`StreamError::Invalid`] names the one refused);
    /// connects in [`StreamConsumer::run`].
    pub fn new(redis_url: &str, settings: StreamSettings) -> Result<Self, StreamError> {
        validate(&settings)?;
        let client = redis::Client::open(redis_url)?;
        Ok(Self { client, settings })
    }

    pub fn settings(&self) -> &StreamSettings {
        &self.settings
    }

    /// Runs until `shutdown` completes (finishing the batch in hand) or an error that
    /// reconnecting did not cure.
    pub async fn run<H: Handler>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), StreamError> {
        let s = &self.settings;
        tokio::pin!(shutdown);
        let mut connection: Option<MultiplexedConnection> = None;
        let mut failures: u32 = 0;
        let mut source = Source::Own {
            cursor: "0".to_owned(),
        };
        let mut next_claim = Instant::now();
        let mut first_failures = FirstFailures::default();
        // The group is made (when missing) on the first connection only: one that is
        // missing later vanished while running.
        let mut group_made = false;
        loop {
            let result = match connection.as_mut() {
                Some(c) => {
                    self.step(
                        c,
                        &handler,
                        &mut source,
                        &mut next_claim,
                        &mut first_failures,
                        &mut shutdown,
                    )
                    .await
                }
                None => match self.connect(!group_made).await {
                    Ok(c) => {
                        group_made = true;
                        tracing::info!(stream = %s.stream, group = %s.group, consumer = %s.consumer, "redis: connected");
                        connection = Some(c);
                        // Whatever this consumer held before the connection was lost is
                        // pending: read it first.
                        source = Source::Own {
                            cursor: "0".to_owned(),
                        };
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(Step::Stop) => return Ok(()),
                Ok(Step::Continue) => failures = 0,
                Err(e) if e.code() == Some("NOGROUP") => {
                    tracing::error!(stream = %s.stream, group = %s.group, error = %e, "redis: the consumer group is gone; stopping (not recreating it)");
                    return Err(StreamError::GroupGone {
                        stream: s.stream.clone(),
                        group: s.group.clone(),
                        source: e,
                    });
                }
                Err(e) => {
                    connection = None;
                    failures += 1;
                    if failures >= s.reconnect_attempts {
                        tracing::error!(stream = %s.stream, attempts = failures, error = %e, "redis: giving up");
                        return Err(StreamError::GaveUp {
                            attempts: failures,
                            last: e,
                        });
                    }
                    let pause = backoff(s.reconnect_backoff, s.reconnect_backoff_max, failures);
                    tracing::warn!(stream = %s.stream, attempt = failures, pause_ms = pause.as_millis() as u64, error = %e, "redis: connection lost, reconnecting");
                    tokio::select! {
                        biased;
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    /// A new connection, named, with the group made at `start_id` when `make_group` and
    /// it is missing.
    async fn connect(&self, make_group: bool) -> Result<MultiplexedConnection, redis::RedisError> {
        let s = &self.settings;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(s.command_timeout))
            .set_response_timeout(Some(s.block + s.command_timeout));
        let mut c = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(s.effective_client_name())
            .query_async::<()>(&mut c)
            .await?;
        if !make_group {
            return Ok(c);
        }
        let created = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&s.stream)
            .arg(&s.group)
            .arg(&s.start_id)
            .arg("MKSTREAM")
            .query_async::<()>(&mut c)
            .await;
        match created {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e),
        }
        Ok(c)
    }

    /// One read and the batch it brought.
    async fn step<H: Handler>(
        &self,
        c: &mut MultiplexedConnection,
        handler: &H,
        source: &mut Source,
        next_claim: &mut Instant,
        first_failures: &mut FirstFailures,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Step, redis::RedisError> {
        let s = &self.settings;
        let (entries, first_delivery) = match source {
            Source::Own { cursor } => {
                let read = xreadgroup(s, cursor, None);
                let reply = tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ok(Step::Stop),
                    r = read.query_async::<Value>(c) => r?,
                };
                let entries = read_reply(reply)?;
                match entries.last() {
                    Some(last) => *cursor = last.id.clone(),
                    None => {
                        *source = if Instant::now() >= *next_claim {
                            Source::Claim {
                                cursor: "0-0".to_owned(),
                            }
                        } else {
                            Source::New
                        };
                        return Ok(Step::Continue);
                    }
                }
                (entries, false)
            }
            Source::Claim { cursor } => {
                let claim = redis::cmd("XAUTOCLAIM")
                    .arg(&s.stream)
                    .arg(&s.group)
                    .arg(&s.consumer)
                    .arg(s.claim_idle.as_millis() as u64)
                    .arg(cursor.as_str())
                    .arg("COUNT")
                    .arg(s.batch)
                    .to_owned();
                let reply = tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ok(Step::Stop),
                    r = claim.query_async::<Value>(c) => r?,
                };
                let Claimed {
                    next,
                    entries,
                    deleted,
                    unnamed_deleted,
                } = autoclaim_reply(reply)?;
                if !deleted.is_empty() {
                    // Pending but gone from the stream (Redis 7 names them and drops them
                    // from the pending list itself; the XACK is for a server that does not).
                    tracing::warn!(stream = %s.stream, consumer = %s.consumer, deleted = deleted.len(), "redis: pending entries were deleted from the stream; acknowledged");
                    let ids: Vec<&str> = deleted.iter().map(String::as_str).collect();
                    self.ack(c, &ids).await?;
                }
                if !entries.is_empty() {
                    tracing::info!(stream = %s.stream, consumer = %s.consumer, claimed = entries.len(), "redis: took over idle entries");
                }
                if next == "0-0" {
                    *source = if unnamed_deleted {
                        Source::Own {
                            cursor: "0".to_owned(),
                        }
                    } else {
                        Source::New
                    };
                    *next_claim = Instant::now() + s.claim_every;
                } else if unnamed_deleted {
                    *source = Source::Own {
                        cursor: "0".to_owned(),
                    };
                } else {
                    *cursor = next;
                }
                (entries, false)
            }
            Source::New => {
                if Instant::now() >= *next_claim {
                    *source = Source::Claim {
                        cursor: "0-0".to_owned(),
                    };
                    return Ok(Step::Continue);
                }
                let read = xreadgroup(s, ">", Some(s.block));
                // Dropping the read on shutdown may leave entries delivered to this
                // consumer and never seen: they stay pending (re-read at the next start).
                let reply = tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ok(Step::Stop),
                    r = read.query_async::<Value>(c) => r?,
                };
                (read_reply(reply)?, true)
            }
        };
        if entries.is_empty() {
            return Ok(Step::Continue);
        }
        let counts = if first_delivery {
            HashMap::new()
        } else {
            self.delivery_counts(c, &entries).await?
        };
        let mut acks: Vec<String> = Vec::new();
        let mut parks: Vec<(&Entry, String)> = Vec::new();
        // The fewest deliveries among the entries to read again: the pause is theirs.
        let mut retry: Option<u64> = None;
        for entry in &entries {
            let deliveries = counts.get(&entry.id).copied().unwrap_or(1).max(1);
            match self
                .handle(handler, entry, deliveries, first_failures)
                .await
            {
                Verdict::Ack => acks.push(entry.id.clone()),
                Verdict::Park(reason) => parks.push((entry, reason)),
                Verdict::Retry(n) => retry = Some(retry.map_or(n, |r| r.min(n))),
            }
        }
        let not_parked = self.finish(c, &acks, &parks).await?;
        for id in &acks {
            first_failures.forget(id);
        }
        for (entry, _) in &parks {
            if not_parked.contains(&entry.id.as_str()) {
                let n = counts.get(&entry.id).copied().unwrap_or(1).max(1);
                retry = Some(retry.map_or(n, |r| r.min(n)));
            } else {
                first_failures.forget(&entry.id);
            }
        }
        if let Some(deliveries) = retry {
            // The failed entries are pending on this consumer: read them again (with their
            // delivery count one higher) after the pause.
            let pause = retry_pause(s, deliveries);
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(Step::Stop),
                _ = tokio::time::sleep(pause) => {}
            }
            *source = Source::Own {
                cursor: "0".to_owned(),
            };
        }
        Ok(Step::Continue)
    }

    /// Each entry's delivery count, from `XPENDING` over the batch's id range.
    async fn delivery_counts(
        &self,
        c: &mut MultiplexedConnection,
        entries: &[Entry],
    ) -> Result<HashMap<String, u64>, redis::RedisError> {
        let s = &self.settings;
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(HashMap::new());
        };
        let reply: Value = redis::cmd("XPENDING")
            .arg(&s.stream)
            .arg(&s.group)
            .arg(&first.id)
            .arg(&last.id)
            .arg(entries.len().max(s.batch))
            .arg(&s.consumer)
            .query_async(c)
            .await?;
        let mut counts = HashMap::new();
        for row in array(reply)? {
            let mut row = array(row)?.into_iter();
            let (Some(id), Some(_owner), Some(_idle), Some(count)) =
                (row.next(), row.next(), row.next(), row.next())
            else {
                return Err(unexpected("an XPENDING row of fewer than 4 items"));
            };
            counts.insert(string(id)?, integer(count)?);
        }
        Ok(counts)
    }

    /// Runs the handler for one entry and says what becomes of it.
    async fn handle<H: Handler>(
        &self,
        handler: &H,
        entry: &Entry,
        deliveries: u64,
        first_failures: &mut FirstFailures,
    ) -> Verdict {
        let s = &self.settings;
        let Some(fields) = &entry.fields else {
            // Deleted from the stream while pending: nothing left to hand over.
            tracing::warn!(stream = %s.stream, entry = %entry.id, "redis: a pending entry was deleted from the stream; acknowledged");
            return Verdict::Ack;
        };
        let event = match parse(fields) {
            Ok(event) => event,
            Err(reason) => {
                tracing::warn!(stream = %s.stream, entry = %entry.id, %reason, "redis: not a paynotify event; parked");
                return Verdict::Park(reason);
            }
        };
        let message_id = event.message_id();
        match handler.handle(event).await {
            Ok(()) => Verdict::Ack,
            Err(Failure::Permanent(reason)) => {
                tracing::warn!(stream = %s.stream, entry = %entry.id, %message_id, %reason, "redis: the handler refused the event; parked");
                Verdict::Park(format!("permanent: {reason}"))
            }
            Err(Failure::Transient(reason)) => {
                let failing_for = first_failures.since(&entry.id).elapsed();
                if deliveries >= u64::from(s.max_attempts) && failing_for >= s.park_after {
                    tracing::warn!(stream = %s.stream, entry = %entry.id, %message_id, %reason, deliveries, failing_for_ms = failing_for.as_millis() as u64, "redis: still failing after the last attempt; parked");
                    Verdict::Park(format!(
                        "transient after {deliveries} deliveries over {} s: {reason}",
                        failing_for.as_secs()
                    ))
                } else {
                    tracing::info!(stream = %s.stream, entry = %entry.id, %message_id, %reason, deliveries, "redis: transient failure; will retry");
                    Verdict::Retry(deliveries)
                }
            }
        }
    }

    /// Parks, then acknowledges: each parked copy is written with its own `XADD` and its
    /// answer checked, then one `XACK` covers the handled entries and those whose copy was
    /// written. An entry whose `XADD` failed (say `parked_stream` names a key of another
    /// type) is not acknowledged: it stays pending and comes again. Returns the ids of
    /// the entries not parked.
    async fn finish<'e>(
        &self,
        c: &mut MultiplexedConnection,
        acks: &[String],
        parks: &[(&'e Entry, String)],
    ) -> Result<Vec<&'e str>, redis::RedisError> {
        let s = &self.settings;
        let mut done: Vec<&str> = acks.iter().map(String::as_str).collect();
        let mut failed = Vec::new();
        for (entry, reason) in parks {
            let mut xadd = redis::cmd("XADD");
            xadd.arg(&s.parked_stream).arg("*");
            for (name, value) in entry.fields.iter().flatten() {
                xadd.arg(name.as_slice()).arg(value.as_slice());
            }
            xadd.arg("reason")
                .arg(reason)
                .arg("source_id")
                .arg(&entry.id);
            match xadd.query_async::<Value>(c).await {
                Ok(Value::BulkString(_) | Value::SimpleString(_)) => done.push(&entry.id),
                Ok(other) => {
                    failed.push(entry.id.as_str());
                    tracing::error!(stream = %s.stream, parked_stream = %s.parked_stream, entry = %entry.id, reply = ?other, "redis: parking gave no id; the entry stays pending");
                }
                // An error Redis answered (WRONGTYPE, OOM, …): this entry is not parked.
                // Anything else (the connection) is the caller's to handle.
                Err(e) if e.code().is_some() => {
                    failed.push(entry.id.as_str());
                    tracing::error!(stream = %s.stream, parked_stream = %s.parked_stream, entry = %entry.id, error = %e, "redis: parking failed; the entry stays pending");
                }
                Err(e) => return Err(e),
            }
        }
        if !done.is_empty() {
            self.ack(c, &done).await?;
        }
        Ok(failed)
    }

    /// One `XACK` of `ids`.
    async fn ack(
        &self,
        c: &mut MultiplexedConnection,
        ids: &[&str],
    ) -> Result<(), redis::RedisError> {
        let s = &self.settings;
        let mut xack = redis::cmd("XACK");
        xack.arg(&s.stream).arg(&s.group);
        for id in ids {
            xack.arg(*id);
        }
        xack.query_async::<()>(c).await
    }
}

/// The most entries one read may ask for.
pub const BATCH_MAX: usize = 10_000;

fn validate(s: &StreamSettings) -> Result<(), StreamError> {
    let invalid = |what: &'static str, reason: &str| {
        Err(StreamError::Invalid {
            what,
            reason: reason.to_owned(),
        })
    };
    if s.stream.is_empty() {
        return invalid("stream", "must not be empty");
    }
    if s.group.is_empty() {
        return invalid("group", "must not be empty");
    }
    if s.consumer.is_empty() {
        return invalid("consumer", "must not be empty");
    }
    if s.start_id.is_empty() {
        return invalid("start_id", "must not be empty (`$` or `0`)");
    }
    if s.batch < 1 || s.batch > BATCH_MAX {
        return invalid(
            "batch",
            &format!("must be 1 to {BATCH_MAX}, is {}", s.batch),
        );
    }
    if s.block < Duration::from_millis(1) {
        return invalid("block", "must be at least 1 ms (0 would block forever)");
    }
    if s.max_attempts < 1 {
        return invalid("max_attempts", "must be at least 1");
    }
    // Zero would spin: a claim due again at once never lets a read of new entries run,
    // and a retry without a pause re-reads the entry in a hot loop.
    for (what, d) in [
        ("claim_every", s.claim_every),
        ("claim_idle", s.claim_idle),
        ("retry_backoff", s.retry_backoff),
        ("command_timeout", s.command_timeout),
    ] {
        if d.is_zero() {
            return invalid(what, "must be above zero");
        }
    }
    if s.reconnect_attempts < 1 {
        return invalid("reconnect_attempts", "must be at least 1");
    }
    if s.parked_stream == s.stream {
        return invalid("parked_stream", "must not be the stream itself");
    }
    if s.parked_stream.is_empty() {
        return invalid("parked_stream", "must not be empty");
    }
    Ok(())
}

fn xreadgroup(s: &StreamSettings, from: &str, block: Option<Duration>) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(&s.group)
        .arg(&s.consumer)
        .arg("COUNT")
        .arg(s.batch);
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(block.as_millis() as u64);
    }
    cmd.arg("STREAMS").arg(&s.stream).arg(from);
    cmd
}

/// The pause before re-reading an entry that failed at its `deliveries`-th delivery.
fn retry_pause(s: &StreamSettings, deliveries: u64) -> Duration {
    let n = u32::try_from(deliveries).unwrap_or(u32::MAX);
    backoff(s.retry_backoff, s.retry_backoff_max, n)
}

/// `base * 2^(failures-1)`, at most `max`.
fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(max)
}

/// A paynotify event from an entry's fields, or why it is not one.
fn parse(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Event, String> {
    let field = |name: &str| -> Result<String, String> {
        let value = fields
            .iter()
            .find(|(n, _)| n.as_slice() == name.as_bytes())
            .map(|(_, v)| v)
            .ok_or_else(|| format!("missing field `{name}`"))?;
        String::from_utf8(value.clone()).map_err(|_| format!("field `{name}` is not UTF-8"))
    };
    let id = field("id")?;
    let id: i64 = id
        .parse()
        .map_err(|_| format!("field `id` is not an integer: {id:?}"))?;
    let payload = field("payload")?;
    let payload =
        serde_json::from_str(&payload).map_err(|e| format!("field `payload` is not JSON: {e}"))?;
    Ok(Event {
        id,
        topic: field("topic")?,
        biz_key: field("biz_key")?,
        payload,
        created_at: field("created_at")?,
    })
}

fn unexpected(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}

fn array(v: Value) -> Result<Vec<Value>, redis::RedisError> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        _ => Err(unexpected("an array")),
    }
}

fn bytes(v: Value) -> Result<Vec<u8>, redis::RedisError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        _ => Err(unexpected("a string")),
    }
}

fn string(v: Value) -> Result<String, redis::RedisError> {
    String::from_utf8(bytes(v)?).map_err(|_| unexpected("a UTF-8 string"))
}

fn integer(v: Value) -> Result<u64, redis::RedisError> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| unexpected("a count")),
        other => string(other)?.parse().map_err(|_| unexpected("an integer")),
    }
}

/// `[[id, [field, value, …] | nil], …]`.
fn entries(v: Value) -> Result<Vec<Entry>, redis::RedisError> {
    let mut out = Vec::new();
    for item in array(v)? {
        let mut item = array(item)?.into_iter();
        let Some(id) = item.next() else {
            return Err(unexpected("a stream entry with an id"));
        };
        let id = string(id)?;
        let fields = match item.next() {
            None | Some(Value::Nil) => None,
            Some(Value::Map(pairs)) => Some(
                pairs
                    .into_iter()
                    .map(|(n, v)| Ok((bytes(n)?, bytes(v)?)))
                    .collect::<Result<Vec<_>, redis::RedisError>>()?,
            ),
            Some(list) => {
                let mut flat = array(list)?.into_iter();
                let mut pairs = Vec::new();
                while let Some(name) = flat.next() {
                    let Some(value) = flat.next() else {
                        return Err(unexpected("an even number of field items"));
                    };
                    pairs.push((bytes(name)?, bytes(value)?));
                }
                Some(pairs)
            }
        };
        out.push(Entry { id, fields });
    }
    Ok(out)
}

/// `XREADGROUP`'s reply: nil (timed out) or `[[stream, entries]]` (or a map in RESP3).
fn read_reply(v: Value) -> Result<Vec<Entry>, redis::RedisError> {
    let streams = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(pairs) => pairs.into_iter().map(|(_, e)| e).collect(),
        other => array(other)?
            .into_iter()
            .map(|s| {
                let mut s = array(s)?.into_iter();
                s.nth(1)
                    .ok_or_else(|| unexpected("a [stream, entries] pair"))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut out = Vec::new();
    for e in streams {
        out.extend(entries(e)?);
    }
    Ok(out)
}

/// What one `XAUTOCLAIM` brought.
struct Claimed {
    next: String,
    entries: Vec<Entry>,
    /// Pending entries deleted from the stream: nothing left to hand over.
    deleted: Vec<String>,
    /// Deleted entries answered as a bare nil (Redis 6.2): claimed now, so this
    /// consumer's own pending read (`0`) shows them with their ids, and acknowledges them.
    unnamed_deleted: bool,
}

/// `XAUTOCLAIM`'s reply: `[next cursor, entries, deleted ids]` (Redis 7), or `[next
/// cursor, entries]` with a nil entry for one deleted while pending (6.2).
fn autoclaim_reply(v: Value) -> Result<Claimed, redis::RedisError> {
    let mut parts = array(v)?.into_iter();
    let (Some(next), Some(claimed)) = (parts.next(), parts.next()) else {
        return Err(unexpected("an XAUTOCLAIM reply of a cursor and entries"));
    };
    let mut deleted = Vec::new();
    let mut kept = Vec::new();
    let items = array(claimed)?;
    let count = items.len();
    let items: Vec<Value> = items.into_iter().filter(|v| *v != Value::Nil).collect();
    let unnamed_deleted = items.len() < count;
    for e in entries(Value::Array(items))? {
        match e.fields {
            Some(_) => kept.push(e),
            None => deleted.push(e.id),
        }
    }
    if let Some(ids) = parts.next() {
        for id in array(ids)? {
            deleted.push(string(id)?);
        }
    }
    Ok(Claimed {
        next: string(next)?,
        entries: kept,
        deleted,
        unnamed_deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn parses_an_entry_or_says_why_not() {
        let good = f(&[
            ("id", "7"),
            ("topic", "ORDER_PAID"),
            ("biz_key", "O1"),
            ("payload", "{\"a\":1}"),
            ("created_at", "2024-01-01T00:00:00Z"),
        ]);
        let event = parse(&good).expect("an event");
        assert_eq!(event.message_id(), "ORDER_PAID:O1");
        assert_eq!(event.payload["a"], 1);
        let missing = f(&[("id", "7"), ("topic", "ORDER_PAID"), ("payload", "{}")]);
        assert!(parse(&missing).unwrap_err().contains("biz_key"));
        let mut not_json = good.clone();
        not_json[3].1 = b"{nope".to_vec();
        assert!(parse(&not_json).unwrap_err().contains("not JSON"));
        let mut bad_id = good;
        bad_id[0].1 = b"x".to_vec();
        assert!(parse(&bad_id).unwrap_err().contains("not an integer"));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = |n| backoff(Duration::from_millis(100), Duration::from_secs(1), n);
        assert_eq!(b(1), Duration::from_millis(100));
        assert_eq!(b(2), Duration::from_millis(200));
        assert_eq!(b(4), Duration::from_millis(800));
        assert_eq!(b(5), Duration::from_secs(1));
        assert_eq!(b(40), Duration::from_secs(1));
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let ok = StreamSettings::new("s", "g", "c");
        assert!(validate(&ok).is_ok());
        let refused = |change: &dyn Fn(&mut StreamSettings)| {
            let mut s = ok.clone();
            change(&mut s);
            match validate(&s) {
                Err(StreamError::Invalid { what, .. }) => what,
                other => panic!("expected Invalid, got {other:?}"),
            }
        };
        assert_eq!(refused(&|s| s.batch = 0), "batch");
        assert_eq!(refused(&|s| s.batch = BATCH_MAX + 1), "batch");
        assert_eq!(refused(&|s| s.block = Duration::ZERO), "block");
        assert_eq!(refused(&|s| s.block = Duration::from_micros(999)), "block");
        assert_eq!(refused(&|s| s.max_attempts = 0), "max_attempts");
        assert_eq!(refused(&|s| s.reconnect_attempts = 0), "reconnect_attempts");
        assert_eq!(
            refused(&|s| s.parked_stream = "s".to_owned()),
            "parked_stream"
        );
        assert_eq!(refused(&|s| s.start_id = String::new()), "start_id");
        assert_eq!(refused(&|s| s.claim_every = Duration::ZERO), "claim_every");
        assert_eq!(refused(&|s| s.claim_idle = Duration::ZERO), "claim_idle");
        assert_eq!(
            refused(&|s| s.retry_backoff = Duration::ZERO),
            "retry_backoff"
        );
        assert_eq!(
            refused(&|s| s.command_timeout = Duration::ZERO),
            "command_timeout"
        );
        let mut edge = ok.clone();
        edge.batch = BATCH_MAX;
        edge.block = Duration::from_millis(1);
        edge.max_attempts = 1;
        edge.reconnect_attempts = 1;
        assert!(validate(&edge).is_ok());
        let e = StreamConsumer::new("redis://127.0.0.1:6379", {
            let mut s = ok.clone();
            s.batch = 0;
            s
        })
        .err()
        .expect("refused");
        assert!(e.to_string().contains("`batch`"), "{e}");
    }

    #[test]
    fn autoclaim_replies_of_redis_6_and_7_name_the_deleted_entries() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let entry =
            |id: &str| Value::Array(vec![bulk(id), Value::Array(vec![bulk("id"), bulk("1")])]);
        // Redis 7: the third element lists the deleted ids.
        let seven = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("1-0")]),
            Value::Array(vec![bulk("2-0"), bulk("3-0")]),
        ]);
        let c = autoclaim_reply(seven).expect("a reply");
        assert_eq!(c.next, "0-0");
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.deleted, vec!["2-0".to_owned(), "3-0".to_owned()]);
        assert!(!c.unnamed_deleted);
        // An entry with nil fields.
        let nil_fields = Value::Array(vec![
            bulk("5-0"),
            Value::Array(vec![
                entry("1-0"),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ]);
        let c = autoclaim_reply(nil_fields).expect("a reply");
        assert_eq!(c.next, "5-0");
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.deleted, vec!["2-0".to_owned()]);
        // Redis 6.2: a bare nil in place of the entry.
        let six = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![Value::Nil, entry("1-0")]),
        ]);
        let c = autoclaim_reply(six).expect("a reply");
        assert_eq!(c.entries.len(), 1);
        assert!(c.deleted.is_empty());
        assert!(
            c.unnamed_deleted,
            "to be read again from the own pending list"
        );
    }

    #[test]
    fn the_retry_pause_doubles_per_delivery_up_to_its_cap() {
        let s = StreamSettings::new("s", "g", "c");
        assert_eq!(retry_pause(&s, 1), Duration::from_millis(200));
        assert_eq!(retry_pause(&s, 3), Duration::from_millis(800));
        assert_eq!(retry_pause(&s, 20), Duration::from_secs(30));
        assert_eq!(retry_pause(&s, u64::MAX), Duration::from_secs(30));
    }
}
