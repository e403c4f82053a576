//! Comparing one account's bill rows with the ledger's payments and refunds of the day:
//! each difference recovered, kept pending as possible timing, settled by another day's
//! bill, or raised.

use chrono::NaiveDate;

use super::Bills;
use super::read::Got;
use super::report::{Item, ItemType, OurTotals, Report, Resolution, Side, Status};
use super::store::{BillSide, OursOnly, PendingElsewhere, Scope};
use crate::channel::api::{CombineAnswer, RefundAnswer, TradeAnswer};
use crate::channel::bill::{BillTotals, LineKind};
use crate::notice::{ChannelId, Notice, Outcome};
use crate::outbox::Message;
use crate::store::StoreError;
use crate::time::Timestamp;

/// How close to a midnight a ledger record the bill lacks must be for it to be possibly
/// timing (the provider booked it the other side of midnight): a notification is delivered
/// within seconds, its retries within the hour.
pub const TIMING_WINDOW_SECS: i64 = 3600;

/// More differences than this in one account's day is not a day of this ledger (another
/// merchant's orders, a wrong date): the report is unavailable and nothing is acted upon.
pub const MAX_DIFFERENCES: usize = 10_000;

impl Bills {
    /// One account's report: the differences between its bill rows and the ledger's day,
    /// all found before any is acted upon.
    pub(super) async fn compare(
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
    pub(super) async fn settle(
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
        let Some(order) = self.store.order(&diff.out_trade_no).await? else {
            tracing::warn!(order_no = %diff.out_trade_no, channel = %scope.channel, date = scope.date, "the bill has a payment of an order unknown here");
            return Ok(Resolution::Open);
        };
        let now = self.clock.now();
        // A sub-order of a WeChat combination is known to WeChat only through its
        // combination: the combine query, signed by the combination's account, and its paid
        // answer applied whole.
        let combination = match (&order.combine_out_trade_no, kind) {
            (Some(no), LineKind::Payment) if scope.channel == ChannelId::Wechat => {
                self.store.combination(no).await?
            }
            _ => None,
        };
        let notice: Option<Box<Notice>> = match (kind, &combination) {
            (LineKind::Payment, Some(c)) => match api
                .combine_query(&c.row.account, &c.row.combine_out_trade_no, now)
                .await
            {
                CombineAnswer::Found(notice) => Some(notice),
                other => {
                    tracing::warn!(order_no = %diff.out_trade_no, combine_out_trade_no = %c.row.combine_out_trade_no, answer = other.label(), "the bill has a payment of a sub-order the combine query does not confirm");
                    None
                }
            },
            (LineKind::Payment, None) => {
                match api.query(scope.account, &diff.out_trade_no, now).await {
                    TradeAnswer::Paid(notice) => Some(notice),
                    other => {
                        tracing::warn!(order_no = %diff.out_trade_no, channel = %scope.channel, answer = other.label(), "the bill has a payment the provider's query does not confirm");
                        None
                    }
                }
            }
            (LineKind::Refund, _) => match api
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
        let message = Message::bill_mismatch(date, channel, account, item);
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
        let message = Message::bill_mismatch_settled(
            &settled.date,
            by.channel,
            &settled.account,
            item,
            by.date,
            by.account,
        );
        if self.store.raise_once(&message, self.clock.now()).await? {
            tracing::info!(order_no = %item.out_trade_no, channel = %by.channel, date = %settled.date, by = by.date, "a bill difference raised before is in another day's bill: settled");
        }
        Ok(())
    }
}
