//! The outbox relay: delivers every `local_message` row downstream at least once.
//!
//! Claim due rows under a lease (committed), publish them, mark them sent only while the
//! lease is still ours. A crash between publish and mark republishes after the lease runs
//! out (at least once, never zero); a failure backs off in SQL and parks the row dead at
//! `relay.max_attempts`. Consumers deduplicate on `(topic, biz_key)`.

pub mod sink;
pub mod sinks;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::metrics::Metrics;
use crate::store::relay::Claimed;
use crate::store::{Store, StoreError};
use crate::time::Clock;
pub use sink::{Event, Sink};

/// How long a claim stays ours: longer than any batch can take to publish (the HTTP sink
/// posts a batch concurrently with a 10 s timeout each).
pub const LEASE_SECS: i64 = 60;

pub struct Relay {
    store: Store,
    sink: Arc<dyn Sink>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    /// Who holds a lease: unique per process, so several instances can share the outbox.
    owner: String,
    batch_size: i64,
    max_attempts: i32,
    /// Held while a tick runs: the scheduler may fire again before the last tick ends.
    running: tokio::sync::Mutex<()>,
    stopping: AtomicBool,
    /// Unix seconds (wall clock) of the last batch or tick that completed without a database
    /// error; starts at creation so a new relay is not "stalled".
    last_success: AtomicI64,
    /// What a tick that the database failed under left behind: batches published and not
    /// marked (the statement failed, or its answer was lost in a failover), each with its
    /// `written_since`, and whether leases of this relay may still be held. Settled first by
    /// the next tick ([`Relay::settle_unfinished`]).
    unfinished: std::sync::Mutex<Unfinished>,
}

#[derive(Default)]
struct Unfinished {
    unmarked: Vec<(Vec<i64>, crate::time::Timestamp)>,
    leases_held: bool,
}

/// What one tick did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TickReport {
    pub published: usize,
    pub failed: usize,
    /// The previous tick was still running, so this one did nothing.
    pub skipped: bool,
}

fn event(c: Claimed) -> Event {
    Event {
        id: c.id,
        topic: c.topic,
        biz_key: c.biz_key,
        payload: c.payload.0,
        created_at: c.created_at.as_datetime().to_rfc3339(),
    }
}

impl Relay {
    pub fn new(
        store: Store,
        sink: Arc<dyn Sink>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        batch_size: u32,
        max_attempts: u32,
    ) -> Self {
        let host: String = std::env::var("HOSTNAME")
            .unwrap_or_else(|_| "paynotify".into())
            .chars()
            .take(40)
            .collect();
        let owner = format!(
            "{host}-{}-{:08x}",
            std::process::id(),
            // A failed RNG only makes the owner id less unique; the process id still tells
            // instances apart.
            crate::random::bytes::<4>().map_or(0, u32::from_le_bytes)
        );
        let started = wall_clock_seconds();
        metrics.relay_last_success_timestamp_seconds.set(started);
        Self {
            store,
            sink,
            clock,
            metrics,
            owner,
            batch_size: i64::from(batch_size),
            max_attempts: i32::try_from(max_attempts).unwrap_or(i32::MAX),
            running: tokio::sync::Mutex::new(()),
            stopping: AtomicBool::new(false),
            last_success: AtomicI64::new(started),
            unfinished: Default::default(),
        }
    }

    /// Unix seconds of the last tick (or batch of a long tick) that completed without a
    /// database error.
    pub fn last_success(&self) -> i64 {
        self.last_success.load(Ordering::Relaxed)
    }

    fn record_success(&self) {
        let now = wall_clock_seconds();
        self.last_success.store(now, Ordering::Relaxed);
        self.metrics.relay_last_success_timestamp_seconds.set(now);
    }

    /// Delivers due messages batch by batch until none is due (a backlog drains at full
    /// speed, not one batch per tick) or shutdown begins.
    ///
    /// While the sink publishes a full batch, the next one is claimed: database and sink
    /// time overlap instead of adding up. The next batch is published only once this one is
    /// confirmed and marked, so messages go out in the order they were claimed, as one batch
    /// after another. A batch claimed ahead that will not be published now (a delivery
    /// failed, shutdown began, the database failed) has its leases given back at once.
    pub async fn tick(&self) -> Result<TickReport, StoreError> {
        let Ok(_running) = self.running.try_lock() else {
            return Ok(TickReport {
                skipped: true,
                ..TickReport::default()
            });
        };
        let mut report = TickReport::default();
        let result = self.tick_locked(&mut report).await;
        if result.is_err() {
            self.unfinished().leases_held = true;
        }
        result.map(|()| report)
    }

    fn unfinished(&self) -> std::sync::MutexGuard<'_, Unfinished> {
        self.unfinished
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Before anything else after a tick the database failed under: the rows that tick
    /// published and could not mark are marked sent now (they went out: held for the rest of
    /// their lease they would wait [`LEASE_SECS`] and go out again), then every lease this
    /// relay still holds (a batch claimed ahead) is given back, so those rows are due at once.
    /// A row another instance took meanwhile is not ours to mark: it goes out again there
    /// (at least once).
    async fn settle_unfinished(&self, report: &mut TickReport) -> Result<(), StoreError> {
        let (unmarked, leases_held) = {
            let mut unfinished = self.unfinished();
            (
                std::mem::take(&mut unfinished.unmarked),
                unfinished.leases_held,
            )
        };
        if !leases_held && unmarked.is_empty() {
            return Ok(());
        }
        let mut left = unmarked.into_iter();
        while let Some((ids, written_since)) = left.next() {
            match self
                .store
                .mark_sent(&self.owner, &ids, written_since, self.clock.now())
                .await
            {
                Ok(marked) => {
                    tracing::info!(
                        marked,
                        published = ids.len(),
                        "relay: rows published before the database failed marked sent"
                    );
                    report.published += marked;
                }
                Err(e) => {
                    let mut unfinished = self.unfinished();
                    unfinished.unmarked.push((ids, written_since));
                    unfinished.unmarked.extend(left);
                    return Err(e);
                }
            }
        }
        self.store.release_leases(&self.owner).await?;
        self.unfinished().leases_held = false;
        Ok(())
    }

