//! Refunds started through paynotify, followed to the end.
//!
//! A refund is recorded (`refund_request`, the remainder checked under the order's row lock)
//! before its provider is called, and is sent to the order's own payment with its
//! `out_refund_no` as the provider's idempotency key. A timeout is unknown, never failure:
//! the job sends the same request again until the provider answers, then queries a refund
//! that is not final. A final, signed answer goes through the ledger as the refund
//! notification would (same key; Alipay's query, which names the refund's own amount and not
//! the trade's running total, is the same refund by its amount), and the ledger marks the
//! request `SUCCESS` in that transaction — so the order moves once, whichever arrives first.

use std::sync::Arc;

use serde::Serialize;

pub mod settings;
pub mod store;

use crate::channel::api::{ProviderApi, RefundAnswer, RefundCall, RefundReply, RefundState};
use crate::metrics::{Metrics, ProviderCall};
use crate::money_out::{Followed, Schedule, follow_due, secs};
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Outcome, Refund, RefundAmount};
use crate::order::{OrderStatus, RefundStatus};
use crate::store::{Store, StoreError};
use crate::time::{Clock, Timestamp};
use settings::RefundSettings;
use store::{NewRefund, Recorded, RefundMove, RefundRow};

/// The longest provider message kept with a refusal.
const MAX_MESSAGE_CHARS: usize = 256;

