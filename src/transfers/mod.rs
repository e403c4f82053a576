//! Merchant transfers (商家转账) started through paynotify, followed to the end.
//!
//! A transfer is recorded (`transfer`, its caps checked under its account's lock) before its
//! provider is called, and sent with its `out_bill_no` as the provider's idempotency key. It
//! is a money-out request like a refund (`crate::money_out`): no answer is unknown, never
//! failure, and the same call is sent again until the provider answers; then it is queried
//! until final. Every signed answer and every verified notification about it goes through one
//! ledger path (`Store::apply_transfer`), which moves it forward only and writes its one final
//! event, whichever arrives first.

use std::sync::Arc;

use serde::Serialize;

pub mod settings;
pub mod store;
mod view;

pub use view::TransferView;

use crate::channel::api::{CancelReply, ProviderApi, TransferAnswer, TransferReply};
use crate::metrics::{Metrics, ProviderCall};
use crate::money_out::{Followed, Schedule, follow_due, secs};
use crate::notice::{ChannelId, Digest, Outcome};
use crate::store::{Store, StoreError};
use crate::time::{Clock, Timestamp};
use crate::transfer::{
    AlipayPayee, Payee, SceneReportInfo, TransferCall, TransferSeen, TransferState, TransferStatus,
    WechatPayee,
};
use settings::TransferSettings;
use store::{NewTransfer, Recorded, TransferRow};

/// A transfer asked for, validated by the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub out_bill_no: String,
    pub channel: ChannelId,
    pub account: Option<String>,
    pub amount_fen: i64,
    pub remark: String,
    pub payee: AskedPayee,
    /// The digest of the request body as it came: the same body again is the same transfer.
    pub digest: Digest,
}

/// The payee and the channel's own fields, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskedPayee {
    Wechat {
        openid: String,
        user_name: Option<String>,
        appid: Option<String>,
        transfer_scene_id: String,
        transfer_scene_report_infos: Vec<SceneReportInfo>,
        user_recv_perception: Option<String>,
    },
    Alipay {
        identity: String,
        identity_type: String,
        name: Option<String>,
        order_title: Option<String>,
    },
}

/// What starting a transfer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Recorded and sent now (`202`).
    Sent(TransferView),
    /// The same request again (`200`): the stored transfer, nothing sent.
    Stored(TransferView),
}

/// Why a transfer is refused before anything is sent (`422` with its `code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Cap {
    OverMaxAmount,
    OverDailyLimit,
    AccountCannotTransfer,
}

impl Cap {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OverMaxAmount => "OVER_MAX_AMOUNT",
            Self::OverDailyLimit => "OVER_DAILY_LIMIT",
            Self::AccountCannotTransfer => "ACCOUNT_CANNOT_TRANSFER",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("transfers are off (transfers.enabled = false)")]
    Disabled,
    #[error("out_bill_no is another transfer's (another body)")]
    OtherRequest,
    #[error("no such {channel} account: {account}")]
    UnknownAccount { channel: ChannelId, account: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("{why}")]
    Refused { cap: Cap, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// WeChat accepted the cancel (`202`, `provider_state` `CANCELING`).
    Sent(TransferView),
    /// Already `CANCELLED` (`200`), nothing sent.
    Already(TransferView),
}

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("transfers are off (transfers.enabled = false)")]
    Disabled,
    #[error("no such transfer")]
    Unknown,
    /// `409`: an Alipay transfer, a final one, or one past the user's confirmation.
    #[error("{0}")]
    NotCancellable(String),
    /// `409`: WeChat refused the cancel; its code.
    #[error("WeChat refused the cancel: {code} {message}")]
    Refused { code: String, message: String },
    /// `503`: WeChat did not answer usably; the cancel may be asked again.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The accounts of one channel: every enabled one, and its API client.
pub struct ChannelAccounts {
    pub channel: ChannelId,
    /// Every enabled merchant/app, file or database (what `account` may name).
    pub provider: Arc<dyn crate::channel::Provider>,
    /// The client, when some of them have API credentials.
    pub api: Option<Arc<dyn ProviderApi>>,
}

/// Starts transfers, cancels them and follows them until they are final.
pub struct Transfers {
    channels: Vec<ChannelAccounts>,
    store: Store,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    settings: TransferSettings,
    schedule: Schedule,
}

