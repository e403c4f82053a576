//! A run of (bill date, channel): the daily job, its schedule, and the lease that makes one
//! run at a time of a day and channel reconcile its bills.

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;

use super::Bills;
use super::read::Got;
use super::report::{Report, Status};
use super::settings::BillSettings;
use super::store::Scope;
use crate::channel::bill::BillSource;
use crate::notice::ChannelId;
use crate::store::StoreError;

/// How long a run's lease lasts from its last renewal (a run that dies leaves it to expire).
const LEASE_SECS: i64 = 3600;

/// How often a run renews its lease while it lasts, whatever it is waiting for (a download,
/// a provider's answer, the database): one small update.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// How many days back the daily job tries an `unavailable` report again.
const RETRY_DAYS: i64 = 7;

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

impl Bills {
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
            for source in self.sources.iter().filter(|s| !s.accounts().is_empty()) {
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
        for source in self.sources.iter().filter(|s| !s.accounts().is_empty()) {
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
    pub fn schedule(settings: &BillSettings) -> String {
        use chrono::Timelike;
        let at = settings.run_at;
        format!("0 {} {} * * *", at.minute(), at.hour())
    }

    /// Reconciles `date` for `channel` (or every channel with credentials) now; the reports,
    /// stored. A channel whose run another instance holds stops it with [`RunError::Busy`]
    /// (the channels before it are done and stored).
    pub async fn reconcile(
        &self,
        date: NaiveDate,
        channel: Option<ChannelId>,
    ) -> Result<Vec<Report>, RunError> {
        // A channel none of whose accounts has API credentials now has no bill to fetch.
        let sources: Vec<&Arc<dyn BillSource>> = self
            .sources
            .iter()
            .filter(|s| channel.is_none_or(|c| s.channel() == c))
            .filter(|s| !s.accounts().is_empty())
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

    fn counted(&self, report: &Report) {
        self.metrics
            .bill_run(report.channel, report.status.as_str());
        for item in &report.items {
            self.metrics.bill_item(report.channel, item.kind.as_str());
        }
    }
}