    async fn tick_locked(&self, report: &mut TickReport) -> Result<(), StoreError> {
        self.settle_unfinished(report).await?;
        let mut claimed = if self.stopping.load(Ordering::Acquire) {
            Vec::new()
        } else {
            self.claim().await?
        };
        while !claimed.is_empty() {
            let full_batch = claimed.len() as i64 == self.batch_size;
            let ahead = full_batch && !self.stopping.load(Ordering::Acquire);
            let (delivered, next) = tokio::join!(self.deliver(claimed, report), async {
                if ahead {
                    self.claim().await
                } else {
                    Ok(Vec::new())
                }
            });
            let go_on = delivered.is_ok()
                && next.is_ok()
                && report.failed == 0
                && !self.stopping.load(Ordering::Acquire);
            match next {
                Ok(next) if go_on => claimed = next,
                Ok(next) => {
                    if !next.is_empty() {
                        self.give_back().await;
                    }
                    delivered?;
                    break;
                }
                Err(e) => {
                    delivered?;
                    return Err(e);
                }
            }
        }
        self.refresh_gauges().await?;
        self.record_success();
        Ok(())
    }

    /// Claims the next due batch under a lease.
    async fn claim(&self) -> Result<Vec<Claimed>, StoreError> {
        let now = self.clock.now();
        self.store
            .claim_messages(
                &self.owner,
                now,
                now.plus_seconds(LEASE_SECS),
                self.batch_size,
            )
            .await
    }

    /// Publishes one claimed batch and marks each row sent or failed.
    async fn deliver(
        &self,
        claimed: Vec<Claimed>,
        report: &mut TickReport,
    ) -> Result<(), StoreError> {
        let Some(written_since) = claimed.iter().map(|c| c.created_at).min() else {
            return Ok(());
        };
        let events: Vec<Event> = claimed.into_iter().map(event).collect();
        let results = self.sink.publish(&events).await;
        let mut delivered = Vec::with_capacity(events.len());
        let mut failures = Vec::new();
        for (e, result) in events.iter().zip(results) {
            match result {
                Ok(()) => delivered.push(e.id),
                Err(error) => failures.push((e, error)),
            }
        }
        for (e, error) in failures {
            tracing::warn!(id = e.id, topic = %e.topic, biz_key = %e.biz_key, sink = self.sink.name(), %error, "relay: delivery failed; will retry");
            let failed = self
                .store
                .mark_failed(
                    &self.owner,
                    e.id,
                    &error.to_string(),
                    self.max_attempts,
                    self.clock.now(),
                )
                .await;
            if let Err(e) = failed {
                self.unfinished().unmarked.push((delivered, written_since));
                return Err(e);
            }
            report.failed += 1;
        }
        if let Err(e) = self
            .store
            .mark_sent(&self.owner, &delivered, written_since, self.clock.now())
            .await
        {
            // Published, and perhaps marked (an answer lost in a failover): the next tick
            // marks them, which is the same whichever happened.
            self.unfinished().unmarked.push((delivered, written_since));
            return Err(e);
        }
        report.published += delivered.len();
        self.metrics.relay_published.inc_by(delivered.len() as u64);
        self.metrics
            .relay_failed
            .inc_by((events.len() - delivered.len()) as u64);
        // A long backlog is drained batch by batch: each one is progress.
        self.record_success();
        Ok(())
    }

    /// Gives back the leases of a batch claimed ahead and not published; on failure they
    /// run out after [`LEASE_SECS`].
    async fn give_back(&self) {
        if let Err(e) = self.store.release_leases(&self.owner).await {
            tracing::warn!(error = %e, "relay: leases of the batch claimed ahead not released; they expire in {LEASE_SECS} s");
        }
    }

    /// Pending count, dead count and the age of the oldest pending message.
    pub async fn refresh_gauges(&self) -> Result<(), StoreError> {
        let stats = self.store.outbox_stats().await?;
        self.metrics.outbox(
            stats.pending,
            stats.dead,
            stats.oldest_pending_secs(self.clock.now()),
        );
        Ok(())
    }

    /// Stops claiming, waits up to `drain` for the batch in flight, then gives back every
    /// lease still held so another instance can deliver those rows at once.
    pub async fn shutdown(&self, drain: Duration) {
        self.stopping.store(true, Ordering::Release);
        let finished = tokio::time::timeout(drain, self.running.lock())
            .await
            .is_ok();
        if !finished {
            tracing::warn!("relay: batch still in flight after the drain timeout");
        }
        match self.store.release_leases(&self.owner).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(released = n, "relay: leases released"),
            Err(e) => {
                tracing::warn!(error = %e, "relay: leases not released; they expire in {LEASE_SECS} s")
            }
        }
    }
}

/// Liveness is measured on the wall clock, not on the (possibly test) business clock.
fn wall_clock_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
