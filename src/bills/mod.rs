//! The daily bill reconciliation (对账): every provider's bill of a day against the ledger's
//! payments and refunds of that provider-local day, the last safety net for a payment that
//! slipped past notification and query.
//!
//! A run of (bill date, channel) holds a lease (`bill_run`), so one instance does it. Each
//! account's bill is fetched and checked by its provider ([`BillSource`]), streamed into
//! `bill_line`, and compared with set-based SQL (`store.rs`); only the differences come
//! back. **The bill is evidence, never a payment**: a payment the bill has and the ledger
//! lacks is asked about at the provider, and only its signed answer goes through the ledger
//! (one `ORDER_PAID`; the notification that comes later is a duplicate). What the ledger has
//! and the bill does not, or has with another amount, is raised once as a `PAYMENT_ANOMALY`
//! (`BILL_MISMATCH`). A difference near midnight that the other side dates to the next day is
//! `pending`, and compared again by the runs of the next `bills.settle_days` days.

pub mod report;
pub mod settings;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use chrono::{NaiveDate, TimeZone};
use serde_json::json;

use crate::certificates::{Certificates, Learned};
use crate::channel::api::{Failure, ProviderApi, RefundAnswer, TradeAnswer};
use crate::channel::bill::{BillError, BillLine, BillSource, BillTotals, Fetched, LineKind};
use crate::metrics::Metrics;
use crate::notice::{ChannelId, Notice, Outcome};
use crate::outbox::{Message, Topic};
use crate::store::{Store, StoreError};
use crate::time::{Clock, Timestamp};
use report::{Item, ItemType, OurTotals, Report, Resolution, Side, Status};
use settings::BillSettings;
use store::{BillSide, MAX_ID, OursOnly, PendingElsewhere, Scope};

/// How close to a midnight a ledger record the bill lacks must be for it to be possibly
/// timing (the provider booked it the other side of midnight): a notification is delivered
/// within seconds, its retries within the hour.
pub const TIMING_WINDOW_SECS: i64 = 3600;

/// How long a run's lease lasts from its last renewal (a run that dies leaves it to expire).
const LEASE_SECS: i64 = 3600;

/// How often a run renews its lease while it lasts, whatever it is waiting for (a download,
/// a provider's answer, the database): one small update.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// How many days back the daily job tries an `unavailable` report again.
const RETRY_DAYS: i64 = 7;

/// The longest provider status a bill row may carry (`bill_line.status`).
const MAX_STATUS: usize = 32;

/// More differences than this in one account's day is not a day of this ledger (another
/// merchant's orders, a wrong date): the report is unavailable and nothing is acted upon.
pub const MAX_DIFFERENCES: usize = 10_000;

/// Bill rows per insert statement.
const LINE_BATCH: usize = 1000;

/// Why a run did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another run holds the lease of this (date, channel): of this instance or another.
    #[error("the {channel} bills of {date} are being reconciled now by another run")]
    Busy { date: String, channel: ChannelId },
    /// No account of the channel has API credentials.
    #[error("no {0} merchant or app has API credentials: there is no bill to fetch")]
    NoSource(ChannelId),
}

/// The lease of one run of (bill date, channel).
struct Lease<'a> {
    day: &'a str,
    channel: ChannelId,
    /// This run's own: the instance's owner and the run's number.
    owner: String,
    /// Another run took it over (it had run out): this run stops before its next step.
    lost: std::sync::atomic::AtomicBool,
}

impl Lease<'_> {
    fn busy(&self) -> RunError {
        RunError::Busy {
            date: self.day.to_owned(),
            channel: self.channel,
        }
    }
}

/// One account's bill, as far as it got.
enum Got {
    Read(BillTotals),
    NoBill(String),
    Unavailable(BillError),
}

/// Every provider's bills and what is needed to act on them.
pub struct Bills {
    sources: Vec<Arc<dyn BillSource>>,
    apis: Vec<Arc<dyn ProviderApi>>,
    certificates: Arc<Certificates>,
    store: Store,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    zone: chrono_tz::Tz,
    settle_days: i64,
    download_timeout: Duration,
    owner: String,
    /// Runs started by this instance: each run's lease is its own (`owner` and this).
    runs: std::sync::atomic::AtomicU64,
}

