//! Counters operators alert on, registered in one Prometheus registry.

use prometheus::{IntCounterVec, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    /// Verified notifications by channel and ledger outcome (`applied`, `duplicate`,
    /// `conflict`, `anomaly`, `ignored`, `unknown_order`, `too_early`, `db_unavailable`).
    pub notifications: IntCounterVec,
    /// Notifications refused before the ledger, by channel and reason (`bad_signature`,
    /// `stale`, `bad_request`, `undecryptable`, `too_large`).
    pub rejections: IntCounterVec,
    /// Anomalies by channel and reason (`AMOUNT_MISMATCH`, …).
    pub anomalies: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| unreachable!("static metric definition {name}: {e}"));
            registry
                .register(Box::new(c.clone()))
                .unwrap_or_else(|e| unreachable!("metric {name} registered twice: {e}"));
            c
        };
        let notifications = counter(
            "paynotify_notifications_total",
            "Verified notifications by channel and ledger outcome",
            &["channel", "outcome"],
        );
        let rejections = counter(
            "paynotify_notify_rejections_total",
            "Notifications refused before the ledger, by channel and reason",
            &["channel", "reason"],
        );
        let anomalies = counter(
            "paynotify_anomalies_total",
            "Payments recorded as PAYMENT_ANOMALY, by channel and reason",
            &["channel", "reason"],
        );
        Self {
            registry,
            notifications,
            rejections,
            anomalies,
        }
    }

    /// The current value of one counter, for tests and logs.
    pub fn count(vec: &IntCounterVec, labels: &[&str]) -> u64 {
        vec.get_metric_with_label_values(labels)
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
