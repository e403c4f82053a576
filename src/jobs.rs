//! The background jobs of `paynotify serve`: the outbox relay on a tokio interval of its
//! own, and order expiry, reconcile (asking the providers), retention and the relay watchdog
//! on tokio-cron-scheduler. Each
//! scheduled job skips a run while its previous run is still going (the scheduler itself
//! would start it again). The relay is not on the scheduler: its repeated jobs keep their
//! interval in whole seconds, so 200 ms would become 0 s and the job would never run again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_cron_scheduler::{Job, JobScheduler, JobSchedulerError};

use crate::archive::Archiver;
use crate::bills::Bills;
use crate::certificates::Certificates;
use crate::reconcile::Reconciler;
use crate::refunds::Refunds;
use crate::relay::Relay;
use crate::store::Store;
use crate::store::partitions::{self, Maintained};
use crate::time::Clock;
use crate::transfers::Transfers;

/// How many expired orders one expiry statement reads; each is closed in its own short
/// transaction.
const EXPIRY_BATCH: i64 = 500;
const EXPIRY_EVERY: Duration = Duration::from_secs(10);
/// Rows per retention statement, and the pause between statements so the hot path never
/// waits on the purge.
const RETENTION_BATCH: i64 = 1000;
const RETENTION_PAUSE: Duration = Duration::from_millis(50);
/// How often the reconcile job looks for unpaid orders to ask about (each order is asked at
/// most once per `reconcile.every_secs`).
const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// The order-expiry job: each `WAIT_PAY` order past `expire_at` is closed at its providers
/// first (see [`Reconciler::close`]), then here by compare-and-set with its `ORDER_CLOSED`
/// message. Returns how many it closed.
pub async fn expire_orders(
    reconciler: &Reconciler,
    clock: &dyn Clock,
) -> Result<usize, crate::store::StoreError> {
    reconciler.expire_due(clock.now(), EXPIRY_BATCH).await
}

/// What one retention run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Purged {
    /// Rows deleted by statement: idempotency keys, SQLite's sent messages and receipts, and
    /// on the partitioned backends what a kept or the future partition still held past its
    /// window.
    pub rows: usize,
    /// The outbox's partitions created, dropped, compacted and kept.
    pub outbox: Maintained,
    /// The receipts' partitions.
    pub receipts: Maintained,
}

impl Purged {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The retention job. Where the database has partitions (docs/design.md, "Partitions"): the
/// day partitions through [`AHEAD_DAYS`](crate::store::partitions::AHEAD_DAYS) ahead are
/// created, and those wholly older than the window dropped — the outbox's rebuilt instead
/// with only their pending and dead messages when they hold some. Then, on every backend,
/// sent messages and idempotency keys older than `keep_days` and receipts older than
/// `receipts_keep_days` are deleted in batches with pauses (on the partitioned backends
/// only leftovers are found). Pending and dead messages stay.
pub async fn purge(
    store: &Store,
    clock: &dyn Clock,
    keep_days: u32,
    receipts_keep_days: u32,
) -> Result<Purged, crate::store::StoreError> {
    let now = clock.now();
    let receipts_cutoff = now.plus_seconds(-i64::from(receipts_keep_days.max(1)) * 86_400);
    let cutoff = now.plus_seconds(-i64::from(keep_days.max(2)) * 86_400);
    // A table whose partitions could not be kept (a lock waited for too long, say) is tried
    // again next run; the rest of the run goes on.
    let maintain = async |table: partitions::Partitioned, cutoff| {
        store
            .maintain_partitions(table, now, Some(cutoff))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(table = table.table, error = %e, "partitions not kept; next run retries");
                Maintained::default()
            })
    };
    let mut done = Purged {
        outbox: maintain(partitions::OUTBOX, cutoff).await,
        receipts: maintain(partitions::RECEIPTS, receipts_cutoff).await,
        rows: 0,
    };
    loop {
        let deleted = store
            .purge_receipts_batch(receipts_cutoff, RETENTION_BATCH)
            .await?;
        done.rows += deleted;
        if (deleted as i64) < RETENTION_BATCH {
            break;
        }
        tokio::time::sleep(RETENTION_PAUSE).await;
    }
    loop {
        let deleted = store.purge_batch(cutoff, RETENTION_BATCH).await?;
        let most = deleted.iter().map(|(_, n)| *n).max().unwrap_or(0);
        done.rows += deleted.iter().map(|(_, n)| *n).sum::<usize>();
        if (most as i64) < RETENTION_BATCH {
            return Ok(done);
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

/// The certificate refresh job: every downloading merchant's platform certificates fetched
/// again (each failure is logged and counted where it happens), then the expiry gauges and
/// warnings brought up to date.
pub async fn refresh_certificates(certificates: &Arc<Certificates>) {
    let results = certificates.refresh_all().await;
    let failed = results.iter().filter(|(_, _, r)| r.is_err()).count();
    if failed > 0 {
        tracing::warn!(
            failed,
            merchants = results.len(),
            "certificate refresh: some merchants not refreshed; the next run retries"
        );
    }
}

/// The refund job: refunds without an answer sent again, refunds not final queried.
pub async fn drive_refunds(refunds: &Refunds) {
    if !refunds.sends() {
        return;
    }
    match refunds.drive_due().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(refunds = n, "refunds followed up"),
        Err(e) => tracing::warn!(error = %e, "refund job failed; next run retries"),
    }
}

/// The transfer job: transfers without an answer sent again, transfers not final queried.
pub async fn drive_transfers(transfers: &Transfers) {
    if !transfers.follows() {
        return;
    }
    match transfers.drive_due().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(transfers = n, "transfers followed up"),
        Err(e) => tracing::warn!(error = %e, "transfer job failed; next run retries"),
    }
}