impl Transfers {
    pub fn new(
        channels: Vec<ChannelAccounts>,
        store: Store,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        settings: &TransferSettings,
        call_timeout: std::time::Duration,
    ) -> Self {
        for accounts in &channels {
            metrics.transfer_anomalies_from_zero(accounts.channel);
        }
        Self {
            channels,
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

    /// Whether `POST /transfers` and cancel are on.
    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// Whether any account can be asked now (the job works only then).
    pub fn follows(&self) -> bool {
        self.channels
            .iter()
            .any(|c| c.api.as_ref().is_some_and(|a| a.has_accounts()))
    }

    pub fn scan_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.settings.scan_every_secs)
    }

    fn api(&self, channel: &str) -> Option<&dyn ProviderApi> {
        self.channels
            .iter()
            .find(|c| c.channel.as_str() == channel)
            .and_then(|c| c.api.as_deref())
    }

    /// The account a transfer leaves from, and the apps its payee may belong to: the one named
    /// (404 when no such account is configured), else the channel's only account with API
    /// credentials.
    fn account_for(&self, ask: &Ask) -> Result<(String, Vec<String>), StartError> {
        let channel = ask.channel;
        let cannot = |why: String| StartError::Refused {
            cap: Cap::AccountCannotTransfer,
            why,
        };
        let accounts = self.channels.iter().find(|c| c.channel == channel);
        let api = accounts.and_then(|c| c.api.as_ref());
        let account = match &ask.account {
            Some(named) => {
                if !accounts.is_some_and(|c| c.provider.has_account(named)) {
                    return Err(StartError::UnknownAccount {
                        channel,
                        account: named.clone(),
                    });
                }
                named.clone()
            }
            None => {
                let with_credentials = api.map(|a| a.accounts()).unwrap_or_default();
                match with_credentials.as_slice() {
                    [only] => only.clone(),
                    [] => {
                        return Err(cannot(format!(
                            "no {channel} account has API credentials: transfers cannot be sent"
                        )));
                    }
                    _ => {
                        return Err(StartError::BadRequest(format!(
                            "account: several {channel} accounts have API credentials; name one"
                        )));
                    }
                }
            }
        };
        let Some(api) = api.filter(|a| a.accounts().contains(&account)) else {
            return Err(cannot(format!(
                "{channel} account {account} has no API credentials: transfers cannot be sent"
            )));
        };
        let apps = api.transfer_apps(&account).map_err(cannot)?;
        Ok((account, apps))
    }

    /// The call sent for `ask` from `account`, every time.
    fn call_for(&self, ask: &Ask, apps: &[String]) -> Result<TransferCall, StartError> {
        let payee = match &ask.payee {
            AskedPayee::Wechat {
                openid,
                user_name,
                appid,
                transfer_scene_id,
                transfer_scene_report_infos,
                user_recv_perception,
            } => {
                let appid = match (appid, apps) {
                    (Some(named), _) if apps.contains(named) => named.clone(),
                    (Some(named), _) => {
                        return Err(StartError::BadRequest(format!(
                            "appid: {named} is not an app of this merchant"
                        )));
                    }
                    (None, [only]) => only.clone(),
                    (None, []) => {
                        return Err(StartError::BadRequest(
                            "appid: the merchant has no appid configured; name the payee's app"
                                .to_owned(),
                        ));
                    }
                    (None, _) => {
                        return Err(StartError::BadRequest(
                            "appid: the merchant has several apps; name the payee's".to_owned(),
                        ));
                    }
                };
                let notify_url =
                    Some(self.settings.wechat_notify_url.clone()).filter(|url| !url.is_empty());
                Payee::Wechat(WechatPayee {
                    appid,
                    openid: openid.clone(),
                    user_name: user_name.clone(),
                    transfer_scene_id: transfer_scene_id.clone(),
                    transfer_scene_report_infos: transfer_scene_report_infos.clone(),
                    user_recv_perception: user_recv_perception.clone(),
                    notify_url,
                })
            }
            AskedPayee::Alipay {
                identity,
                identity_type,
                name,
                order_title,
            } => Payee::Alipay(AlipayPayee {
                identity: identity.clone(),
                identity_type: identity_type.clone(),
                name: name.clone(),
                order_title: order_title.clone().unwrap_or_else(|| ask.remark.clone()),
            }),
        };
        Ok(TransferCall {
            out_bill_no: ask.out_bill_no.clone(),
            amount_fen: ask.amount_fen,
            remark: ask.remark.clone(),
            payee,
        })
    }

