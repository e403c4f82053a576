//! Asking a provider about one trade (query, close, refund, refund query), one combined
//! payment (its query, its close) or one transfer (transfer, its query, its cancel): the
//! neutral answers every
//! provider's client gives, the [`ProviderApi`] trait each provider implements in its own
//! file, and the HTTPS plumbing they share — rustls on ring, the system's roots plus
//! `provider_api.ca_file`, connect and overall timeouts, and a per-provider rate limit.
//!
//! An answer is evidence only when it verifies with the provider's key: a paid answer is a
//! [`Notice`] built from the signed bytes, exactly as the notification would be decoded.

use std::future::Future;
use std::pin::Pin;

use crate::notice::{ChannelId, Notice};
use crate::time::Timestamp;
use crate::transfer::{TransferCall, TransferSeen};

mod plumbing;

pub use plumbing::{Account, Accounts, Failure, Plumbing, RateLimiter, Received};

/// What a provider client's calls return: boxed, so the trait stays usable as `dyn`.
pub type ApiFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A provider's answer to "what became of this trade?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TradeAnswer {
    /// Paid (and perhaps refunded since): the payment as the notification would carry it.
    Paid(Box<Notice>),
    /// The trade exists and is not paid (yet); the provider's status.
    Unpaid(String),
    /// Closed at the provider: it can no longer be paid.
    Closed,
    /// The provider has no such trade now (the buyer has not opened the payment). Not proof
    /// that it cannot be paid: Alipay creates a page, WAP or QR trade only when the buyer
    /// logs in or scans.
    NotFound,
    Failed(Failure),
}

impl TradeAnswer {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Paid(_) => "paid",
            Self::Unpaid(_) => "unpaid",
            Self::Closed => "closed",
            Self::NotFound => "not_found",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A provider's answer to "close this trade".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseAnswer {
    /// Closed now (or before): it can no longer be paid.
    Closed,
    /// The provider has no such trade now; as [`TradeAnswer::NotFound`], not proof that it
    /// cannot be paid later.
    NotFound,
    /// The provider refuses because of the trade's state: paid (WeChat `ORDERPAID`), or, on
    /// Alipay, paid or already closed. Only a query tells which, with a signed answer.
    NotClosable,
    Failed(Failure),
}

impl CloseAnswer {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::NotFound => "not_found",
            Self::NotClosable => "not_closable",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A provider's answer to "what became of this combined payment?" (WeChat's combine query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CombineAnswer {
    /// A verified answer naming this combination and the asking merchant: the combination's
    /// notice ([`crate::notice::NoticeKind::Combined`]) with every sub-order and its
    /// `trade_state`, paid or not. Only the sub-orders [`crate::notice::SubPayment::is_paid`]
    /// says are paid carry a payment.
    Found(Box<Notice>),
    /// The provider has no such combination (WeChat `ORDER_NOT_EXIST`).
    NotFound,
    Failed(Failure),
}

impl CombineAnswer {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Found(_) => "found",
            Self::NotFound => "not_found",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A provider's answer to "what became of this refund?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundAnswer {
    /// Done: the refund as its notification would carry it, when the answer has every field
    /// the notification's business content covers (Alipay's answer lacks the trade's running
    /// refund total, so it reports the refund without a notice).
    Refunded(Option<Box<Notice>>),
    /// Not final yet, or final without money moving (WeChat `CLOSED`/`ABNORMAL`): what it
    /// means and the provider's own status.
    NotRefunded(RefundState, String),
    NotFound,
    Failed(Failure),
}

impl RefundAnswer {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Refunded(_) => "refunded",
            Self::NotRefunded(..) => "not_refunded",
            Self::NotFound => "not_found",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A refund as a provider holds it (WeChat `status`; Alipay's refund is done or not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundState {
    /// Accepted, money not moved yet (a bank-card refund may take days).
    Processing,
    /// Done: the money went back.
    Success,
    /// Closed without money moving (WeChat `CLOSED`): final.
    Closed,
    /// Stuck at the provider until someone acts in its merchant platform (WeChat
    /// `ABNORMAL`): not final, money may still move.
    Abnormal,
}

/// One refund to send: the order's own payment, this refund's number and amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundCall {
    pub out_trade_no: String,
    /// The payment's provider id (WeChat `transaction_id`, Alipay `trade_no`).
    pub transaction_id: String,
    /// The idempotency key at the provider (WeChat `out_refund_no`, Alipay `out_request_no`).
    pub out_refund_no: String,
    pub amount_fen: i64,
    /// The payment's amount (WeChat `amount.total`).
    pub total_fen: i64,
    pub reason: Option<String>,
}

/// A provider's answer to "refund this".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundReply {
    /// The provider holds the refund under this number (created now, or before: both
    /// providers deduplicate on it). `notice` when it is done and the signed answer carries
    /// every field its notification's business content covers.
    Accepted {
        state: RefundState,
        refund_id: Option<String>,
        notice: Option<Box<Notice>>,
    },
    /// The provider refused in so many words (insufficient balance, not refundable, …):
    /// nothing was created under this number. Its documented `code` and message.
    Refused { code: String, message: String },
    /// No usable answer: the refund may or may not exist; send it again.
    Failed(Failure),
}