impl Bills {
    pub fn new(
        sources: Vec<Arc<dyn BillSource>>,
        apis: Vec<Arc<dyn ProviderApi>>,
        certificates: Arc<Certificates>,
        store: Store,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        settings: &BillSettings,
    ) -> Result<Self, crate::config::ConfigError> {
        // The lease's owner: two instances must never share one (in containers every process
        // is PID 1), so no token, no start.
        let token = crate::random::token(b"0123456789abcdef", 16).map_err(|_| {
            crate::config::value::invalid(
                "bills",
                "no random number generator for the run's lease owner",
            )
        })?;
        Ok(Self {
            sources,
            apis,
            certificates,
            store,
            metrics,
            clock,
            zone: settings.zone()?,
            settle_days: i64::from(settings.settle_days),
            download_timeout: Duration::from_secs(settings.download_timeout_secs),
            owner: format!("bills-{}-{token}", std::process::id()),
            runs: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Whether any account's bills can be fetched.
    pub fn fetches(&self) -> bool {
        !self.sources.is_empty()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The provider-local day before `now`: what the daily job reconciles.
    pub fn yesterday(&self, now: Timestamp) -> NaiveDate {
        yesterday_in(self.zone, now)
    }

    /// The daily job: every date of the week before `now`'s yesterday whose report of a
    /// channel is `unavailable` (a bill that was not ready, or could not be read) or missing
    /// although the job ran before it (a run that failed on the database), oldest first, then
    /// the day before `now` for every channel. The reports of this run.
    pub async fn daily(&self) -> Result<Vec<Report>, RunError> {
        let yesterday = self.yesterday(self.clock.now());
        let mut reports = Vec::new();
        // The older days first: a payment near a midnight whose bill was not ready at its
        // own run is compared with that bill before a later day's run can miss it.
        for back in (1..=RETRY_DAYS).rev() {
            let Some(date) = yesterday.checked_sub_signed(chrono::Duration::days(back)) else {
                break;
            };
            let day = date.format("%Y-%m-%d").to_string();
            let stored = self.store.bill_reports(&day, None).await?;
            for source in &self.sources {
                let channel = source.channel();
                let mine: Vec<&Report> = stored.iter().filter(|r| r.channel == channel).collect();
                let again = if mine.is_empty() {
                    self.store.reported_before(channel, &day).await?
                } else {
                    mine.iter().any(|r| r.status == Status::Unavailable)
                };
                if !again {
                    continue;
                }
                match self.reconcile(date, Some(channel)).await {
                    Ok(mut r) => reports.append(&mut r),
                    Err(RunError::Busy { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for source in &self.sources {
            // A run of the same day and channel going on now (the admin call, another
            // instance) does that channel's work: not this job's to do again.
            match self.reconcile(yesterday, Some(source.channel())).await {
                Ok(mut r) => reports.append(&mut r),
                Err(RunError::Busy { date, channel }) => {
                    tracing::info!(%date, %channel, "bill run going on elsewhere; the daily job leaves it")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(reports)
    }

    /// The cron expression of `bills.run_at` (seconds first, as tokio-cron-scheduler reads it).
    pub fn schedule(settings: &BillSettings) -> Result<String, crate::config::ConfigError> {
        use chrono::Timelike;
        let at = settings.run_time()?;
        Ok(format!("0 {} {} * * *", at.minute(), at.hour()))
    }

    pub fn zone(&self) -> chrono_tz::Tz {
        self.zone
    }

    /// `[start, end)` of `date` in `bills.timezone`.
    fn day(&self, date: NaiveDate) -> (Timestamp, Timestamp) {
        day_in(self.zone, date)
    }

    /// Reconciles `date` for `channel` (or every channel with credentials) now; the reports,
    /// stored. A channel whose run another instance holds stops it with [`RunError::Busy`]
    /// (the channels before it are done and stored).
    pub async fn reconcile(
        &self,
        date: NaiveDate,
        channel: Option<ChannelId>,
    ) -> Result<Vec<Report>, RunError> {
        let sources: Vec<&Arc<dyn BillSource>> = self
            .sources
            .iter()
            .filter(|s| channel.is_none_or(|c| s.channel() == c))
            .collect();
        if let (Some(c), true) = (channel, sources.is_empty()) {
            return Err(RunError::NoSource(c));
        }
        let mut reports = Vec::new();
        for source in sources {
            reports.append(&mut self.run(source.as_ref(), date).await?);
        }
        Ok(reports)
    }

    /// One channel's run of `date`, under its lease. The lease is this run's alone: a
    /// second run of the same date and channel, in this instance or another, is
    /// [`RunError::Busy`] while it lasts (each run empties the day's bill rows when it
    /// starts and ends, so two must never share them). It is renewed every
    /// [`RENEW_EVERY`] while the run goes on, however long one account's download or
    /// comparison takes; a run that finds it lost stops before its next step.
    async fn run(&self, source: &dyn BillSource, date: NaiveDate) -> Result<Vec<Report>, RunError> {
        let channel = source.channel();
        let day = date.format("%Y-%m-%d").to_string();
        let n = self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lease = Lease {
            day: &day,
            channel,
            owner: format!("{}-{n}", self.owner),
            lost: std::sync::atomic::AtomicBool::new(false),
        };
        self.renew(&lease).await?;
        let result = {
            let work = self.run_leased(source, date, &lease);
            tokio::pin!(work);
            let mut renewals = tokio::time::interval(RENEW_EVERY);
            renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            renewals.tick().await;
            loop {
                tokio::select! {
                    result = &mut work => break result,
                    _ = renewals.tick() => match self.renew(&lease).await {
                        Ok(()) | Err(RunError::Busy { .. }) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, date = %day, %channel, "bill run lease not renewed; tried again shortly")
                        }
                    },
                }
            }
        };
        match self
            .store
            .release_bill_run(&day, channel, &lease.owner)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(date = %day, %channel, "the bill run's lease had run out before the run ended")
            }
            Err(e) => {
                tracing::warn!(error = %e, date = %day, %channel, "bill run lease not released; it expires")
            }
        }
        result
    }

    /// Takes the run's lease, or renews it; [`RunError::Busy`] (and the run marked as having
    /// lost it) when another run holds it.
    async fn renew(&self, lease: &Lease<'_>) -> Result<(), RunError> {
        let now = self.clock.now();
        if !lease.lost.load(std::sync::atomic::Ordering::SeqCst)
            && self
                .store
                .claim_bill_run(
                    lease.day,
                    lease.channel,
                    &lease.owner,
                    now,
                    now.plus_seconds(LEASE_SECS),
                )
                .await?
        {
            return Ok(());
        }
        lease.lost.store(true, std::sync::atomic::Ordering::SeqCst);
        Err(lease.busy())
    }

    /// Before each step of a run: whether it still holds its lease (renewed now).
    async fn still_held(&self, lease: &Lease<'_>) -> Result<(), RunError> {
        self.renew(lease).await
    }

    async fn run_leased(
        &self,
        source: &dyn BillSource,
        date: NaiveDate,
        lease: &Lease<'_>,
    ) -> Result<Vec<Report>, RunError> {
        let (channel, day) = (source.channel(), lease.day);
        self.store.clear_bill_lines(day, channel).await?;
        let accounts = source.accounts();
        let mut got = Vec::new();
        for account in &accounts {
            self.still_held(lease).await?;
            let fetched_at = self.clock.now();
            let read = self.read(source, account, date, day).await?;
            if matches!(read, Got::Unavailable(_)) {
                // What was read before the bill failed a check must not stand for its rows
                // beside another account's.
                self.store
                    .clear_account_lines(day, channel, account)
                    .await?;
            }
            got.push((account, fetched_at, read));
        }
        let (start, end) = self.day(date);
        // Orders that name no account may have been paid through any of them: compared only
        // when every account's bill was read (else the rerun of the day compares them).
        let all_read = got
            .iter()
            .all(|(_, _, g)| !matches!(g, Got::Unavailable(_)));
        let mut reports = Vec::new();
        for (i, (account, fetched_at, got)) in got.into_iter().enumerate() {
            self.still_held(lease).await?;
            let covers = source.covers(account);
            let scope = Scope {
                date: day,
                channel,
                account,
                covers: &covers,
                // The channel's first account takes the orders that name none.
                unnamed: i == 0 && all_read,
                start,
                end,
            };
            let report = self.compare(&scope, fetched_at, got).await?;
            self.store.save_bill_report(&report).await?;
            self.counted(&report);
            reports.push(report);
        }
        self.still_held(lease).await?;
        self.settle(channel, date, day).await?;
        // Later items may have settled earlier ones: show the reports as stored.
        Ok(self
            .store
            .bill_reports(day, Some(channel))
            .await?
            .into_iter()
            .filter(|r| reports.iter().any(|n| n.account == r.account))
            .collect())
    }

    /// Fetches one account's bill and streams its rows into `bill_line`. A key the provider
    /// names that is not known makes the channel's keys be fetched, then the bill once more.
    async fn read(
        &self,
        source: &dyn BillSource,
        account: &str,
        date: NaiveDate,
        day: &str,
    ) -> Result<Got, StoreError> {
        let mut fetched = source
            .fetch(account, date, self.download_timeout, self.clock.now())
            .await;
        if let Err(BillError::Failed(Failure::UnknownKey(_))) = &fetched
            && self
                .certificates
                .unknown_serial(source.channel(), Some(account))
                .await
                == Learned::Asked
        {
            fetched = source
                .fetch(account, date, self.download_timeout, self.clock.now())
                .await;
        }
        let file = match fetched {
            Ok(Fetched::Bill(file)) => file,
            Ok(Fetched::NoBill(why)) => return Ok(Got::NoBill(why)),
            Err(e) => return Ok(Got::Unavailable(e)),
        };
        // Parsed on a blocking thread, in batches handed to this task to insert: memory
        // stays at a few batches whatever the bill's size.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<BillLine>>(4);
        let parse = tokio::task::spawn_blocking(move || {
            let mut batch = Vec::with_capacity(LINE_BATCH);
            let totals = file.read(&mut |line: BillLine| {
                for (what, id) in [
                    ("out_trade_no", line.out_trade_no.as_str()),
                    ("transaction_id", line.transaction_id.as_str()),
                    ("out_refund_no", line.out_refund_no.as_deref().unwrap_or("")),
                ] {
                    if id.len() > MAX_ID {
                        return Err(BillError::Format(format!(
                            "{what} {id:?} is longer than {MAX_ID} characters"
                        )));
                    }
                }
                if line.status.chars().count() > MAX_STATUS {
                    return Err(BillError::Format(format!(
                        "status {:?} is longer than {MAX_STATUS} characters",
                        line.status
                    )));
                }
                if line.kind == LineKind::Payment && line.out_trade_no.is_empty() {
                    return Err(BillError::Format(
                        "a payment row without out_trade_no".into(),
                    ));
                }
                batch.push(line);
                if batch.len() == LINE_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(LINE_BATCH));
                    tx.blocking_send(full)
                        .map_err(|_| BillError::Format("the comparison stopped reading".into()))?;
                }
                Ok(())
            })?;
            if !batch.is_empty() {
                tx.blocking_send(batch)
                    .map_err(|_| BillError::Format("the comparison stopped reading".into()))?;
            }
            Ok::<BillTotals, BillError>(totals)
        });
        let channel = source.channel();
        let mut refused = None;
        while let Some(batch) = rx.recv().await {
            if let Err(why) = self
                .store
                .insert_bill_lines(day, channel, account, &batch)
                .await?
            {
                refused = Some(BillError::Format(why));
                break;
            }
        }
        drop(rx);
        let parsed = parse.await.map_err(StoreError::Task)?;
        Ok(match (refused, parsed) {
            (Some(e), _) | (None, Err(e)) => Got::Unavailable(e),
            (None, Ok(totals)) => Got::Read(totals),
        })
    }

    /// One account's report: the differences between its bill rows and the ledger's day,
    /// all found before any is acted upon.
    async fn compare(
        &self,
        scope: &Scope<'_>,
        fetched_at: Timestamp,
        got: Got,
    ) -> Result<Report, StoreError> {
        let ours = self.store.ours_totals(scope).await?;
        let base = |status: Status, reason: Option<String>, provider: BillTotals| Report {
            date: scope.date.to_owned(),
            channel: scope.channel,
            account: scope.account.to_owned(),
            integrity: crate::channel::bill::Integrity::of(scope.channel),
            status,
            reason,
            fetched_at,
            provider,
            ours,
            items: Vec::new(),
        };
        let unavailable = |reason: &'static str, why: String| {
            tracing::warn!(
                date = scope.date,
                channel = %scope.channel,
                account = scope.account,
                reason,
                error = %why,
                "bill unavailable: nothing compared or acted upon; the next run tries again"
            );
            base(Status::Unavailable, Some(why), BillTotals::default())
        };
        let provider = match got {
            Got::Unavailable(e) => return Ok(unavailable(e.label(), e.to_string())),
            Got::NoBill(why) if ours == OurTotals::default() => {
                tracing::info!(date = scope.date, channel = %scope.channel, account = scope.account, %why, "no bill and nothing in the ledger: balanced");
                return Ok(base(Status::Balanced, None, BillTotals::default()));
            }
            Got::NoBill(why) => {
                return Ok(unavailable(
                    "no_bill",
                    format!(
                        "no bill ({why}) while the ledger has {} payments and {} refunds that day",
                        ours.count, ours.refund_count
                    ),
                ));
            }
            Got::Read(totals) => totals,
        };
        let mut found: Vec<(LineKind, Vec<BillSide>, Vec<OursOnly>)> = Vec::new();
        let mut count = 0;
        for kind in [LineKind::Payment, LineKind::Refund] {
            let bill = self
                .store
                .bill_differences(scope, kind, MAX_DIFFERENCES)
                .await?;
            let only = self.store.ours_only(scope, kind, MAX_DIFFERENCES).await?;
            count += bill.len() + only.len();
            found.push((kind, bill, only));
        }
        if count > MAX_DIFFERENCES {
            return Ok(unavailable(
                "too_many",
                format!(
                    "too many differences: more than {MAX_DIFFERENCES} (another merchant's orders, or a wrong day?)"
                ),
            ));
        }
        let mut items = Vec::new();
        for (kind, bill, only) in found {
            for diff in bill {
                items.extend(self.bill_side(scope, kind, diff).await?);
            }
            for only in only {
                items.extend(self.ours_side(scope, kind, only).await?);
            }
        }
        for item in items.iter().filter(|i| i.resolution == Resolution::Open) {
            self.raise(scope.date, scope.channel, scope.account, item)
                .await?;
        }
        let mut report = base(Report::status_of(&items), None, provider);
        report.items = items;
        Ok(report)
    }

    /// The dates `settle_days` (at least one) either side of `day`: where a timing
    /// difference's other half can be.
    fn neighbours(&self, day: &str) -> (String, String) {
        let span = chrono::Duration::days(self.settle_days.max(1));
        let Ok(date) = NaiveDate::parse_from_str(day, "%Y-%m-%d") else {
            return (day.to_owned(), day.to_owned());
        };
        let f = |d: Option<NaiveDate>| d.unwrap_or(date).format("%Y-%m-%d").to_string();
        (
            f(date.checked_sub_signed(span)),
            f(date.checked_add_signed(span)),
        )
    }

    /// A bill row the ledger lacks, or has differently.
    async fn bill_side(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        diff: BillSide,
    ) -> Result<Option<Item>, StoreError> {
        let (missing, mismatch, counterpart) = match kind {
            LineKind::Payment => (
                ItemType::MissingHere,
                ItemType::AmountMismatch,
                ItemType::MissingAtProvider,
            ),
            LineKind::Refund => (
                ItemType::RefundMissingHere,
                ItemType::RefundAmountMismatch,
                ItemType::RefundMissingAtProvider,
            ),
        };
        let mut item = Item {
            kind: missing,
            out_trade_no: diff.out_trade_no.clone(),
            out_refund_no: Some(diff.out_refund_no.clone()).filter(|r| !r.is_empty()),
            transaction_id: Some(diff.transaction_id.clone()).filter(|t| !t.is_empty()),
            provider: Some(Side {
                status: diff.status.clone(),
                amount_fen: diff.fen,
            }),
            ours: None,
            resolution: Resolution::Open,
        };
        let Some(recorded) = diff.ours.clone() else {
            item.resolution = self.recover(scope, kind, &diff).await?;
            return Ok(Some(item));
        };
        item.ours = Some(Side {
            status: recorded.status.clone(),
            amount_fen: recorded.fen,
        });
        if recorded.fen != diff.fen {
            item.kind = mismatch;
            return Ok(Some(item));
        }
        // Both books have it, dated a day apart: timing. The ledger's side, pending in the
        // report of its own day, is settled by this; else this waits for that day's run.
        let (from, to) = self.neighbours(scope.date);
        let elsewhere = self
            .store
            .items_elsewhere(
                scope.channel,
                &[counterpart],
                &diff.out_trade_no,
                &diff.out_refund_no,
                scope.date,
            )
            .await?;
        let mut explained = false;
        for e in &elsewhere {
            match e.item.resolution {
                Resolution::Pending if e.date >= from && e.date <= to => {
                    self.store.settle_item(scope.channel, e, None).await?;
                    explained = true;
                }
                // Raised by the run of the ledger's day, made before this bill's (a bill not
                // ready at its own run): this bill has it, alike. Settled, and said so.
                Resolution::Open
                    if e.item
                        .ours
                        .as_ref()
                        .is_some_and(|o| o.amount_fen == diff.fen) =>
                {
                    self.store
                        .settle_item(scope.channel, e, Some(Resolution::Settled))
                        .await?;
                    self.raise_settled(e, scope).await?;
                    explained = true;
                }
                // Settled by this bill before (a rerun of this day).
                Resolution::Settled => explained = true,
                _ => {}
            }
        }
        if explained || self.settle_days == 0 {
            return Ok(None);
        }
        item.resolution = Resolution::Pending;
        Ok(Some(item))
    }

    /// A ledger row of the day the bill lacks.
    async fn ours_side(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        only: OursOnly,
    ) -> Result<Option<Item>, StoreError> {
        let (kind_here, provider_had) = match kind {
            LineKind::Payment => (
                ItemType::MissingAtProvider,
                [ItemType::MissingHere, ItemType::AmountMismatch],
            ),
            LineKind::Refund => (
                ItemType::RefundMissingAtProvider,
                [ItemType::RefundMissingHere, ItemType::RefundAmountMismatch],
            ),
        };
        // Another day's bill had it (an item of that day's report says so, whatever became of
        // it): a payment recovered from that bill, a notification that came after its run, a
        // payment near midnight. Not missing at the provider.
        let elsewhere = self
            .store
            .items_elsewhere(
                scope.channel,
                &provider_had,
                &only.out_trade_no,
                &only.out_refund_no,
                scope.date,
            )
            .await?;
        if !elsewhere.is_empty() {
            for e in &elsewhere {
                let same = e
                    .item
                    .provider
                    .as_ref()
                    .is_some_and(|p| p.amount_fen == only.fen);
                match (e.item.kind, e.item.resolution) {
                    // The timing difference's other half: both gone.
                    (_, Resolution::Pending) => {
                        self.store.settle_item(scope.channel, e, None).await?
                    }
                    // What the bill had and the ledger lacked, the ledger has now, alike.
                    (ItemType::MissingHere | ItemType::RefundMissingHere, Resolution::Open)
                        if same =>
                    {
                        self.store
                            .settle_item(scope.channel, e, Some(Resolution::Recovered))
                            .await?
                    }
                    _ => {}
                }
            }
            return Ok(None);
        }
        // Settled before by another day's bill (see `bill_side`): a rerun of this day keeps
        // it so, and raises nothing.
        if let Some(before) = self
            .store
            .item_of(scope, kind_here, &only.out_trade_no, &only.out_refund_no)
            .await?
            && before.resolution == Resolution::Settled
        {
            return Ok(Some(before));
        }
        let near_midnight = only.at.unix_seconds() - scope.start.unix_seconds()
            < TIMING_WINDOW_SECS
            || scope.end.unix_seconds() - only.at.unix_seconds() <= TIMING_WINDOW_SECS;
        Ok(Some(Item {
            kind: kind_here,
            out_trade_no: only.out_trade_no,
            out_refund_no: Some(only.out_refund_no).filter(|r| !r.is_empty()),
            transaction_id: only.transaction_id,
            provider: None,
            ours: Some(Side {
                status: only.status,
                amount_fen: only.fen,
            }),
            resolution: if near_midnight && self.settle_days > 0 {
                Resolution::Pending
            } else {
                Resolution::Open
            },
        }))
    }

    /// The pending items of reports `settle_days` or more before `date`, whose neighbouring
    /// days (`settle_days` either side) have all been compared: what those runs did not
    /// match is reported now (the ledger's side `open` and raised; a payment both books have,
    /// a day apart, removed). A neighbour not compared yet, or unavailable, keeps them pending.
    async fn settle(
        &self,
        channel: ChannelId,
        date: NaiveDate,
        day: &str,
    ) -> Result<(), StoreError> {
        if self.settle_days == 0 {
            return Ok(());
        }
        let Some(until) = date.checked_sub_signed(chrono::Duration::days(self.settle_days)) else {
            return Ok(());
        };
        let until = until.format("%Y-%m-%d").to_string();
        for pending in self.store.pending_until(channel, &until).await? {
            if pending.date.as_str() >= day || !self.neighbours_compared(channel, &pending).await? {
                continue;
            }
            if pending.item.provider.is_some() && pending.item.ours.is_some() {
                self.store.settle_item(channel, &pending, None).await?;
            } else {
                self.store
                    .settle_item(channel, &pending, Some(Resolution::Open))
                    .await?;
                self.raise(&pending.date, channel, &pending.account, &pending.item)
                    .await?;
            }
        }
        Ok(())
    }

    /// Whether every day `settle_days` either side of a pending item's has a report of its
    /// account that was compared (not unavailable).
    async fn neighbours_compared(
        &self,
        channel: ChannelId,
        pending: &PendingElsewhere,
    ) -> Result<bool, StoreError> {
        let Ok(date) = NaiveDate::parse_from_str(&pending.date, "%Y-%m-%d") else {
            return Ok(false);
        };
        for k in (-self.settle_days..=self.settle_days).filter(|k| *k != 0) {
            let Some(other) = date.checked_add_signed(chrono::Duration::days(k)) else {
                return Ok(false);
            };
            let other = other.format("%Y-%m-%d").to_string();
            match self
                .store
                .report_status(&other, channel, &pending.account)
                .await?
            {
                Some(Status::Balanced | Status::Mismatched) => {}
                Some(Status::Unavailable) | None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The provider's bill has a payment (refund) the ledger lacks: asked about at the
    /// provider, and its signed answer applied through the ledger. An order unknown here is
    /// not asked about (another system's, under the same merchant): it stays open.
    async fn recover(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        diff: &BillSide,
    ) -> Result<Resolution, StoreError> {
        let Some(api) = self.apis.iter().find(|a| a.channel() == scope.channel) else {
            return Ok(Resolution::Open);
        };
        if self.store.order(&diff.out_trade_no).await?.is_none() {
            tracing::warn!(order_no = %diff.out_trade_no, channel = %scope.channel, date = scope.date, "the bill has a payment of an order unknown here");
            return Ok(Resolution::Open);
        }
        let now = self.clock.now();
        let notice: Option<Box<Notice>> = match kind {
            LineKind::Payment => match api.query(scope.account, &diff.out_trade_no, now).await {
                TradeAnswer::Paid(notice) => Some(notice),
                other => {
                    tracing::warn!(order_no = %diff.out_trade_no, channel = %scope.channel, answer = other.label(), "the bill has a payment the provider's query does not confirm");
                    None
                }
            },
            LineKind::Refund => match api
                .refund_query(scope.account, &diff.out_trade_no, &diff.out_refund_no, now)
                .await
            {
                RefundAnswer::Refunded(notice) => notice,
                other => {
                    tracing::warn!(order_no = %diff.out_trade_no, out_refund_no = %diff.out_refund_no, channel = %scope.channel, answer = other.label(), "the bill has a refund the provider's query does not confirm");
                    None
                }
            },
        };
        let Some(notice) = notice else {
            return Ok(Resolution::Open);
        };
        let outcome = match self.store.apply(&notice, self.clock.now()).await {
            Ok(outcome) => outcome,
            Err(StoreError::Undecided(why)) => {
                tracing::warn!(order_no = %diff.out_trade_no, %why, "recovered payment not decided in time; the next run sees");
                return Ok(Resolution::Open);
            }
            Err(e) => return Err(e),
        };
        Ok(match outcome {
            Outcome::Applied | Outcome::Duplicate => {
                if outcome == Outcome::Applied && kind == LineKind::Payment {
                    self.metrics.payment_recovered(scope.channel);
                }
                tracing::info!(
                    order_no = %diff.out_trade_no,
                    channel = %scope.channel,
                    date = scope.date,
                    outcome = outcome.as_str(),
                    "recovered from the bill and the provider's signed answer: its notification never came"
                );
                Resolution::Recovered
            }
            other => {
                tracing::warn!(order_no = %diff.out_trade_no, outcome = other.as_str(), "a payment in the bill the ledger did not take");
                Resolution::Open
            }
        })
    }

    /// Raises an open difference once as `PAYMENT_ANOMALY` (`BILL_MISMATCH`), when its type
    /// is raised at all.
    async fn raise(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
        item: &Item,
    ) -> Result<(), StoreError> {
        if !item.kind.raised() {
            return Ok(());
        }
        let message = Message {
            topic: Topic::PaymentAnomaly,
            biz_key: mismatch_key(item, channel, date),
            payload: json!({
                "order_no": item.out_trade_no,
                "channel": channel,
                "reason": crate::notice::AnomalyReason::BillMismatch,
                "bill_date": date,
                "account": account,
                "type": item.kind,
                "out_refund_no": item.out_refund_no,
                "transaction_id": item.transaction_id,
                "provider": item.provider,
                "ours": item.ours,
                "resolution": Resolution::Open,
            }),
        };
        if self.store.raise_once(&message, self.clock.now()).await? {
            self.metrics
                .anomalies
                .with_label_values(&[channel.as_str(), "BILL_MISMATCH"])
                .inc();
        }
        Ok(())
    }

    /// The event that follows an item's `BILL_MISMATCH` once a later run found it explained
    /// (`settled` by the bill of `by`): `PAYMENT_ANOMALY`, reason `BILL_MISMATCH_SETTLED`, its
    /// biz_key the first one's and `:settled`. The first event stands.
    async fn raise_settled(
        &self,
        settled: &PendingElsewhere,
        by: &Scope<'_>,
    ) -> Result<(), StoreError> {
        let item = &settled.item;
        if !item.kind.raised() {
            return Ok(());
        }
        let message = Message {
            topic: Topic::PaymentAnomaly,
            biz_key: format!("{}:settled", mismatch_key(item, by.channel, &settled.date)),
            payload: json!({
                "order_no": item.out_trade_no,
                "channel": by.channel,
                "reason": crate::notice::AnomalyReason::BillMismatchSettled,
                "bill_date": settled.date,
                "account": settled.account,
                "type": item.kind,
                "out_refund_no": item.out_refund_no,
                "transaction_id": item.transaction_id,
                "provider": item.provider,
                "ours": item.ours,
                "resolution": Resolution::Settled,
                "settled_by": {"bill_date": by.date, "account": by.account},
            }),
        };
        if self.store.raise_once(&message, self.clock.now()).await? {
            tracing::info!(order_no = %item.out_trade_no, channel = %by.channel, date = %settled.date, by = by.date, "a bill difference raised before is in another day's bill: settled");
        }
        Ok(())
    }

    fn counted(&self, report: &Report) {
        self.metrics
            .bill_run(report.channel, report.status.as_str());
        for item in &report.items {
            self.metrics.bill_item(report.channel, item.kind.as_str());
        }
    }
}

/// The biz_key of an item's `BILL_MISMATCH` event: its order, channel, bill date, type and
/// refund number (a `BILL_MISMATCH_SETTLED` event adds `:settled`).
fn mismatch_key(item: &Item, channel: ChannelId, date: &str) -> String {
    let refund = item
        .out_refund_no
        .as_deref()
        .map(|r| format!(":{r}"))
        .unwrap_or_default();
    format!(
        "{}:{channel}:bill:{date}:{}{refund}",
        item.out_trade_no,
        item.kind.as_str()
    )
}

/// The day before `now`'s date in `zone`.
pub fn yesterday_in(zone: chrono_tz::Tz, now: Timestamp) -> NaiveDate {
    let today = now.as_datetime().with_timezone(&zone).date_naive();
    today.pred_opt().unwrap_or(today)
}

/// `[start, end)` of `date` in `zone`: from its midnight to the next. Where a zone's clock
/// skips midnight, the day starts at the first hour that exists.
pub fn day_in(zone: chrono_tz::Tz, date: NaiveDate) -> (Timestamp, Timestamp) {
    let start = |d: NaiveDate| {
        let at = (0..3)
            .find_map(|hour| {
                let local = d.and_hms_opt(hour, 0, 0)?;
                zone.from_local_datetime(&local).earliest()
            })
            .map_or_else(
                || d.and_time(chrono::NaiveTime::MIN).and_utc(),
                |t| t.with_timezone(&chrono::Utc),
            );
        Timestamp::new(at)
    };
    let next = date.succ_opt().unwrap_or(date);
    (start(date), start(next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bills::report::exit_code;

    fn utc(text: &str) -> Timestamp {
        Timestamp::new(
            chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&chrono::Utc))
                .unwrap_or_default(),
        )
    }

    #[test]
    fn a_bill_date_is_a_day_in_the_providers_zone() {
        let date = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap_or_default();
        let (start, end) = day_in(chrono_tz::Asia::Shanghai, date);
        assert_eq!(start, utc("2026-11-29T16:00:00Z"));
        assert_eq!(end, utc("2026-11-30T16:00:00Z"));
        // 00:30 on 12-01 in Beijing is still 11-30 in UTC: yesterday is 11-30 all the same.
        assert_eq!(
            yesterday_in(chrono_tz::Asia::Shanghai, utc("2026-11-30T16:30:00Z")),
            date
        );
        assert_eq!(
            yesterday_in(chrono_tz::UTC, utc("2026-11-30T16:30:00Z")),
            NaiveDate::from_ymd_opt(2026, 11, 29).unwrap_or_default()
        );
        // A day of 23 hours where the clock moves (Europe/Berlin, 2026-03-29).
        let spring = NaiveDate::from_ymd_opt(2026, 3, 29).unwrap_or_default();
        let (s, e) = day_in(chrono_tz::Europe::Berlin, spring);
        assert_eq!(e.unix_seconds() - s.unix_seconds(), 23 * 3600);
    }

    fn report(status: Status) -> Report {
        Report {
            date: "2026-11-30".into(),
            channel: ChannelId::Wechat,
            account: "1900000001".into(),
            integrity: crate::channel::bill::Integrity::SignedHash,
            status,
            reason: None,
            fetched_at: Timestamp::new(chrono::Utc::now()),
            provider: BillTotals::default(),
            ours: OurTotals::default(),
            items: Vec::new(),
        }
    }

    #[test]
    fn the_exit_code_is_the_worst_report() {
        use Status::*;
        assert_eq!(exit_code(&[report(Balanced), report(Balanced)]), 0);
        assert_eq!(exit_code(&[report(Balanced), report(Mismatched)]), 1);
        assert_eq!(exit_code(&[report(Mismatched), report(Unavailable)]), 2);
        assert_eq!(exit_code(&[report(Unavailable), report(Balanced)]), 2);
    }

    #[test]
    fn only_an_open_item_makes_a_report_mismatched() {
        let item = |resolution| Item {
            kind: ItemType::MissingHere,
            out_trade_no: "A".into(),
            out_refund_no: None,
            transaction_id: None,
            provider: None,
            ours: None,
            resolution,
        };
        assert_eq!(Report::status_of(&[]), Status::Balanced);
        assert_eq!(
            Report::status_of(&[item(Resolution::Pending), item(Resolution::Recovered)]),
            Status::Balanced
        );
        assert_eq!(
            Report::status_of(&[item(Resolution::Pending), item(Resolution::Open)]),
            Status::Mismatched
        );
    }

    #[test]
    fn raised_types_are_what_the_ledger_counts_that_the_provider_does_not() {
        let raised: Vec<&str> = ItemType::ALL
            .into_iter()
            .filter(|t| t.raised())
            .map(ItemType::as_str)
            .collect();
        assert_eq!(
            raised,
            [
                "MISSING_AT_PROVIDER",
                "AMOUNT_MISMATCH",
                "REFUND_MISSING_AT_PROVIDER",
                "REFUND_AMOUNT_MISMATCH"
            ]
        );
    }

    #[test]
    fn run_at_is_a_daily_cron_expression() {
        let mut settings = BillSettings::default();
        assert_eq!(
            Bills::schedule(&settings).ok().as_deref(),
            Some("0 30 10 * * *")
        );
        settings.run_at = "07:05".into();
        assert_eq!(
            Bills::schedule(&settings).ok().as_deref(),
            Some("0 5 7 * * *")
        );
        for bad in ["7", "25:00", "10:60", "10.30", ""] {
            settings.run_at = bad.into();
            assert!(Bills::schedule(&settings).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_mistakes_name_the_key() {
        use crate::config::value::Validate;
        let names = |s: BillSettings, key: &str| {
            s.validate()
                .err()
                .is_some_and(|e| e.to_string().contains(key))
        };
        assert!(BillSettings::default().validate().is_ok());
        let zone = BillSettings {
            timezone: "Mars/Olympus".into(),
            ..BillSettings::default()
        };
        assert!(names(zone, "bills.timezone"));
        let settle = BillSettings {
            settle_days: 8,
            ..BillSettings::default()
        };
        assert!(names(settle, "bills.settle_days"));
        let timeout = BillSettings {
            download_timeout_secs: 0,
            ..BillSettings::default()
        };
        assert!(names(timeout, "bills.download_timeout_secs"));
    }
}