/// The daily bill job: yesterday's bills of every channel, and the week's unavailable ones
/// again; each report was logged where it was made.
pub async fn reconcile_bills(bills: &Bills) {
    match bills.daily().await {
        Ok(reports) => {
            let mut counts = std::collections::BTreeMap::new();
            for r in &reports {
                *counts.entry(r.status.as_str()).or_insert(0) += 1;
            }
            tracing::info!(?counts, "daily bill reconciliation");
        }
        Err(e) => {
            tracing::warn!(error = %e, "daily bill reconciliation failed; the next run retries")
        }
    }
}

/// How often the watchdog looks at the relay's last successful tick.
const WATCHDOG_EVERY: Duration = Duration::from_secs(10);

/// The jobs `Jobs::start` runs and how often, for the start-up log line.
pub fn schedule(relay_every: Duration, retention_every: Duration) -> String {
    format!(
        "relay every {} ms, order expiry every {} s, reconcile every {} s, retention every {} s, relay watchdog every {} s",
        relay_every.as_millis(),
        EXPIRY_EVERY.as_secs(),
        RECONCILE_EVERY.as_secs(),
        retention_every.as_secs(),
        WATCHDOG_EVERY.as_secs()
    )
}

/// How long without a successful relay tick counts as a stall: five intervals, at least 30 s.
pub fn relay_stall_after(relay_every: Duration) -> Duration {
    (relay_every * 5).max(Duration::from_secs(30))
}

/// How long the retention job keeps what it purges (`retention.keep_days`,
/// `receipts.keep_days`), and the orders' archive (`retention.orders_keep_days`,
/// `retention.archive_dir`).
#[derive(Debug, Clone)]
pub struct Retention {
    /// How often the job runs (`retention.every_secs`).
    pub every: Duration,
    pub keep_days: u32,
    pub receipts_keep_days: u32,
    pub archive: Archiver,
}

/// What the scheduled jobs other than the relay and retention work on.
pub struct Work {
    /// Reconcile and order expiry.
    pub reconciler: Arc<Reconciler>,
    /// The platform-certificate refresh.
    pub certificates: Arc<Certificates>,
    /// The daily bill job and its cron expression, when `bills.enabled`.
    pub bills: Option<(Arc<Bills>, String)>,
    /// Refunds started through paynotify: sent again, queried (`[refunds]`).
    pub refunds: Arc<Refunds>,
    /// Transfers started through paynotify: sent again, queried (`[transfers]`).
    pub transfers: Arc<Transfers>,
    /// The stored accounts, reloaded every `merchants.reload_secs`.
    pub merchants: Arc<crate::merchants::live::Merchants>,
}

/// The running jobs: the relay loop on its own tokio interval (any period, to the
/// millisecond), and the coarse jobs (expiry, retention, relay watchdog) on the scheduler,
/// whose repeated jobs only keep whole seconds.
pub struct Jobs {
    scheduler: JobScheduler,
    relay: Arc<Relay>,
    relay_loop: tokio::task::JoinHandle<()>,
    stop_relay_loop: tokio::sync::watch::Sender<bool>,
}

/// Ticks the relay every `every` until `stop` changes (or its sender is gone). A tick that
/// is still running when the next one is due delays it; it never overlaps.
async fn relay_loop(
    relay: Arc<Relay>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = interval.tick() => {}
        }
        // Its own task, so a panic in one tick is logged and the loop goes on.
        let r = Arc::clone(&relay);
        match tokio::spawn(async move { r.tick().await }).await {
            Ok(Ok(report)) if report.published + report.failed > 0 => {
                tracing::debug!(?report, "relay tick");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "relay tick failed; next tick retries"),
            Err(e) => tracing::error!(error = %e, "relay tick panicked; next tick retries"),
        }
    }
}

