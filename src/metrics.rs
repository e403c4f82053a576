//! Counters operators alert on, registered in one Prometheus registry.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

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
    /// The Redis gate by result: `hit`, `hit_after_wait`, `busy`, `bypass_error`,
    /// `bypass_timeout`, `bypass_breaker_open`.
    pub gate: IntCounterVec,
    pub relay_published: IntCounter,
    pub relay_failed: IntCounter,
    pub relay_pending: IntGauge,
    pub relay_dead: IntGauge,
    pub relay_oldest_pending_seconds: IntGauge,
    /// Unix time (seconds) of the relay's last tick that reached the database without error;
    /// `time() - this` growing means the relay has stalled.
    pub relay_last_success_timestamp_seconds: IntGauge,
    /// Request latency by route pattern (or `unmatched`) and method (a standard one, else
    /// `other`): see [`method_label`].
    pub request_seconds: HistogramVec,
    /// Pool connections by state (`in_use`, `idle`) and callers `waiting` for one.
    pub db_pool: IntGaugeVec,
    /// 1 while the Redis gate's breaker is open (Redis bypassed), else 0.
    pub gate_breaker_open: IntGauge,
}

/// The `route` label of a request that matched no registered route.
pub const ROUTE_UNMATCHED: &str = "unmatched";

/// The `method` label: one of the nine standard methods, else `other`. A made-up method
/// (`FOO`, `get`, …) must never become a label value of its own.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .unwrap_or_else(|e| unreachable!("metric registered twice: {e}"));
    metric
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| unreachable!("static metric definition {name}: {e}"));
            register(&registry, c)
        };
        let single = |name: &str, help: &str| {
            let c = IntCounter::new(name, help)
                .unwrap_or_else(|e| unreachable!("static metric definition {name}: {e}"));
            register(&registry, c)
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help)
                .unwrap_or_else(|e| unreachable!("static metric definition {name}: {e}"));
            register(&registry, g)
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
        let gate = counter(
            "paynotify_gate_total",
            "Redis gate decisions and bypasses",
            &["result"],
        );
        let relay_published = single(
            "paynotify_relay_published_total",
            "Outbox messages delivered to the sink",
        );
        let relay_failed = single(
            "paynotify_relay_failed_total",
            "Outbox deliveries that failed and were scheduled again (or parked dead)",
        );
        let relay_pending = gauge(
            "paynotify_relay_pending",
            "Outbox messages not yet delivered",
        );
        let relay_dead = gauge(
            "paynotify_relay_dead",
            "Outbox messages parked after relay.max_attempts; redrive them",
        );
        let relay_oldest_pending_seconds = gauge(
            "paynotify_relay_oldest_pending_seconds",
            "Age of the oldest undelivered message (relay lag)",
        );
        let relay_last_success_timestamp_seconds = gauge(
            "paynotify_relay_last_success_timestamp_seconds",
            "Unix time of the relay's last tick that completed without error",
        );
        let request_seconds = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "paynotify_http_request_duration_seconds",
                    "HTTP request latency by route",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
                &["route", "method"],
            )
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
        );
        let db_pool = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "paynotify_db_pool_connections",
                    "Database pool connections by state",
                ),
                &["state"],
            )
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
        );
        let gate_breaker_open = gauge(
            "paynotify_gate_breaker_open",
            "1 while the Redis gate is bypassed after repeated failures",
        );
        Self {
            registry,
            notifications,
            rejections,
            anomalies,
            gate,
            relay_published,
            relay_failed,
            relay_pending,
            relay_dead,
            relay_oldest_pending_seconds,
            relay_last_success_timestamp_seconds,
            request_seconds,
            db_pool,
            gate_breaker_open,
        }
    }

    /// The current value of one counter, for tests and logs.
    pub fn count(vec: &IntCounterVec, labels: &[&str]) -> u64 {
        vec.get_metric_with_label_values(labels)
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::Method;

    #[test]
    fn only_standard_methods_become_labels() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::POST), "POST");
        for made_up in ["FOO", "get", "Post", "X-1", "PROPFIND"] {
            let method = Method::from_bytes(made_up.as_bytes()).expect("a valid token");
            assert_eq!(method_label(&method), "other", "{made_up}");
        }
    }
}
