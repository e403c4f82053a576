//! Calls to a provider's API and the jobs built on them: queries, closes, refunds,
//! certificate downloads, bill reports and the expiry job.

use crate::notice::{AnomalyReason, ChannelId};
use crate::transfer::TransferStatus;

use super::Metrics;

/// What one download of a merchant's platform certificates came to (`result` label), or
/// one certificate it carried that was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshResult {
    /// The answer verified; its good certificates are in use.
    Ok,
    /// No answer (connection refused, timeout, 5xx).
    Unreachable,
    /// The answer did not verify, or named a key neither known nor carried.
    BadSignature,
    /// A verified answer this client cannot use, or an error answer.
    Unexpected,
    /// One certificate of a verified answer failed a check (another APIv3 key, tampered,
    /// its serial not the one listed, expired, not RSA): not used.
    RefusedCertificate,
}

impl RefreshResult {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Unreachable => "unreachable",
            Self::BadSignature => "bad_signature",
            Self::Unexpected => "unexpected",
            Self::RefusedCertificate => "refused_certificate",
        }
    }
}

/// Which provider API call (`call` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderCall {
    Query,
    Close,
    /// WeChat's combine query (合单查询): one call for every sub-order of a combination.
    CombineQuery,
    /// WeChat's combine close (关闭合单订单): the combination closed whole.
    CombineClose,
    RefundQuery,
    Refund,
    Transfer,
    TransferQuery,
    TransferCancel,
}

impl ProviderCall {
    pub fn label(self) -> &'static str {
        match self {
            Self::Query => "query",
            Self::Close => "close",
            Self::CombineQuery => "combine_query",
            Self::CombineClose => "combine_close",
            Self::RefundQuery => "refund_query",
            Self::Refund => "refund",
            Self::Transfer => "transfer",
            Self::TransferQuery => "transfer_query",
            Self::TransferCancel => "transfer_cancel",
        }
    }
}

/// What the expiry job did with one order (`result` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryResult {
    /// Closed at every provider asked (or never created there), then here.
    ClosedAtProvider,
    /// No provider to ask: closed here, as before.
    ClosedLocally,
    /// A provider said it was paid: the payment was applied instead.
    Paid,
    /// A provider could not be reached: left unpaid, retried later.
    Retried,
    /// A provider could not be reached within `reconcile.close_grace_secs`: closed here anyway.
    ClosedAfterGrace,
    /// A provider had no trade for the order until `reconcile.close_grace_secs` past
    /// `expire_at` (the trade was never created, and no longer can be): closed here.
    ClosedNotFound,
}

impl ExpiryResult {
    pub fn label(self) -> &'static str {
        match self {
            Self::ClosedAtProvider => "closed_at_provider",
            Self::ClosedLocally => "closed_locally",
            Self::Paid => "paid",
            Self::Retried => "retried",
            Self::ClosedAfterGrace => "closed_after_grace",
            Self::ClosedNotFound => "closed_not_found",
        }
    }
}

impl Metrics {
    /// Counts one call to a provider's API and its answer.
    pub fn provider_call(&self, channel: ChannelId, call: ProviderCall, result: &'static str) {
        self.provider_calls
            .with_label_values(&[channel.as_str(), call.label(), result])
            .inc();
    }

    /// Counts one download of platform certificates, or one certificate refused.
    pub fn certificate_refreshed(&self, channel: ChannelId, result: RefreshResult) {
        self.certificate_refresh
            .with_label_values(&[channel.as_str(), result.label()])
            .inc();
    }

    /// Counts one bill report by its status (`balanced`, `mismatched`, `unavailable`).
    pub fn bill_run(&self, channel: ChannelId, result: &'static str) {
        self.bill_runs
            .with_label_values(&[channel.as_str(), result])
            .inc();
    }

    /// Counts one difference a bill report found, by its type.
    pub fn bill_item(&self, channel: ChannelId, kind: &'static str) {
        self.bill_items
            .with_label_values(&[channel.as_str(), kind])
            .inc();
    }

    /// Counts a refund recorded and sent through `POST /orders/{no}/refunds`.
    pub fn refund_started(&self, channel: &str) {
        self.refunds_started.with_label_values(&[channel]).inc();
    }

    /// Counts a refund request's final status as its provider's answer brought it
    /// (`success`, `closed`, `refused`).
    pub fn refund_final(&self, channel: &str, result: &'static str) {
        self.refunds_final
            .with_label_values(&[channel, result])
            .inc();
    }

    /// Counts a transfer recorded and sent through `POST /transfers`.
    pub fn transfer_started(&self, channel: ChannelId) {
        self.transfers_started
            .with_label_values(&[channel.as_str()])
            .inc();
    }

    /// Counts a transfer's final status as its provider's answer brought it (`success`,
    /// `fail`, `cancelled`).
    pub fn transfer_final(&self, channel: ChannelId, result: &'static str) {
        self.transfers_final
            .with_label_values(&[channel.as_str(), result])
            .inc();
    }

    /// Starts `channel`'s transfer-anomaly series at 0 for every reason a transfer can have:
    /// a series born at 1 shows no `increase()`, and the first `UNKNOWN_TRANSFER` must alert.
    pub fn transfer_anomalies_from_zero(&self, channel: ChannelId) {
        for reason in [
            AnomalyReason::UnknownTransfer,
            AnomalyReason::AmountMismatch,
            AnomalyReason::MerchantMismatch,
        ] {
            self.transfer_anomalies
                .with_label_values(&[channel.as_str(), reason.as_str()])
                .inc_by(0);
        }
    }

    /// Counts a `TRANSFER_ANOMALY` raised, from a notification or a signed answer.
    pub fn transfer_anomaly(&self, channel: ChannelId, reason: AnomalyReason) {
        self.transfer_anomalies
            .with_label_values(&[channel.as_str(), reason.as_str()])
            .inc();
    }

    /// Sets how long the oldest transfer of `channel` in `status` (not final) has waited:
    /// `seconds`, 0 when there is none.
    pub fn transfers_open_oldest(&self, channel: ChannelId, status: TransferStatus, seconds: i64) {
        self.transfers_open_oldest_seconds
            .with_label_values(&[channel.as_str(), status.as_str()])
            .set(seconds);
    }

    pub fn payment_recovered(&self, channel: ChannelId) {
        self.payments_recovered
            .with_label_values(&[channel.as_str()])
            .inc();
    }

    pub fn expired(&self, result: ExpiryResult) {
        self.expiry.with_label_values(&[result.label()]).inc();
    }
}