    /// `POST /transfers`, after the 403 and 400 checks: the number looked up (`200`/`409`),
    /// then the account (`404`), then the caps (`422`), then recorded and sent.
    pub async fn start(&self, ask: &Ask) -> Result<Started, StartError> {
        if !self.enabled() {
            return Err(StartError::Disabled);
        }
        if let Some(row) = self.store.transfer(&ask.out_bill_no).await? {
            return if row.request_digest == ask.digest.as_str() {
                Ok(Started::Stored(row.into()))
            } else {
                Err(StartError::OtherRequest)
            };
        }
        let (account, apps) = self.account_for(ask)?;
        let call = self.call_for(ask, &apps)?;
        if ask.amount_fen > self.settings.max_amount_fen {
            return Err(StartError::Refused {
                cap: Cap::OverMaxAmount,
                why: format!(
                    "amount_fen {} is over transfers.max_amount_fen ({})",
                    ask.amount_fen, self.settings.max_amount_fen
                ),
            });
        }
        let payee = shown_payee(&call.payee).to_string();
        let request = serde_json::to_string(&call)
            .map_err(|e| StoreError::Unavailable(format!("the transfer call: {e}")))?;
        let now = self.clock.now();
        let recorded = self
            .store
            .record_transfer(&NewTransfer {
                out_bill_no: &ask.out_bill_no,
                channel: ask.channel.as_str(),
                account: &account,
                amount_fen: ask.amount_fen,
                remark: &ask.remark,
                payee: &payee,
                request: &request,
                request_digest: ask.digest.as_str(),
                daily_limit_fen: self.settings.daily_limit_fen,
                now,
                retry_at: now.plus_seconds(self.schedule.resend_after(0)),
            })
            .await?;
        let row = match recorded {
            Recorded::Send(row) => row,
            Recorded::Same(row) => return Ok(Started::Stored(row.into())),
            Recorded::OtherRequest => return Err(StartError::OtherRequest),
            Recorded::OverDailyLimit { used_fen } => {
                return Err(StartError::Refused {
                    cap: Cap::OverDailyLimit,
                    why: format!(
                        "{account} sent {used_fen} fen since Beijing midnight; {} more is over transfers.daily_limit_fen ({})",
                        ask.amount_fen, self.settings.daily_limit_fen
                    ),
                });
            }
        };
        self.metrics.transfer_started(ask.channel);
        tracing::info!(out_bill_no = %row.out_bill_no, channel = %row.channel, account = %row.account, amount_fen = row.amount_fen, "transfer recorded; sending it");
        let out_bill_no = row.out_bill_no.clone();
        self.send(row).await?;
        let row =
            self.store.transfer(&out_bill_no).await?.ok_or_else(|| {
                StoreError::Unavailable("the transfer just recorded is gone".into())
            })?;
        Ok(Started::Sent(row.into()))
    }

    /// `GET /transfers/{out_bill_no}`.
    pub async fn get(&self, out_bill_no: &str) -> Result<Option<TransferView>, StoreError> {
        Ok(self.store.transfer(out_bill_no).await?.map(Into::into))
    }