impl RefundReply {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted { .. } => "accepted",
            Self::Refused { .. } => "refused",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A provider's answer to "pay this user" (a merchant transfer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferReply {
    /// The provider holds a bill under this `out_bill_no` (created now, or before: both
    /// providers deduplicate on it): what its signed answer says.
    Accepted(Box<TransferSeen>),
    /// The provider refused in its documented words (WeChat `NOT_ENOUGH`, Alipay
    /// `PAYEE_NOT_EXIST`): nothing was created, unless a query finds the bill after all.
    Refused { code: String, message: String },
    /// No usable answer: the transfer may or may not exist; send it again, never under
    /// another number.
    Failed(Failure),
}

impl TransferReply {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted(_) => "accepted",
            Self::Refused { .. } => "refused",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A provider's answer to "what became of this transfer?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferAnswer {
    /// A signed answer about the bill.
    Found(Box<TransferSeen>),
    /// The provider has no bill under this number.
    NotFound,
    Failed(Failure),
}

impl TransferAnswer {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Found(_) => "found",
            Self::NotFound => "not_found",
            Self::Failed(f) => f.label(),
        }
    }
}

/// A provider's answer to "cancel this transfer" (WeChat only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelReply {
    /// Accepted (`CANCELING`): the final `CANCELLED` comes by query or notification.
    Canceling(Box<TransferSeen>),
    /// Refused in so many words (the user confirmed meanwhile): its code.
    Refused {
        code: String,
        message: String,
    },
    NotFound,
    Failed(Failure),
}

impl CancelReply {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Canceling(_) => "canceling",
            Self::Refused { .. } => "refused",
            Self::NotFound => "not_found",
            Self::Failed(f) => f.label(),
        }
    }
}

/// One provider's API client: every merchant/app of that provider with API credentials.
/// `account` is a WeChat `mchid` or an Alipay `app_id`; `now` stamps the request and decides
/// whether a signed answer is fresh.
pub trait ProviderApi: Send + Sync + 'static {
    fn channel(&self) -> ChannelId;

    /// The merchants/apps this client can ask now, file accounts first in configuration
    /// order.
    fn accounts(&self) -> Vec<String>;

    /// Whether any account can be asked now (accounts come and go through
    /// `/admin/merchants`).
    fn has_accounts(&self) -> bool {
        !self.accounts().is_empty()
    }

    fn query<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, TradeAnswer>;

    fn close<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CloseAnswer>;

    /// Asks about combined payment `combine_out_trade_no` of `account`, the combination's
    /// merchant (WeChat `combine_mchid`). A provider without combined payments answers
    /// [`Failure::Unexpected`] without asking.
    fn combine_query<'a>(
        &'a self,
        account: &'a str,
        combine_out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CombineAnswer>;

    /// Closes combined payment `combine_out_trade_no` of `account` whole: `subs` are its
    /// sub-orders as recorded, `(mchid, out_trade_no)` each, every one of them (WeChat
    /// closes a combination only when they are exactly those of the create).
    fn combine_close<'a>(
        &'a self,
        account: &'a str,
        combine_out_trade_no: &'a str,
        combine_appid: &'a str,
        subs: &'a [(String, String)],
        now: Timestamp,
    ) -> ApiFuture<'a, CloseAnswer>;

    fn refund_query<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        out_refund_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, RefundAnswer>;

    /// Sends `call`; sending the same call again is safe (the provider deduplicates on its
    /// refund number), and is what a [`RefundReply::Failed`] asks for.
    fn refund<'a>(
        &'a self,
        account: &'a str,
        call: &'a RefundCall,
        now: Timestamp,
    ) -> ApiFuture<'a, RefundReply>;

    /// Whether `account` may send transfers, and the apps its payees belong to (WeChat's
    /// `appid`s; none for Alipay): `Err` says why it cannot (an Alipay app in public-key
    /// mode: fund-out APIs take certificate mode only).
    fn transfer_apps(&self, account: &str) -> Result<Vec<String>, String>;

    /// Sends `call`; sending the same call again is safe (the provider deduplicates on
    /// `out_bill_no`), and is what a [`TransferReply::Failed`] asks for.
    fn transfer<'a>(
        &'a self,
        account: &'a str,
        call: &'a TransferCall,
        now: Timestamp,
    ) -> ApiFuture<'a, TransferReply>;

    fn transfer_query<'a>(
        &'a self,
        account: &'a str,
        out_bill_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, TransferAnswer>;

    fn transfer_cancel<'a>(
        &'a self,
        account: &'a str,
        out_bill_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CancelReply>;
}