/// When a scheduled job runs.
enum Schedule {
    /// Every so often, in whole seconds (the scheduler's repeated jobs).
    Every(Duration),
    /// At the times of a cron expression, in a time zone.
    Cron(String, chrono_tz::Tz),
}

/// Whether a run may start while the previous one is still going.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overlap {
    /// Skip the run (see [`unless_busy`]): every job that does work.
    Skip,
    /// Start it: the watchdog, which only reads a clock and a number.
    Allow,
}

/// One scheduled job: its name, when it runs, and what one run does.
struct Entry {
    name: &'static str,
    schedule: Schedule,
    overlap: Overlap,
    /// Also run once at start, outside the schedule.
    at_start: bool,
    run: Box<dyn Fn() -> JobFuture + Send + Sync>,
}

impl Entry {
    fn new(
        name: &'static str,
        schedule: Schedule,
        run: impl Fn() -> JobFuture + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            schedule,
            overlap: Overlap::Skip,
            at_start: false,
            run: Box::new(run),
        }
    }

    /// The scheduler's job: each run skipped while the previous one still goes, unless the
    /// entry allows overlap.
    fn job(self) -> Result<Job, JobSchedulerError> {
        let (run, overlap, busy) = (self.run, self.overlap, Arc::new(Mutex::new(())));
        let each = move |_, _| match overlap {
            Overlap::Skip => unless_busy(&busy, run()),
            Overlap::Allow => run(),
        };
        match self.schedule {
            Schedule::Every(every) => Job::new_repeated_async(every, each),
            Schedule::Cron(cron, zone) => Job::new_async_tz(cron.as_str(), zone, each),
        }
    }
}

/// The scheduled jobs, in the order they are registered: order expiry, reconcile (when it
/// asks providers), the certificate refresh (when a merchant downloads), the refund job
/// (when refunds are sent), the transfer job (when an account can be asked), the daily bills (when enabled), retention and the relay
/// watchdog.
fn entries(
    store: Store,
    clock: Arc<dyn Clock>,
    work: Work,
    relay: &Arc<Relay>,
    relay_every: Duration,
    retention: Retention,
) -> Vec<Entry> {
    let Work {
        reconciler,
        certificates,
        bills,
        refunds,
        transfers,
        merchants,
    } = work;
    let mut entries = Vec::new();
    let every = merchants.reload_every();
    entries.push(Entry::new(
        "account reload",
        Schedule::Every(every),
        move || {
            let merchants = Arc::clone(&merchants);
            Box::pin(async move {
                match merchants.reload().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(accounts = n, "stored accounts reloaded"),
                    Err(e) => tracing::warn!(error = %e, "account reload failed; next run retries"),
                }
            })
        },
    ));
    let (r, c) = (Arc::clone(&reconciler), Arc::clone(&clock));
    entries.push(Entry::new(
        "order expiry",
        Schedule::Every(EXPIRY_EVERY),
        move || {
            let (r, c) = (Arc::clone(&r), Arc::clone(&c));
            Box::pin(async move {
                match expire_orders(&r, c.as_ref()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(closed = n, "expired orders closed"),
                    Err(e) => tracing::warn!(error = %e, "order expiry failed; next run retries"),
                }
            })
        },
    ));
    // Always: accounts with credentials may be added while the service runs; a run with
    // none asks nothing.
    let (r, c) = (reconciler, Arc::clone(&clock));
    entries.push(Entry::new(
        "reconcile",
        Schedule::Every(RECONCILE_EVERY),
        move || {
            let (r, c) = (Arc::clone(&r), Arc::clone(&c));
            Box::pin(async move {
                match r.reconcile_due(c.now()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(recovered = n, "payments recovered by query"),
                    Err(e) => tracing::warn!(error = %e, "reconcile failed; next run retries"),
                }
            })
        },
    ));
    if certificates.downloads() {
        // Once now (a merchant that never downloaded has only its configured keys), then
        // every certificates.refresh_secs.
        let every = certificates.refresh_every();
        entries.push(Entry {
            at_start: true,
            ..Entry::new("certificate refresh", Schedule::Every(every), move || {
                let certificates = Arc::clone(&certificates);
                Box::pin(async move { refresh_certificates(&certificates).await })
            })
        });
    }
    let every = refunds.scan_every();
    entries.push(Entry::new("refunds", Schedule::Every(every), move || {
        let refunds = Arc::clone(&refunds);
        Box::pin(async move { drive_refunds(&refunds).await })
    }));
    // Whether or not transfers.enabled: a transfer started before must still finish.
    let every = transfers.scan_every();
    entries.push(Entry::new("transfers", Schedule::Every(every), move || {
        let transfers = Arc::clone(&transfers);
        Box::pin(async move { drive_transfers(&transfers).await })
    }));
    if let Some((bills, cron)) = bills {
        // At bills.run_at in bills.timezone; the lease of each (date, channel) makes one
        // instance do it.
        let zone = bills.zone();
        entries.push(Entry::new(
            "daily bills",
            Schedule::Cron(cron, zone),
            move || {
                let bills = Arc::clone(&bills);
                Box::pin(async move { reconcile_bills(&bills).await })
            },
        ));
    }
    let Retention {
        every: retention_every,
        keep_days,
        receipts_keep_days,
        archive,
    } = retention;
    let (s, c, archive) = (store, clock, Arc::new(archive));
    entries.push(Entry::new(
        "retention",
        Schedule::Every(retention_every),
        move || {
            let (s, c, a) = (s.clone(), Arc::clone(&c), Arc::clone(&archive));
            Box::pin(async move { retain(&s, c.as_ref(), &a, keep_days, receipts_keep_days).await })
        },
    ));
    let (watched, stall_after) = (Arc::clone(relay), relay_stall_after(relay_every));
    entries.push(Entry {
        overlap: Overlap::Allow,
        ..Entry::new(
            "relay watchdog",
            Schedule::Every(WATCHDOG_EVERY),
            move || {
                let watched = Arc::clone(&watched);
                Box::pin(async move { watch_relay(&watched, stall_after) })
            },
        )
    });
    entries
}