    /// The console's list: newest first, of one status or all.
    pub async fn list(
        &self,
        status: Option<TransferStatus>,
        limit: i64,
    ) -> Result<Vec<TransferView>, StoreError> {
        let rows = self.store.transfers(status, limit).await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Whether a cancel may be sent for `row`: WeChat, not final, not past the user's
    /// confirmation. `Err` is the `409`'s words.
    pub fn cancellable(row: &TransferRow) -> Result<(), String> {
        if row.channel != ChannelId::Wechat.as_str() {
            return Err("only WeChat transfers can be cancelled".to_owned());
        }
        let status = row.status();
        if status.is_final() {
            return Err(format!("the transfer is {}: final", status.as_str()));
        }
        if row.provider_state.as_deref() == Some("TRANSFERING") {
            return Err("the user confirmed the transfer: WeChat no longer cancels it".to_owned());
        }
        Ok(())
    }

    /// `POST /transfers/{out_bill_no}/cancel`.
    pub async fn cancel(&self, out_bill_no: &str) -> Result<Cancelled, CancelError> {
        if !self.enabled() {
            return Err(CancelError::Disabled);
        }
        let Some(row) = self.store.transfer(out_bill_no).await? else {
            return Err(CancelError::Unknown);
        };
        if row.status() == TransferStatus::Cancelled {
            return Ok(Cancelled::Already(row.into()));
        }
        Self::cancellable(&row).map_err(CancelError::NotCancellable)?;
        let Some(api) = self.api(&row.channel) else {
            return Err(CancelError::Unavailable(format!(
                "no API client for {} now",
                row.channel
            )));
        };
        let reply = api
            .transfer_cancel(&row.account, out_bill_no, self.clock.now())
            .await;
        self.metrics
            .provider_call(api.channel(), ProviderCall::TransferCancel, reply.label());
        match reply {
            CancelReply::Canceling(seen) => {
                self.applied(&row, &seen).await?;
            }
            CancelReply::Refused { code, message } => {
                tracing::warn!(out_bill_no, code, message, "WeChat refused the cancel");
                return Err(CancelError::Refused { code, message });
            }
            CancelReply::NotFound => {
                return Err(CancelError::NotCancellable(
                    "WeChat holds no bill under this number yet; ask again once it does".to_owned(),
                ));
            }
            CancelReply::Failed(failure) => {
                tracing::warn!(
                    out_bill_no,
                    result = failure.label(),
                    detail = failure.detail(),
                    "no usable answer to the cancel"
                );
                return Err(CancelError::Unavailable(format!(
                    "WeChat did not answer the cancel usably ({}); ask again",
                    failure.label()
                )));
            }
        }
        let row = self
            .store
            .transfer(out_bill_no)
            .await?
            .ok_or(CancelError::Unknown)?;
        if row.status() == TransferStatus::Cancelled {
            return Ok(Cancelled::Already(row.into()));
        }
        Ok(Cancelled::Sent(row.into()))
    }

    /// The job: every due transfer, one call each. Returns how many it called about.
    pub async fn drive_due(&self) -> Result<usize, StoreError> {
        let called = follow_due(self, self.clock.now(), i64::from(self.settings.batch)).await?;
        self.measure_open().await?;
        Ok(called)
    }

    /// `paynotify_transfers_open_oldest_seconds`: the age of each channel's oldest transfer
    /// per not-final status, read after each run (a transfer stuck a day is alerted on).
    async fn measure_open(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        for accounts in &self.channels {
            for status in [TransferStatus::Processing, TransferStatus::WaitUserConfirm] {
                let oldest = self
                    .store
                    .oldest_open_transfer(accounts.channel.as_str(), status)
                    .await?;
                let age = oldest.map_or(0, |t| (now.unix_seconds() - t.unix_seconds()).max(0));
                self.metrics
                    .transfers_open_oldest(accounts.channel, status, age);
            }
        }
        Ok(())
    }

    /// Sends (or sends again) one recorded transfer, exactly as it was recorded, and applies
    /// what the provider said.
    async fn send(&self, row: TransferRow) -> Result<(), StoreError> {
        let Some(api) = self.api(&row.channel) else {
            tracing::warn!(out_bill_no = %row.out_bill_no, channel = %row.channel, "no API client for the transfer's channel now; it waits");
            return Ok(());
        };
        let call: TransferCall = match serde_json::from_str(&row.request) {
            Ok(call) => call,
            Err(e) => {
                tracing::error!(out_bill_no = %row.out_bill_no, error = %e, "the recorded transfer call does not read back; it is not sent");
                return Ok(());
            }
        };
        let reply = api.transfer(&row.account, &call, self.clock.now()).await;
        self.metrics
            .provider_call(api.channel(), ProviderCall::Transfer, reply.label());
        match reply {
            TransferReply::Accepted(seen) => {
                self.applied(&row, &seen).await?;
                if !row.answered() {
                    let first = self.schedule.first_query(self.clock.now());
                    self.store
                        .schedule_transfer(&row.out_bill_no, first)
                        .await?;
                }
            }
            TransferReply::Refused { code, message } => {
                // A refusal is final, so it must be true: a bill an earlier send created wins,
                // and no answer leaves it unknown.
                let confirm = api
                    .transfer_query(&row.account, &row.out_bill_no, self.clock.now())
                    .await;
                self.metrics.provider_call(
                    api.channel(),
                    ProviderCall::TransferQuery,
                    confirm.label(),
                );
                match confirm {
                    TransferAnswer::Found(seen) => {
                        self.applied(&row, &seen).await?;
                    }
                    TransferAnswer::NotFound => {
                        tracing::warn!(out_bill_no = %row.out_bill_no, code, message, "the provider refused the transfer; nothing was created under its number");
                        let refused = TransferSeen {
                            out_bill_no: row.out_bill_no.clone(),
                            provider_bill_no: None,
                            state: TransferState::Fail,
                            provider_state: None,
                            amount_fen: None,
                            account: row.account.clone(),
                            package_info: None,
                            fail_reason: Some(code),
                            occurred_at: None,
                        };
                        self.applied(&row, &refused).await?;
                    }
                    TransferAnswer::Failed(failure) => {
                        tracing::warn!(out_bill_no = %row.out_bill_no, code, result = failure.label(), "a refusal the query could not confirm; the transfer is sent again");
                    }
                }
            }
            TransferReply::Failed(failure) => {
                // Unknown, never failure: the provider may have created it. The job sends the
                // same call again, under the same number.
                tracing::warn!(out_bill_no = %row.out_bill_no, result = failure.label(), detail = failure.detail(), "no usable answer to the transfer; it is sent again under the same number");
            }
        }
        Ok(())
    }

    /// Asks the provider about a transfer it holds.
    async fn query(&self, row: TransferRow) -> Result<(), StoreError> {
        let Some(api) = self.api(&row.channel) else {
            return Ok(());
        };
        let answer = api
            .transfer_query(&row.account, &row.out_bill_no, self.clock.now())
            .await;
        self.metrics
            .provider_call(api.channel(), ProviderCall::TransferQuery, answer.label());
        match answer {
            TransferAnswer::Found(seen) => {
                self.applied(&row, &seen).await?;
            }
            TransferAnswer::NotFound => {
                // Nothing under this number: the same call again is safe, and the only way on.
                tracing::info!(out_bill_no = %row.out_bill_no, "the provider reports no bill under this number; sending it again");
                return self.send(row).await;
            }
            TransferAnswer::Failed(failure) => {
                tracing::warn!(out_bill_no = %row.out_bill_no, result = failure.label(), detail = failure.detail(), "no usable answer to the transfer query; asked again later");
            }
        }
        Ok(())
    }

    /// Applies a signed answer through the ledger, as a notification would be.
    async fn applied(&self, row: &TransferRow, seen: &TransferSeen) -> Result<Outcome, StoreError> {
        let Some(channel) = ChannelId::parse(&row.channel) else {
            return Ok(Outcome::Ignored);
        };
        let outcome = self
            .store
            .apply_transfer(channel, seen, true, self.clock.now())
            .await?;
        match outcome {
            Outcome::Applied => {
                if let Some(status) = seen.state.status().filter(|s| s.is_final()) {
                    tracing::info!(out_bill_no = %row.out_bill_no, status = status.as_str(), "transfer final");
                    self.metrics.transfer_final(channel, status.result_label());
                }
            }
            Outcome::Anomaly(reason) => {
                self.metrics.transfer_anomaly(channel, reason);
                tracing::error!(out_bill_no = %row.out_bill_no, reason = reason.as_str(), "a signed answer about the transfer does not match it; TRANSFER_ANOMALY raised, the transfer did not move");
            }
            _ => {}
        }
        Ok(outcome)
    }
}

/// Who is paid, as a transfer shows it: never a name.
fn shown_payee(payee: &Payee) -> serde_json::Value {
    match payee {
        Payee::Wechat(p) => serde_json::json!({ "openid": p.openid }),
        Payee::Alipay(p) => serde_json::json!({
            "identity": p.identity,
            "identity_type": p.identity_type,
        }),
    }
}

/// A transfer is a money-out request followed to the end: sent again while no answer came,
/// queried once the provider holds it.
impl Followed for Transfers {
    type Row = TransferRow;

    async fn due(&self, now: Timestamp, limit: i64) -> Result<Vec<TransferRow>, StoreError> {
        self.store.transfers_due(now, limit).await
    }

    fn next_call(&self, row: &TransferRow, now: Timestamp) -> Timestamp {
        self.schedule.next_call(row.answered(), row.attempts, now)
    }

    async fn claim(&self, row: &TransferRow, next: Timestamp) -> Result<bool, StoreError> {
        self.store.claim_transfer(row, next).await
    }

    async fn call(&self, row: TransferRow) -> Result<(), StoreError> {
        if row.answered() {
            self.query(row).await
        } else {
            self.send(row).await
        }
    }
}