/// Why a call says nothing about the trade itself: the provider has no such trade (or refund),
/// or there is no usable answer. Every answer has both, so a client's steps can stop at either
/// with `?`, and [`ProviderApi`] turns it into that answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    NotFound,
    Failed(Failure),
}

impl From<Failure> for Miss {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

impl From<Miss> for TradeAnswer {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::NotFound,
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

impl From<Miss> for CombineAnswer {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::NotFound,
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

impl From<Miss> for CloseAnswer {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::NotFound,
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

/// A refund of a trade the provider does not have: refused, nothing created.
impl From<Miss> for RefundReply {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::Refused {
                code: "NOT_FOUND".into(),
                message: "the provider has no such trade".into(),
            },
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

/// A transfer to an account without credentials, or refused before it reached the
/// provider's books: nothing created.
impl From<Miss> for TransferReply {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::Refused {
                code: "NOT_FOUND".into(),
                message: "the provider has no such account".into(),
            },
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

impl From<Miss> for TransferAnswer {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::NotFound,
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

impl From<Miss> for CancelReply {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::NotFound,
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

impl From<Miss> for RefundAnswer {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::NotFound => Self::NotFound,
            Miss::Failed(f) => Self::Failed(f),
        }
    }
}

/// A provider's API client as each provider writes it: plain async calls about one account
/// it has credentials for, that may stop at a [`Miss`]. Every such client is a
/// [`ProviderApi`]: the account is looked up and the call boxed in one place.
pub trait ProviderClient: Send + Sync + 'static {
    type Account: Account;
    const CHANNEL: ChannelId;

    fn accounts(&self) -> &Accounts<Self::Account>;

