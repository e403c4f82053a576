//! Asking the providers instead of only listening: an unpaid order whose notification has
//! not come is queried, and an order is closed at every provider before it is closed here.
//!
//! Both providers say a notification can be lost and a buyer can pay a trade the merchant
//! forgot to close. A paid answer is a [`Notice`] built from the provider's signed answer and
//! applied through the ledger like the notification (same key, same digest), so the
//! notification that arrives later is a plain duplicate. Unsigned or unverifiable answers are
//! never evidence: they count as "could not ask".

use std::sync::Arc;

use serde::Serialize;

mod combined;
pub mod failover;
mod order;
pub mod store;

pub use order::{ReconcileOrderError, Reconciled};

use crate::channel::api::{CloseAnswer, Failure, ProviderApi, TradeAnswer};
use crate::config::ReconcileSettings;
use crate::metrics::{ExpiryResult, Metrics, ProviderCall};
use crate::notice::{ChannelId, Notice, Outcome};
use crate::store::ledger::CloseResult;
use crate::store::{Store, StoreError};
use crate::time::{Clock, Timestamp};
use store::OrderAtProvider;

/// `Said::ledger` of a paid answer whose payment was handed to a group that did not answer in
/// time: it may still commit.
pub const UNDECIDED: &str = "undecided";

/// The longest wait between two close attempts of an order whose provider is unreachable.
const MAX_CLOSE_BACKOFF_SECS: i64 = 600;

/// What one provider account said about one order, for logs and the admin endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Said {
    #[schema(value_type = String)]
    pub channel: ChannelId,
    /// WeChat `mchid` or Alipay `app_id`.
    pub account: String,
    /// `query` or `close`.
    pub call: &'static str,
    /// `paid`, `unpaid`, `closed`, `not_found`, `not_closable`, `unreachable`,
    /// `bad_signature`, `unexpected`.
    pub answer: &'static str,
    /// The provider's status, or why there was no usable answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// What the ledger did with a paid answer (`applied`, `duplicate`, `anomaly`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<&'static str>,
}

/// What closing an order with its providers came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a short-lived answer, matched at once by its caller"
)]
pub enum Closing {
    /// Every provider closed the trade (or never had it), or there was none to ask, and the
    /// order was closed here (or was already closed, paid, gone: the [`CloseResult`]).
    Done(CloseResult),
    /// A provider could not be asked: the order stays `WAIT_PAY` and is tried again.
    Pending,
}

/// The reconcile and expiry work over every provider API client.
pub struct Reconciler {
    apis: Vec<Arc<dyn ProviderApi>>,
    store: Store,
    metrics: Arc<Metrics>,
    after_secs: i64,
    every_secs: i64,
    batch: i64,
    close_grace_secs: i64,
    max_run_secs: i64,
    /// Read for every provider call: it stamps the WeChat request and decides whether a
    /// signed answer is fresh (±300 s), so a run's start time would go stale in a backlog.
    clock: Arc<dyn Clock>,
}

fn secs(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX / 4)
}

