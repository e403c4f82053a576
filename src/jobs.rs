//! The scheduled jobs of `paynotify serve`, on tokio-cron-scheduler: the outbox relay, order
//! expiry and retention. Each job skips a tick while its previous run is still going
//! (the scheduler itself would start it again).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_cron_scheduler::{Job, JobScheduler, JobSchedulerError};

use crate::relay::Relay;
use crate::store::Store;
use crate::time::Clock;

/// How many expired orders one expiry statement reads; each is closed in its own short
/// transaction.
const EXPIRY_BATCH: i64 = 500;
const EXPIRY_EVERY: Duration = Duration::from_secs(10);
/// Rows per retention statement, and the pause between statements so the hot path never
/// waits on the purge.
const RETENTION_BATCH: i64 = 1000;
const RETENTION_PAUSE: Duration = Duration::from_millis(50);
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// The order-expiry job: `WAIT_PAY` orders past `expire_at` → `CLOSED` by compare-and-set,
/// each with its `ORDER_CLOSED` message. Returns how many it closed.
pub async fn expire_orders(
    store: &Store,
    clock: &dyn Clock,
) -> Result<usize, crate::store::StoreError> {
    let mut closed = 0;
    loop {
        let now = clock.now();
        let due = store.expired_orders(now, EXPIRY_BATCH).await?;
        for order_no in &due {
            if let crate::store::ledger::CloseResult::Closed(_) =
                store.close_order(order_no, "expiry", now).await?
            {
                closed += 1;
            }
        }
        if (due.len() as i64) < EXPIRY_BATCH {
            return Ok(closed);
        }
    }
}

/// The retention job: callback rows of decided orders, sent messages and idempotency keys
/// older than `keep_days`, in batches with pauses. Pending and dead messages stay.
pub async fn purge(
    store: &Store,
    clock: &dyn Clock,
    keep_days: u32,
) -> Result<usize, crate::store::StoreError> {
    let cutoff = clock
        .now()
        .plus_seconds(-i64::from(keep_days.max(2)) * 86_400);
    let mut total = 0;
    loop {
        let deleted = store.purge_batch(cutoff, RETENTION_BATCH).await?;
        let most = deleted.iter().map(|(_, n)| *n).max().unwrap_or(0);
        total += deleted.iter().map(|(_, n)| *n).sum::<usize>();
        if (most as i64) < RETENTION_BATCH {
            return Ok(total);
        }
        tokio::time::sleep(RETENTION_PAUSE).await;
    }
}

type JobFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `work` unless the previous run of the same job (holding `busy`) is still going.
fn unless_busy(
    busy: &Arc<Mutex<()>>,
    work: impl Future<Output = ()> + Send + 'static,
) -> JobFuture {
    let busy = Arc::clone(busy);
    Box::pin(async move {
        if let Ok(_running) = busy.try_lock() {
            work.await;
        }
    })
}

pub struct Jobs {
    scheduler: JobScheduler,
    relay: Arc<Relay>,
}

impl Jobs {
    pub async fn start(
        store: Store,
        clock: Arc<dyn Clock>,
        relay: Arc<Relay>,
        relay_every: Duration,
        keep_days: u32,
    ) -> Result<Self, JobSchedulerError> {
        let scheduler = JobScheduler::new().await?;
        let r = Arc::clone(&relay);
        scheduler
            .add(Job::new_repeated_async(relay_every, move |_, _| {
                let r = Arc::clone(&r);
                Box::pin(async move {
                    match r.tick().await {
                        Ok(report) if report.published + report.failed > 0 => {
                            tracing::debug!(?report, "relay tick");
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "relay tick failed; next tick retries")
                        }
                    }
                })
            })?)
            .await?;
        let (s, c, busy) = (store.clone(), Arc::clone(&clock), Arc::new(Mutex::new(())));
        scheduler
            .add(Job::new_repeated_async(EXPIRY_EVERY, move |_, _| {
                let (s, c) = (s.clone(), Arc::clone(&c));
                unless_busy(&busy, async move {
                    match expire_orders(&s, c.as_ref()).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(closed = n, "expired orders closed"),
                        Err(e) => {
                            tracing::warn!(error = %e, "order expiry failed; next run retries")
                        }
                    }
                })
            })?)
            .await?;
        let (s, c, busy) = (store, clock, Arc::new(Mutex::new(())));
        scheduler
            .add(Job::new_repeated_async(RETENTION_EVERY, move |_, _| {
                let (s, c) = (s.clone(), Arc::clone(&c));
                unless_busy(&busy, async move {
                    match purge(&s, c.as_ref(), keep_days).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(deleted = n, "retention purge"),
                        Err(e) => {
                            tracing::warn!(error = %e, "retention purge failed; next run retries")
                        }
                    }
                })
            })?)
            .await?;
        scheduler.start().await?;
        Ok(Self { scheduler, relay })
    }

    /// Stops the scheduler, then lets the relay finish (or release) its batch.
    pub async fn shutdown(mut self, drain: Duration) {
        if let Err(e) = self.scheduler.shutdown().await {
            tracing::warn!(error = %e, "scheduler shutdown");
        }
        self.relay.shutdown(drain).await;
    }
}