/// A refund as `POST`/`GET /orders/{order_no}/refunds` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RefundView {
    pub out_refund_no: String,
    pub order_no: String,
    pub channel: String,
    pub amount_fen: i64,
    pub status: RefundStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The provider's refund id, once it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    /// The provider's refusal (status `ABNORMAL`): nothing was created under this number;
    /// the same request again sends it again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl From<RefundRow> for RefundView {
    fn from(row: RefundRow) -> Self {
        Self {
            status: row.status(),
            out_refund_no: row.out_refund_no,
            order_no: row.order_no,
            channel: row.channel,
            amount_fen: row.amount_fen,
            reason: row.reason,
            refund_id: row.refund_id,
            error_code: row.error_code,
            error_message: row.error_message,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// A refund asked for, validated by the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub out_refund_no: String,
    pub amount_fen: i64,
    pub reason: Option<String>,
}

/// What starting a refund did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Recorded and sent now (`202`): its status is what the provider answered, or
    /// `SUBMITTING` when it did not answer.
    Sent(RefundView),
    /// The same request again (`200`): the stored refund, nothing sent.
    Stored(RefundView),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no such order")]
    UnknownOrder,
    #[error("the order is {}: only a PAID order can be refunded", .0.as_str())]
    NotRefundable(OrderStatus),
    #[error(
        "amount_fen is more than is left to refund ({left_fen} fen: paid − refunded − refunds in flight)"
    )]
    OverRemainder { left_fen: i64 },
    #[error("out_refund_no is another refund's (another order or amount)")]
    OtherRequest,
    #[error("{0}")]
    NoAccount(String),
    /// The account the order names cannot be asked now: disabled (`/admin/merchants`), or
    /// without API credentials.
    #[error("{0}")]
    AccountOff(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Starts refunds and follows them until they are final.
pub struct Refunds {
    apis: Vec<Arc<dyn ProviderApi>>,
    store: Store,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    settings: RefundSettings,
    /// When a refund is sent again or queried (`crate::money_out`).
    schedule: Schedule,
}

impl Refunds {
    pub fn new(
        apis: Vec<Arc<dyn ProviderApi>>,
        store: Store,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        settings: &RefundSettings,
        call_timeout: std::time::Duration,
    ) -> Self {
        Self {
            apis,
            store,
            metrics,
            clock,
            settings: settings.clone(),
            schedule: Schedule {
                query_after_secs: secs(settings.query_after_secs),
                query_every_secs: secs(settings.query_every_secs),
                max_retry_secs: secs(settings.max_retry_secs),
                call_secs: secs(call_timeout.as_secs()),
            },
        }
    }

    /// Whether any merchant/app has API credentials now (the job works only then).
    pub fn sends(&self) -> bool {
        self.apis.iter().any(|a| a.has_accounts())
    }

    pub fn scan_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.settings.scan_every_secs)
    }

    fn api(&self, channel: &str) -> Option<&dyn ProviderApi> {
        self.apis
            .iter()
            .find(|a| a.channel().as_str() == channel)
            .map(AsRef::as_ref)
    }

    /// The account the order's payment is refunded through: the one it names on its
    /// channel, else the channel's only account with API credentials.
    async fn account_for(&self, order_no: &str, channel: &str) -> Result<String, StartError> {
        let Some(api) = self.api(channel) else {
            return Err(StartError::NoAccount(format!(
                "no {channel} merchant or app has API credentials: refunds cannot be sent"
            )));
        };
        if let Some(named) = self.store.order_account(order_no, channel).await? {
            if !api.accounts().contains(&named) {
                return Err(StartError::AccountOff(format!(
                    "the order's {channel} account {named} cannot be asked: it is disabled, or has no API credentials"
                )));
            }
            return Ok(named);
        }
        match api.accounts().as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(StartError::NoAccount(format!(
                "the order names no {channel} account and several have API credentials: name it when creating the order"
            ))),
        }
    }

    /// `POST /orders/{order_no}/refunds`.
    pub async fn start(&self, order_no: &str, ask: &Ask) -> Result<Started, StartError> {
        let Some(order) = self.store.order(order_no).await? else {
            return Err(StartError::UnknownOrder);
        };
        let Some(channel) = order.channel.clone() else {
            return Err(StartError::NotRefundable(order.status));
        };
        let account = self.account_for(order_no, &channel).await?;
        let now = self.clock.now();
        let recorded = self
            .store
            .record_refund(&NewRefund {
                out_refund_no: &ask.out_refund_no,
                order_no,
                account: &account,
                amount_fen: ask.amount_fen,
                reason: ask.reason.as_deref(),
                now,
                retry_at: now.plus_seconds(self.schedule.resend_after(0)),
            })
            .await?;
        let row = match recorded {
            Recorded::Send(row) => row,
            Recorded::Same(row) => return Ok(Started::Stored(row.into())),
            Recorded::OtherRequest => return Err(StartError::OtherRequest),
            Recorded::UnknownOrder => return Err(StartError::UnknownOrder),
            Recorded::NotRefundable(status) => return Err(StartError::NotRefundable(status)),
            Recorded::OverRemainder { left_fen } => {
                return Err(StartError::OverRemainder { left_fen });
            }
        };
        self.metrics.refund_started(&channel);
        tracing::info!(order_no, out_refund_no = %row.out_refund_no, amount_fen = row.amount_fen, channel, "refund recorded; sending it");
        let out_refund_no = row.out_refund_no.clone();
        self.send(row).await?;
        let row = self
            .store
            .refund_request(&out_refund_no)
            .await?
            .ok_or(StartError::UnknownOrder)?;
        Ok(Started::Sent(row.into()))
    }

    /// `GET /orders/{order_no}/refunds`: `None` for an unknown order.
    pub async fn list(&self, order_no: &str) -> Result<Option<Vec<RefundView>>, StoreError> {
        if self.store.order(order_no).await?.is_none() {
            return Ok(None);
        }
        let rows = self.store.refunds_of(order_no).await?;
        Ok(Some(rows.into_iter().map(RefundView::from).collect()))
    }

    /// The job: every due request not final, one call each — sent again while no answer
    /// came, queried once the provider holds it. Returns how many it called about.
    pub async fn drive_due(&self) -> Result<usize, StoreError> {
        follow_due(self, self.clock.now(), i64::from(self.settings.batch)).await
    }

    /// Sends (or sends again) one recorded refund and records what the provider said.
    async fn send(&self, row: RefundRow) -> Result<(), StoreError> {
        let Some(api) = self.api(&row.channel) else {
            tracing::warn!(out_refund_no = %row.out_refund_no, channel = %row.channel, "no API client for the refund's channel now; it waits");
            return Ok(());
        };
        let call = RefundCall {
            out_trade_no: row.order_no.clone(),
            transaction_id: row.transaction_id.clone(),
            out_refund_no: row.out_refund_no.clone(),
            amount_fen: row.amount_fen,
            total_fen: row.total_fen,
            reason: row.reason.clone(),
        };
        let reply = api.refund(&row.account, &call, self.clock.now()).await;
        self.metrics
            .provider_call(api.channel(), ProviderCall::Refund, reply.label());
        let now = self.clock.now();
        let from = row.status();
        match reply {
            RefundReply::Accepted {
                state,
                refund_id,
                notice,
            } => {
                if let (RefundState::Success, Some(notice)) = (state, &notice)
                    && self.applied(&row, notice).await?
                {
                    return Ok(());
                }
                let refund_id = refund_id.or_else(|| row.refund_id.clone());
                self.moved(&row, from, state, refund_id.as_deref(), now)
                    .await?;
            }
            RefundReply::Refused { code, message } => {
                // A refusal frees the amount, so it must be true: a signed answer naming the
                // refund (an earlier send created it) wins, and no answer leaves it unknown.
                let confirm = api
                    .refund_query(&row.account, &row.order_no, &row.out_refund_no, now)
                    .await;
                self.metrics.provider_call(
                    api.channel(),
                    ProviderCall::RefundQuery,
                    confirm.label(),
                );
                match confirm {
                    RefundAnswer::NotFound => {}
                    RefundAnswer::Failed(failure) => {
                        tracing::warn!(out_refund_no = %row.out_refund_no, code, result = failure.label(), "a refusal the refund query could not confirm; the refund is sent again");
                        return Ok(());
                    }
                    RefundAnswer::Refunded(Some(notice)) => {
                        if !self.applied(&row, &notice).await? {
                            self.moved(
                                &row,
                                from,
                                RefundState::Processing,
                                row.refund_id.as_deref(),
                                now,
                            )
                            .await?;
                        }
                        return Ok(());
                    }
                    RefundAnswer::Refunded(None) => {
                        return self
                            .moved(
                                &row,
                                from,
                                RefundState::Processing,
                                row.refund_id.as_deref(),
                                now,
                            )
                            .await;
                    }
                    RefundAnswer::NotRefunded(state, _) => {
                        return self
                            .moved(&row, from, state, row.refund_id.as_deref(), now)
                            .await;
                    }
                }
                let message: String = message.chars().take(MAX_MESSAGE_CHARS).collect();
                tracing::warn!(out_refund_no = %row.out_refund_no, order_no = %row.order_no, code, message, "the provider refused the refund; nothing was created under its number");
                let to = RefundMove {
                    status: RefundStatus::Abnormal,
                    refund_id: row.refund_id.as_deref(),
                    error: Some((&code, &message)),
                    next_attempt_at: None,
                    now,
                };
                if self
                    .store
                    .move_refund(&row.out_refund_no, from, &to)
                    .await?
                {
                    self.metrics.refund_final(&row.channel, "refused");
                }
            }
            RefundReply::Failed(failure) => {
                // Unknown, never failure: the provider may have created it. The job sends
                // the same request again (the claim set when).
                tracing::warn!(out_refund_no = %row.out_refund_no, order_no = %row.order_no, result = failure.label(), detail = failure.detail(), "no usable answer to the refund; it is sent again under the same number");
            }
        }
        Ok(())
    }

    /// Moves a request to the provider's not-yet-applied state.
    async fn moved(
        &self,
        row: &RefundRow,
        from: RefundStatus,
        state: RefundState,
        refund_id: Option<&str>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let status = match state {
            // Done but not applied yet (its group undecided, another refund in the way): the
            // query applies it.
            RefundState::Processing | RefundState::Success => RefundStatus::Processing,
            RefundState::Abnormal => RefundStatus::Abnormal,
            RefundState::Closed => RefundStatus::Closed,
        };
        // Accepted now: first asked about after query_after_secs; asked before: when the
        // job's claim said.
        let next_attempt_at =
            (from == RefundStatus::Submitting).then(|| self.schedule.first_query(now));
        let to = RefundMove {
            status,
            refund_id,
            error: None,
            next_attempt_at,
            now,
        };
        let moved = self
            .store
            .move_refund(&row.out_refund_no, from, &to)
            .await?;
        if moved && status == RefundStatus::Closed {
            tracing::warn!(out_refund_no = %row.out_refund_no, order_no = %row.order_no, "the provider closed the refund: no money moved");
            self.metrics.refund_final(&row.channel, "closed");
        }
        Ok(())
    }

    /// Asks the provider about a refund it holds.
    async fn query(&self, row: RefundRow) -> Result<(), StoreError> {
        let Some(api) = self.api(&row.channel) else {
            return Ok(());
        };
        let answer = api
            .refund_query(
                &row.account,
                &row.order_no,
                &row.out_refund_no,
                self.clock.now(),
            )
            .await;
        self.metrics
            .provider_call(api.channel(), ProviderCall::RefundQuery, answer.label());
        let now = self.clock.now();
        let from = row.status();
        match answer {
            RefundAnswer::Refunded(Some(notice)) => {
                self.applied(&row, &notice).await?;
            }
            RefundAnswer::Refunded(None) => {
                self.apply_asked(&row).await?;
            }
            RefundAnswer::NotRefunded(state, status) => {
                tracing::info!(out_refund_no = %row.out_refund_no, status, "refund not final at the provider");
                self.moved(&row, from, state, row.refund_id.as_deref(), now)
                    .await?;
            }
            RefundAnswer::NotFound => {
                // The provider holds nothing done under this number (Alipay: "not received,
                // or failed"): the same request again is safe, and the only way to know.
                tracing::info!(out_refund_no = %row.out_refund_no, "the provider reports no refund under this number; sending it again");
                return self.send(row).await;
            }
            RefundAnswer::Failed(failure) => {
                tracing::warn!(out_refund_no = %row.out_refund_no, result = failure.label(), detail = failure.detail(), "no usable answer to the refund query; asked again later");
            }
        }
        Ok(())
    }

    /// A provider answered "done" without a notice (Alipay's refund query, which names this
    /// refund's amount and not the trade's running total its notification carries): the
    /// refund at the amount asked for — Alipay refunds exactly that under its number, or
    /// nothing. Its notification, later, is the same refund.
    async fn apply_asked(&self, row: &RefundRow) -> Result<bool, StoreError> {
        let (Some(refund_id), Some(channel)) = (&row.refund_id, ChannelId::parse(&row.channel))
        else {
            return Ok(false);
        };
        let Some(order) = self.store.order(&row.order_no).await? else {
            return Ok(false);
        };
        let notice = Notice {
            channel,
            kind: NoticeKind::Refunded(Refund {
                out_refund_no: row.out_refund_no.clone(),
                refund_id: refund_id.clone(),
                amount: RefundAmount::This(row.amount_fen),
            }),
            out_trade_no: row.order_no.clone(),
            transaction_id: row.transaction_id.clone(),
            amount_fen: row.total_fen,
            currency: order.currency,
            // The answer verified with the key of the account that asked, about the order's
            // own payment.
            merchant: MerchantIds {
                merchant_id: row.account.clone(),
                app_id: None,
            },
            merchant_matches: true,
            occurred_at: None,
        };
        self.applied(row, &notice).await
    }

    /// Applies a done refund through the ledger; whether the ledger counts it now (which
    /// marked the request `SUCCESS` in the same transaction).
    async fn applied(&self, row: &RefundRow, notice: &Notice) -> Result<bool, StoreError> {
        let outcome = self.store.apply(notice, self.clock.now()).await;
        match outcome {
            Ok(outcome @ (Outcome::Applied | Outcome::Duplicate)) => {
                tracing::info!(out_refund_no = %row.out_refund_no, order_no = %row.order_no, outcome = outcome.as_str(), "refund done at the provider and in the ledger");
                self.metrics.refund_final(&row.channel, "success");
                Ok(true)
            }
            Ok(other) => {
                tracing::warn!(out_refund_no = %row.out_refund_no, order_no = %row.order_no, outcome = other.as_str(), "a refund done at the provider the ledger did not count; asked again later");
                Ok(false)
            }
            Err(StoreError::Undecided(why)) => {
                tracing::warn!(out_refund_no = %row.out_refund_no, %why, "refund not decided in time; asked again later");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// A refund is a money-out request followed to the end: sent again while no answer came,
/// queried once the provider holds it.
impl Followed for Refunds {
    type Row = RefundRow;

    async fn due(&self, now: Timestamp, limit: i64) -> Result<Vec<RefundRow>, StoreError> {
        self.store.refunds_due(now, limit).await
    }

    fn next_call(&self, row: &RefundRow, now: Timestamp) -> Timestamp {
        let answered = row.status() != RefundStatus::Submitting;
        self.schedule.next_call(answered, row.attempts, now)
    }

    async fn claim(&self, row: &RefundRow, next: Timestamp) -> Result<bool, StoreError> {
        self.store.claim_refund(row, next).await
    }

    async fn call(&self, row: RefundRow) -> Result<(), StoreError> {
        match row.status() {
            RefundStatus::Submitting => self.send(row).await,
            _ => self.query(row).await,
        }
    }
}