    fn query(
        &self,
        account: &Self::Account,
        out_trade_no: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<TradeAnswer, Miss>> + Send;

    fn close(
        &self,
        account: &Self::Account,
        out_trade_no: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<CloseAnswer, Miss>> + Send;

    /// [`ProviderApi::combine_query`]; a provider without combined payments keeps this
    /// answer, given without asking.
    fn combine_query(
        &self,
        _account: &Self::Account,
        _combine_out_trade_no: &str,
        _now: Timestamp,
    ) -> impl Future<Output = Result<CombineAnswer, Miss>> + Send {
        std::future::ready(Err(no_combine_api(Self::CHANNEL)))
    }

    /// [`ProviderApi::combine_close`]; a provider without combined payments keeps this
    /// answer, given without asking.
    fn combine_close(
        &self,
        _account: &Self::Account,
        _combine_out_trade_no: &str,
        _combine_appid: &str,
        _subs: &[(String, String)],
        _now: Timestamp,
    ) -> impl Future<Output = Result<CloseAnswer, Miss>> + Send {
        std::future::ready(Err(no_combine_api(Self::CHANNEL)))
    }

    fn refund_query(
        &self,
        account: &Self::Account,
        out_trade_no: &str,
        out_refund_no: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<RefundAnswer, Miss>> + Send;

    fn refund(
        &self,
        account: &Self::Account,
        call: &RefundCall,
        now: Timestamp,
    ) -> impl Future<Output = Result<RefundReply, Miss>> + Send;

    /// [`ProviderApi::transfer_apps`] for one account with credentials.
    fn transfer_apps(&self, account: &Self::Account) -> Result<Vec<String>, String>;

    fn transfer(
        &self,
        account: &Self::Account,
        call: &TransferCall,
        now: Timestamp,
    ) -> impl Future<Output = Result<TransferReply, Miss>> + Send;

    fn transfer_query(
        &self,
        account: &Self::Account,
        out_bill_no: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<TransferAnswer, Miss>> + Send;

    fn transfer_cancel(
        &self,
        account: &Self::Account,
        out_bill_no: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<CancelReply, Miss>> + Send;
}

/// The answer of a provider without a combine API. Alipay's merged payment (合并支付) is one
/// ordinary trade per sub-order, each asked about on its own.
fn no_combine_api(channel: ChannelId) -> Miss {
    Miss::Failed(Failure::Unexpected(format!(
        "{channel} has no combine API: each sub-order is an ordinary trade, asked about on its own"
    )))
}

/// One [`ProviderApi`] call of a [`ProviderClient`]: they differ only in their name, the
/// ids after the account and their answer.
/// Looks the account `$id` up and makes the call with it (bound to `$a`): the call's answer,
/// or the answer its miss stands for. The account is the snapshot's `Arc`, held for the call.
macro_rules! with_account {
    ($client:expr, $id:expr, |$a:ident| $call:expr) => {
        Box::pin(async move {
            let answer = match ProviderClient::accounts($client).get($id) {
                Ok(account) => {
                    let $a = &*account;
                    $call.await
                }
                Err(failure) => Err(failure.into()),
            };
            answer.unwrap_or_else(From::from)
        })
    };
}

macro_rules! forward {
    ($call:ident($($id:ident),+) -> $answer:ty) => {
        fn $call<'a>(
            &'a self,
            account: &'a str,
            $($id: &'a str,)+
            now: Timestamp,
        ) -> ApiFuture<'a, $answer> {
            with_account!(self, account, |a| ProviderClient::$call(self, a, $($id,)+ now))
        }
    };
}

impl<C: ProviderClient> ProviderApi for C {
    fn channel(&self) -> ChannelId {
        C::CHANNEL
    }

    fn accounts(&self) -> Vec<String> {
        ProviderClient::accounts(self).ids()
    }

    fn has_accounts(&self) -> bool {
        !ProviderClient::accounts(self).is_empty()
    }

    forward!(query(out_trade_no) -> TradeAnswer);
    forward!(close(out_trade_no) -> CloseAnswer);
    forward!(combine_query(combine_out_trade_no) -> CombineAnswer);
    forward!(refund_query(out_trade_no, out_refund_no) -> RefundAnswer);
    forward!(transfer_query(out_bill_no) -> TransferAnswer);
    forward!(transfer_cancel(out_bill_no) -> CancelReply);

    fn transfer_apps(&self, account: &str) -> Result<Vec<String>, String> {
        match ProviderClient::accounts(self).get(account) {
            Ok(a) => ProviderClient::transfer_apps(self, &a),
            Err(failure) => Err(failure.detail().to_owned()),
        }
    }

    fn transfer<'a>(
        &'a self,
        account: &'a str,
        call: &'a TransferCall,
        now: Timestamp,
    ) -> ApiFuture<'a, TransferReply> {
        with_account!(self, account, |a| ProviderClient::transfer(
            self, a, call, now
        ))
    }

    fn combine_close<'a>(
        &'a self,
        account: &'a str,
        combine_out_trade_no: &'a str,
        combine_appid: &'a str,
        subs: &'a [(String, String)],
        now: Timestamp,
    ) -> ApiFuture<'a, CloseAnswer> {
        with_account!(self, account, |a| ProviderClient::combine_close(
            self,
            a,
            combine_out_trade_no,
            combine_appid,
            subs,
            now
        ))
    }

    fn refund<'a>(
        &'a self,
        account: &'a str,
        call: &'a RefundCall,
        now: Timestamp,
    ) -> ApiFuture<'a, RefundReply> {
        with_account!(self, account, |a| ProviderClient::refund(
            self, a, call, now
        ))
    }
}