impl Reconciler {
    pub fn new(
        apis: Vec<Arc<dyn ProviderApi>>,
        store: Store,
        metrics: Arc<Metrics>,
        settings: &ReconcileSettings,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            apis,
            store,
            metrics,
            after_secs: secs(settings.after_secs),
            every_secs: secs(settings.every_secs),
            batch: i64::from(settings.batch),
            close_grace_secs: secs(settings.close_grace_secs),
            max_run_secs: secs(settings.max_run_secs),
            clock,
        }
    }

    /// Whether a run that began at `started` has used up `reconcile.max_run_secs`.
    fn out_of_time(&self, started: Timestamp) -> bool {
        self.clock.now().unix_seconds() - started.unix_seconds() >= self.max_run_secs
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether any merchant/app has API credentials now.
    pub fn asks_providers(&self) -> bool {
        self.apis.iter().any(|a| a.has_accounts())
    }

    /// The provider accounts to ask about `order`: those it names, else every one with
    /// credentials. Once an order names an account on one channel, a channel it names no
    /// account on is not asked at all.
    fn accounts_for(&self, order: &OrderAtProvider) -> Vec<(&dyn ProviderApi, String)> {
        let named = !order.accounts.is_empty();
        let mut out = Vec::new();
        for api in &self.apis {
            let wanted = order.account_on(api.channel());
            for account in api.accounts() {
                if !named || wanted == Some(account.as_str()) {
                    out.push((api.as_ref(), account));
                }
            }
        }
        out
    }

    fn said(
        &self,
        api: &dyn ProviderApi,
        account: &str,
        call: ProviderCall,
        answer: &'static str,
        detail: Option<String>,
    ) -> Said {
        self.metrics.provider_call(api.channel(), call, answer);
        Said {
            channel: api.channel(),
            account: account.to_owned(),
            call: call.label(),
            answer,
            detail,
            ledger: None,
        }
    }

    fn failed(&self, order_no: &str, said: &Said, failure: &Failure) {
        tracing::warn!(
            order_no,
            channel = %said.channel,
            account = %said.account,
            call = said.call,
            result = failure.label(),
            detail = failure.detail(),
            "no usable answer from the provider"
        );
    }

    /// Applies a paid answer through the ledger, exactly as its notification would be.
    async fn apply(&self, notice: &Notice, now: Timestamp) -> Result<Outcome, StoreError> {
        let outcome = self.store.apply(notice, now).await?;
        match outcome {
            Outcome::Applied => {
                self.metrics.payment_recovered(notice.channel);
                tracing::info!(
                    order_no = %notice.out_trade_no,
                    channel = %notice.channel,
                    transaction_id = %notice.transaction_id,
                    "payment recovered from the provider's answer: its notification never came"
                );
            }
            Outcome::Anomaly(reason) => {
                self.metrics
                    .anomalies
                    .with_label_values(&[notice.channel.as_str(), reason.as_str()])
                    .inc();
            }
            _ => {}
        }
        Ok(outcome)
    }

    /// Queries one account; a paid answer is applied.
    async fn query_one(
        &self,
        api: &dyn ProviderApi,
        account: &str,
        order_no: &str,
    ) -> Result<Said, StoreError> {
        let answer = api.query(account, order_no, self.clock.now()).await;
        let detail = match &answer {
            TradeAnswer::Unpaid(status) => Some(status.clone()),
            TradeAnswer::Failed(f) => Some(f.detail().to_owned()),
            _ => None,
        };
        let mut said = self.said(api, account, ProviderCall::Query, answer.label(), detail);
        match answer {
            TradeAnswer::Paid(notice) => {
                said.ledger = Some(match self.apply(&notice, self.clock.now()).await {
                    Ok(outcome) => outcome.as_str(),
                    // Its group did not answer in time and may still commit: neither applied
                    // nor failed. The next run (or the notification) finds what it did.
                    Err(StoreError::Undecided(why)) => {
                        tracing::warn!(order_no, %why, "recovered payment not decided in time");
                        UNDECIDED
                    }
                    Err(e) => return Err(e),
                });
            }
            TradeAnswer::Failed(f) => self.failed(order_no, &said, &f),
            _ => {}
        }
        Ok(said)
    }

    /// Asks every provider account about an unpaid order and applies a paid answer.
    pub async fn query_order(&self, order: &OrderAtProvider) -> Result<Vec<Said>, StoreError> {
        if let Some(combination) = self
            .wechat_combination_of(order.combine_out_trade_no.as_deref())
            .await?
        {
            // A sub-order of a WeChat combination is asked about only through its combination.
            return Ok(vec![self.query_combination(&combination).await?.0]);
        }
        let mut all = Vec::new();
        for (api, account) in self.accounts_for(order) {
            all.push(self.query_one(api, &account, &order.order_no).await?);
        }
        Ok(all)
    }

    /// The reconcile job: unpaid orders older than `after_secs` and not asked about for
    /// `every_secs`, oldest first, one batch, for at most `max_run_secs` from `now` (the rest
    /// are the next run's). Returns how many payments it recovered.
    pub async fn reconcile_due(&self, now: Timestamp) -> Result<usize, StoreError> {
        if !self.asks_providers() {
            return Ok(0);
        }
        let due = self
            .store
            .orders_to_query(now, now.plus_seconds(-self.after_secs), self.batch)
            .await?;
        let mut recovered = 0;
        let mut combinations = std::collections::HashSet::new();
        for (done, order) in due.iter().enumerate() {
            if self.out_of_time(now) {
                tracing::info!(
                    asked = done,
                    left = due.len() - done,
                    "reconcile run stopped after reconcile.max_run_secs; the next run goes on"
                );
                break;
            }
            if let Some(combination) = self
                .wechat_combination_of(order.combine_out_trade_no.as_deref())
                .await?
            {
                // Once per combination and run, whichever of its sub-orders came first.
                if combinations.insert(combination.row.combine_out_trade_no.clone())
                    && self.reconcile_combination(&combination).await?
                {
                    recovered += 1;
                }
                continue;
            }
            // First: a provider that hangs must not make this order the first of every run.
            let asked_at = self.clock.now();
            self.store
                .query_again_at(
                    &order.order_no,
                    asked_at.plus_seconds(self.every_secs),
                    false,
                )
                .await?;
            let said = self.query_order(order).await?;
            recovered += said
                .iter()
                .filter(|s| s.ledger == Some(Outcome::Applied.as_str()))
                .count();
        }
        Ok(recovered)
    }

    /// Closes the trade at every provider account of `order`, then the order here. A provider
    /// that says it is paid has its payment applied instead (the order becomes `PAID`). When a
    /// provider cannot be asked, the order stays `WAIT_PAY`; with `grace`, once
    /// `close_grace_secs` have passed since `expire_at`, it is closed here anyway.
    ///
    /// A provider that has no trade for the order proves nothing before that deadline: Alipay
    /// creates page, WAP and QR trades only when the buyer logs in or scans, so the buyer can
    /// still pay until the `time_expire` the merchant passed at creation. The order stays
    /// `WAIT_PAY` and is asked again; past `expire_at + close_grace_secs` it is closed here.
    pub async fn close(
        &self,
        order: &OrderAtProvider,
        by: &str,
        grace: bool,
        said: &mut Vec<Said>,
    ) -> Result<Closing, StoreError> {
        let accounts = self.accounts_for(order);
        let mut unanswered = false;
        // A provider said paid and its payment may still be committing: never close now.
        let mut paying = false;
        // A provider that has no trade for it (yet): see above.
        let mut absent = false;
        for (api, account) in &accounts {
            let answer = api.close(account, &order.order_no, self.clock.now()).await;
            let detail = match &answer {
                CloseAnswer::Failed(f) => Some(f.detail().to_owned()),
                _ => None,
            };
            let one = self.said(*api, account, ProviderCall::Close, answer.label(), detail);
            said.push(one);
            match answer {
                // No close answer is bound to the order: WeChat's is an empty 204, valid for
                // any order of the merchant for 300 s; an error body is unsigned; Alipay's "no
                // such trade" is the same signed bytes for every order; "not closable" is paid
                // or closed before. Only a signed query answer that names the order settles it.
                CloseAnswer::Closed | CloseAnswer::NotFound | CloseAnswer::NotClosable => {
                    let queried = self.query_one(*api, account, &order.order_no).await?;
                    match queried.answer {
                        "paid" if queried.ledger == Some(UNDECIDED) => paying = true,
                        "paid" | "closed" => {}
                        "not_found" => absent = true,
                        _ => unanswered = true,
                    }
                    said.push(queried);
                }
                CloseAnswer::Failed(f) => {
                    if let Some(last) = said.last() {
                        self.failed(&order.order_no, last, &f);
                    }
                    unanswered = true;
                }
            }
        }
        let now = self.clock.now();
        if paying {
            // Asked again soon: by then the payment is in, and the order is not closable.
            self.store
                .query_again_at(&order.order_no, now.plus_seconds(10), true)
                .await?;
            if grace {
                self.metrics.expired(ExpiryResult::Retried);
            }
            return Ok(Closing::Pending);
        }
        if unanswered || absent {
            let deadline = order.expire_at.plus_seconds(self.close_grace_secs);
            let past = now.unix_seconds() >= deadline.unix_seconds();
            // Closing here without a provider's word is the expiry job's alone; a trade that
            // was never created and no longer can be closes whoever asks.
            if !(past && (grace || !unanswered)) {
                let attempts = u32::try_from(order.close_attempts.clamp(0, 6)).unwrap_or(6);
                let wait = (10_i64 << attempts).min(MAX_CLOSE_BACKOFF_SECS);
                self.store
                    .query_again_at(&order.order_no, now.plus_seconds(wait), true)
                    .await?;
                if grace {
                    self.metrics.expired(ExpiryResult::Retried);
                }
                return Ok(Closing::Pending);
            }
            if unanswered {
                tracing::warn!(
                    order_no = %order.order_no,
                    "closed here without the provider's word after reconcile.close_grace_secs; \
                     a payment that still lands becomes a PAID_AFTER_CLOSE anomaly"
                );
            } else {
                tracing::info!(
                    order_no = %order.order_no,
                    "no trade at the provider reconcile.close_grace_secs past expire_at: closed here"
                );
            }
        }
        let result = self.store.close_order(&order.order_no, by, now).await?;
        if grace {
            let counted = match (&result, unanswered, absent, accounts.is_empty()) {
                (CloseResult::Closed(_), true, _, _) => ExpiryResult::ClosedAfterGrace,
                (CloseResult::Closed(_), false, true, _) => ExpiryResult::ClosedNotFound,
                (CloseResult::Closed(_), false, false, true) => ExpiryResult::ClosedLocally,
                (CloseResult::Closed(_), false, false, false) => ExpiryResult::ClosedAtProvider,
                (CloseResult::NotClosable(_), _, _, _) => ExpiryResult::Paid,
                _ => return Ok(Closing::Done(result)),
            };
            self.metrics.expired(counted);
        }
        Ok(Closing::Done(result))
    }

    /// The expiry job: every unpaid order past `expire_at` (at `now`, the run's start) whose
    /// next attempt is due, closed at its providers and then here, for at most
    /// `max_run_secs`. Returns how many orders it closed.
    pub async fn expire_due(&self, now: Timestamp, batch: i64) -> Result<usize, StoreError> {
        let mut closed = 0;
        let mut seen = std::collections::HashSet::new();
        let mut combinations = std::collections::HashSet::new();
        loop {
            let due = self.store.expired_unpaid(now, batch).await?;
            let fresh: Vec<&OrderAtProvider> = due
                .iter()
                .filter(|o| seen.insert(o.order_no.clone()))
                .collect();
            for order in &fresh {
                if self.out_of_time(now) {
                    tracing::info!(
                        closed,
                        "expiry run stopped after reconcile.max_run_secs; the next run goes on"
                    );
                    return Ok(closed);
                }
                let mut said = Vec::new();
                let closing = match self
                    .wechat_combination_of(order.combine_out_trade_no.as_deref())
                    .await?
                {
                    // Closed whole, once per run, whichever of its sub-orders came first.
                    Some(combination) => {
                        if !combinations.insert(combination.row.combine_out_trade_no.clone()) {
                            continue;
                        }
                        let attempts = order.close_attempts;
                        self.close_combination(&combination, "expiry", true, attempts, &mut said)
                            .await?
                    }
                    None => self.close(order, "expiry", true, &mut said).await?,
                };
                if let Closing::Done(CloseResult::Closed(_)) = closing {
                    closed += 1;
                }
            }
            if (due.len() as i64) < batch || fresh.is_empty() {
                return Ok(closed);
            }
        }
    }
}
