//! The consume loop: connecting (and reconnecting), reading the group's entries (own
//! pending, claimed, new), handing each to the handler, acknowledging, parking and
//! retrying. The guarantees are the [module documentation](super)'s.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::StreamError;
use super::settings::{StreamSettings, validate};
use super::wire::{Claimed, Entry, autoclaim_reply, parse, pending_reply, read_reply};
use crate::backoff::backoff;
use crate::{Failure, Handler};

/// Reads the group, hands each entry to the handler, `XACK`s only what the handler
/// finished (committed). See the [module documentation](super) for the guarantees.
pub struct StreamConsumer {
    client: redis::Client,
    settings: StreamSettings,
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
        pending_reply(reply)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_pause_doubles_per_delivery_up_to_its_cap() {
        let s = StreamSettings::new("s", "g", "c");
        assert_eq!(retry_pause(&s, 1), Duration::from_millis(200));
        assert_eq!(retry_pause(&s, 3), Duration::from_millis(800));
        assert_eq!(retry_pause(&s, 20), Duration::from_secs(30));
        assert_eq!(retry_pause(&s, u64::MAX), Duration::from_secs(30));
    }
}