/// One retention run: the purge, then the orders' archive; each logged.
async fn retain(s: &Store, c: &dyn Clock, a: &Archiver, keep_days: u32, receipts_keep_days: u32) {
    let started = std::time::Instant::now();
    match purge(s, c, keep_days, receipts_keep_days).await {
        Ok(done) if done.is_empty() => {}
        Ok(done) => tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            deleted = done.rows,
            partitions_created = done.outbox.created.len() + done.receipts.created.len(),
            partitions_dropped = ?[&done.outbox.dropped, &done.receipts.dropped],
            partitions_compacted = ?done.outbox.compacted,
            partitions_kept = ?done.outbox.kept,
            "retention purge"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "retention purge failed; next run retries")
        }
    }
    let started = std::time::Instant::now();
    match a.run(s, c).await {
        Ok(done) if done == crate::archive::Archived::default() => {}
        Ok(done) => tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            orders = done.orders,
            anomalies_of_orders_not_here = done.anomalies,
            deleted = done.rows,
            files = ?done.files,
            bill_items_deleted = done.bill_items,
            bill_lines_deleted = done.bill_lines,
            "orders archived"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "order archive failed; nothing of the batch was removed; next run retries")
        }
    }
}

/// The relay watchdog: warns while the relay's last successful tick is `stall_after` old.
fn watch_relay(relay: &Relay, stall_after: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = u64::try_from(relay.last_success()).unwrap_or(0);
    let silent = now.saturating_sub(last);
    if silent >= stall_after.as_secs() {
        tracing::warn!(
            seconds_since_last_success = silent,
            "relay stalled: no successful tick; events are not being delivered"
        );
    }
}

impl Jobs {
    pub async fn start(
        store: Store,
        clock: Arc<dyn Clock>,
        work: Work,
        relay: Arc<Relay>,
        relay_every: Duration,
        retention: Retention,
    ) -> Result<Self, JobSchedulerError> {
        let scheduler = JobScheduler::new().await?;
        for entry in entries(store, clock, work, &relay, relay_every, retention) {
            if entry.at_start {
                tokio::spawn((entry.run)());
            }
            let name = entry.name;
            let job = entry.job().inspect_err(|e| {
                tracing::error!(job = name, error = %e, "job not scheduled");
            })?;
            scheduler.add(job).await?;
        }
        scheduler.start().await?;
        let (stop_relay_loop, stop) = tokio::sync::watch::channel(false);
        let relay_loop = tokio::spawn(relay_loop(Arc::clone(&relay), relay_every, stop));
        Ok(Self {
            scheduler,
            relay,
            relay_loop,
            stop_relay_loop,
        })
    }

    /// Stops the relay loop and the scheduler, then lets the relay finish (or release) its
    /// batch: at most about `drain` in all.
    pub async fn shutdown(mut self, drain: Duration) {
        let _ = self.stop_relay_loop.send(true);
        if let Err(e) = self.scheduler.shutdown().await {
            tracing::warn!(error = %e, "scheduler shutdown");
        }
        self.relay.shutdown(drain).await;
        // The loop ends once its tick in flight has ended; past the drain, stop waiting.
        if tokio::time::timeout(Duration::from_millis(500), &mut self.relay_loop)
            .await
            .is_err()
        {
            self.relay_loop.abort();
        }
    }
}
