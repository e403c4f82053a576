//! The notify path's labels: what became of a verified notification, why one was refused,
//! what the Redis gate did, and what became of a receipt.

use crate::notice::{ChannelId, Outcome};

use super::Metrics;

/// What became of a verified notification: the `outcome` label of
/// `paynotify_notifications_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// What the ledger did (`applied`, `duplicate`, `conflict`, `anomaly`, …).
    Ledger(Outcome),
    /// Answered from the Redis gate's cached result.
    DuplicateCached,
    /// The same notification was being applied elsewhere (503).
    InFlight,
    /// No database connection in time (503).
    DbUnavailable,
    /// Handed to a group that did not answer in time and may still commit (503).
    Undecided,
    /// A statement failed (500).
    DbError,
}

impl Counted {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ledger(outcome) => outcome.as_str(),
            Self::DuplicateCached => "duplicate_cached",
            Self::InFlight => "in_flight",
            Self::DbUnavailable => "db_unavailable",
            Self::Undecided => "undecided",
            Self::DbError => "db_error",
        }
    }
}

/// Why a notification was refused before the ledger: the `reason` label of
/// `paynotify_notify_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    BadSignature,
    /// The key named is not known (a rotation not yet downloaded, or not configured).
    UnknownSerial,
    Stale,
    /// Verified, for an account not enabled here (a sub-merchant not registered).
    UnknownMerchant,
    BadRequest,
    /// A signed notification of a kind another of the provider's notify routes takes.
    WrongEventType,
    Undecryptable,
    TooLarge,
    /// The body did not arrive within `server.body_timeout_ms`.
    BodyTimeout,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Self::BadSignature => "bad_signature",
            Self::UnknownSerial => "unknown_serial",
            Self::Stale => "stale",
            Self::UnknownMerchant => "unknown_merchant",
            Self::BadRequest => "bad_request",
            Self::WrongEventType => "wrong_event_type",
            Self::Undecryptable => "undecryptable",
            Self::TooLarge => "too_large",
            Self::BodyTimeout => "body_timeout",
        }
    }
}

/// What the Redis gate did: the `result` label of `paynotify_gate_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateResult {
    /// Answered from this instance's recent final answers, without Redis.
    HitLocal,
    Hit,
    HitAfterWait,
    Busy,
    BypassError,
    BypassTimeout,
    BypassBreakerOpen,
}

impl GateResult {
    pub fn label(self) -> &'static str {
        match self {
            Self::HitLocal => "hit_local",
            Self::Hit => "hit",
            Self::HitAfterWait => "hit_after_wait",
            Self::Busy => "busy",
            Self::BypassError => "bypass_error",
            Self::BypassTimeout => "bypass_timeout",
            Self::BypassBreakerOpen => "bypass_breaker_open",
        }
    }
}

/// What became of a receipt: the `result` label of `paynotify_receipts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptResult {
    /// Stored in `notify_receipt`.
    Written,
    /// Not stored: the writer's queue was full, or the database was out of reach.
    Dropped,
    /// Not stored: an anonymous request over `receipts.anonymous_bytes_per_minute` or
    /// `anonymous_per_peer_per_minute`, or the same body as one kept this minute.
    Limited,
    /// Not stored: the database refused this one receipt (the rest of its batch was stored).
    Refused,
}

impl ReceiptResult {
    pub fn label(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Dropped => "dropped",
            Self::Limited => "limited",
            Self::Refused => "refused",
        }
    }
}

impl Metrics {
    /// Counts a verified notification (and, for an anomaly, its reason).
    pub fn notified(&self, channel: ChannelId, counted: Counted) {
        self.notifications
            .with_label_values(&[channel.as_str(), counted.label()])
            .inc();
        if let Counted::Ledger(Outcome::Anomaly(reason)) = counted {
            self.anomalies
                .with_label_values(&[channel.as_str(), reason.as_str()])
                .inc();
        }
    }

    /// Counts a verified transfer notification; its anomaly goes to
    /// `paynotify_transfer_anomalies_total`, not the payments' (an `AMOUNT_MISMATCH` of a
    /// transfer is money out, not in).
    pub fn transfer_notified(&self, channel: ChannelId, counted: Counted) {
        self.notifications
            .with_label_values(&[channel.as_str(), counted.label()])
            .inc();
        if let Counted::Ledger(Outcome::Anomaly(reason)) = counted {
            self.transfer_anomaly(channel, reason);
        }
    }

    /// Counts a notification refused before the ledger.
    pub fn refused(&self, channel: ChannelId, why: Refusal) {
        self.rejections
            .with_label_values(&[channel.as_str(), why.label()])
            .inc();
    }

    pub fn gate_result(&self, result: GateResult) {
        self.gate_results(result, 1);
    }

    /// Counts `n` gate calls with the same result (one round trip carries many).
    pub fn gate_results(&self, result: GateResult, n: u64) {
        self.gate.with_label_values(&[result.label()]).inc_by(n);
    }

    /// Counts `n` receipts written or dropped.
    pub fn receipts(&self, result: ReceiptResult, n: usize) {
        self.receipts
            .with_label_values(&[result.label()])
            .inc_by(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::AnomalyReason;

    #[test]
    fn a_transfer_anomaly_is_counted_apart_from_the_payments() {
        let m = Metrics::new();
        let anomaly = Counted::Ledger(Outcome::Anomaly(AnomalyReason::AmountMismatch));
        m.notified(ChannelId::Wechat, anomaly);
        m.transfer_notified(ChannelId::Wechat, anomaly);
        m.transfer_notified(
            ChannelId::Alipay,
            Counted::Ledger(Outcome::Anomaly(AnomalyReason::UnknownTransfer)),
        );
        let payments = |c: &str, r: &str| Metrics::count(&m.anomalies, &[c, r]);
        let transfers = |c: &str, r: &str| Metrics::count(&m.transfer_anomalies, &[c, r]);
        assert_eq!(payments("wechat", "AMOUNT_MISMATCH"), 1);
        assert_eq!(transfers("wechat", "AMOUNT_MISMATCH"), 1);
        assert_eq!(transfers("alipay", "UNKNOWN_TRANSFER"), 1);
        assert_eq!(payments("alipay", "UNKNOWN_TRANSFER"), 0);
        assert_eq!(Metrics::count(&m.notifications, &["wechat", "anomaly"]), 2);
    }
}
