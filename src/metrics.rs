//! Counters operators alert on, registered in one Prometheus registry.
//!
//! Every label value comes from a type here ([`Counted`], [`Refusal`], [`GateResult`], a
//! route pattern, a standard method), never from a string at a call site or from a client.

use std::time::Instant;

use actix_web::dev::ServiceRequest;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::notice::{ChannelId, Outcome};

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

/// A started request: [`RequestTimer::observe`] records its latency under fixed labels.
pub struct RequestTimer {
    histogram: Histogram,
    started: Instant,
}

impl RequestTimer {
    pub fn observe(self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

pub struct Metrics {
    pub registry: Registry,
    /// Verified notifications by channel and [`Counted`] outcome.
    pub notifications: IntCounterVec,
    /// Notifications refused before the ledger, by channel and [`Refusal`].
    pub rejections: IntCounterVec,
    /// Anomalies by channel and reason (`AMOUNT_MISMATCH`, …).
    pub anomalies: IntCounterVec,
    /// The Redis gate by [`GateResult`].
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
    /// What `GET /readyz` checks, at every scrape: 1 when the database answered, else 0.
    pub database_up: IntGauge,
    /// MariaDB/MySQL semi-sync on the primary, at every scrape: 1 on, 0 fell back to
    /// asynchronous replication, -1 not enabled or not MySQL.
    pub database_semi_sync_active: IntGauge,
    /// 1 when the relay sink can take events, else 0 (the outbox keeps them meanwhile).
    pub sink_up: IntGauge,
    /// The gate's calls for notices (one before the ledger; one after it, or after a cached
    /// answer to give back the marker taken with it), and the round trips that carried them.
    pub gate_calls: IntCounter,
    pub gate_round_trips: IntCounter,
    /// Receipts by [`ReceiptResult`].
    pub receipts: IntCounterVec,
    /// Calls to a provider's API by channel, [`ProviderCall`] and the answer's label
    /// (`paid`, `unpaid`, `closed`, `not_found`, `not_closable`, `unreachable`,
    /// `bad_signature`, `unexpected`, …).
    pub provider_calls: IntCounterVec,
    /// Payments applied from a provider's answer: notifications that never came.
    pub payments_recovered: IntCounterVec,
    /// Refunds started through paynotify, by channel; and their final statuses by result.
    pub refunds_started: IntCounterVec,
    pub refunds_final: IntCounterVec,
    /// What became of expired orders, by [`ExpiryResult`].
    pub expiry: IntCounterVec,
    /// Changes of the database's writer noticed; orders rechecked after them, by result
    /// (`reconcile/failover.rs`); acknowledged orders forgotten before any failover came.
    pub database_failovers: IntCounter,
    pub failover_rechecks: IntCounterVec,
    pub failover_recheck_forgotten: IntCounter,
    /// Payment groups applied together (group apply), and the payments they carried.
    pub ledger_groups: IntCounter,
    pub ledger_group_payments: IntCounter,
    /// Groups that failed as a whole; their payments were applied one by one.
    pub ledger_group_failures: IntCounter,
    /// Each platform key's expiry (unix seconds) by channel, merchant and serial: `+Inf` for a
    /// public key, which does not expire. Its serials are those of verified certificates.
    pub certificate_expiry: GaugeVec,
    /// Platform-certificate downloads by channel and [`RefreshResult`].
    pub certificate_refresh: IntCounterVec,
    /// Bill reports by channel and result (`balanced`, `mismatched`, `unavailable`).
    pub bill_runs: IntCounterVec,
    /// Differences the bill reports found, by channel and item type (`MISSING_HERE`, …).
    pub bill_items: IntCounterVec,
}

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
    RefundQuery,
    Refund,
}

impl ProviderCall {
    pub fn label(self) -> &'static str {
        match self {
            Self::Query => "query",
            Self::Close => "close",
            Self::RefundQuery => "refund_query",
            Self::Refund => "refund",
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
        let certificate_expiry = register(
            &registry,
            GaugeVec::new(
                Opts::new(
                    "paynotify_certificate_expiry_timestamp_seconds",
                    "When each platform key stops being used (unix seconds; +Inf: a public key)",
                ),
                &["channel", "mchid", "serial"],
            )
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
        );
        let certificate_refresh = counter(
            "paynotify_certificate_refresh_total",
            "Platform-certificate downloads, and certificates refused, by channel and result",
            &["channel", "result"],
        );
        let bill_runs = counter(
            "paynotify_bill_runs_total",
            "Daily bill reports (one per date, channel and account compared) by channel and result",
            &["channel", "result"],
        );
        let bill_items = counter(
            "paynotify_bill_items_total",
            "Differences between a provider's bill and the ledger, by channel and type",
            &["channel", "type"],
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
        let database_up = gauge(
            "paynotify_database_up",
            "1 when the database answered at this scrape (as GET /readyz asks it), else 0",
        );
        let database_semi_sync_active = gauge(
            "paynotify_database_semi_sync_active",
            "MariaDB/MySQL semi-sync replication: 1 on, 0 fell back to async, -1 not enabled",
        );
        let sink_up = gauge(
            "paynotify_sink_up",
            "1 when the relay sink can take events now, else 0",
        );
        let gate_calls = single(
            "paynotify_gate_calls_total",
            "Redis gate calls for notices: before the ledger, and after it",
        );
        let gate_round_trips = single(
            "paynotify_gate_round_trips_total",
            "Round trips to Redis that carried those calls (many notices' each)",
        );
        let receipts = counter(
            "paynotify_receipts_total",
            "Notify receipts written to notify_receipt, dropped (queue full, database away), limited (anonymous over budget or repeated) or refused by the database",
            &["result"],
        );
        let provider_calls = counter(
            "paynotify_provider_calls_total",
            "Calls to a provider's API (query, close, refund_query, refund) by channel and answer",
            &["channel", "call", "result"],
        );
        let refunds_started = counter(
            "paynotify_refunds_started_total",
            "Refunds recorded and sent through POST /orders/{no}/refunds, by channel",
            &["channel"],
        );
        let refunds_final = counter(
            "paynotify_refunds_final_total",
            "Refunds started through paynotify that a provider's answer made final: success, closed, refused",
            &["channel", "result"],
        );
        let payments_recovered = counter(
            "paynotify_payments_recovered_total",
            "Payments applied from a provider's signed answer: notifications that never came",
            &["channel"],
        );
        let expiry = counter(
            "paynotify_expiry_total",
            "Expired unpaid orders by what became of them",
            &["result"],
        );
        let failover_rechecks = counter(
            "paynotify_failover_rechecks_total",
            "Orders acknowledged shortly before a database failover, checked against the new writer and the provider, by result",
            &["result"],
        );
        let plain_counter = |name: &str, help: &str| {
            register(
                &registry,
                IntCounter::new(name, help)
                    .unwrap_or_else(|e| unreachable!("static metric definition {name}: {e}")),
            )
        };
        let ledger_groups = plain_counter(
            "paynotify_ledger_groups_total",
            "Groups of payments applied together in one transaction",
        );
        let ledger_group_payments = plain_counter(
            "paynotify_ledger_group_payments_total",
            "Payments carried by those groups (decided there or passed on to the full transaction)",
        );
        let ledger_group_failures = plain_counter(
            "paynotify_ledger_group_failures_total",
            "Groups that failed as a whole (a deadlock, a statement error); their payments were applied one by one",
        );
        let database_failovers = plain_counter(
            "paynotify_database_failovers_total",
            "Changes of the database's writer (system identifier, timeline, server uuid) noticed",
        );
        let failover_recheck_forgotten = plain_counter(
            "paynotify_failover_recheck_forgotten_total",
            "Acknowledged orders forgotten before database.failover_recheck_secs passed (too many remembered)",
        );
        Self {
            registry,
            database_failovers,
            failover_rechecks,
            failover_recheck_forgotten,
            ledger_groups,
            ledger_group_payments,
            ledger_group_failures,
            receipts,
            certificate_expiry,
            certificate_refresh,
            bill_runs,
            bill_items,
            provider_calls,
            payments_recovered,
            refunds_started,
            refunds_final,
            expiry,
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
            database_up,
            database_semi_sync_active,
            sink_up,
            gate_calls,
            gate_round_trips,
        }
    }

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

    /// Counts `n` receipts written or dropped.
    pub fn receipts(&self, result: ReceiptResult, n: usize) {
        self.receipts
            .with_label_values(&[result.label()])
            .inc_by(n as u64);
    }

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

    pub fn payment_recovered(&self, channel: ChannelId) {
        self.payments_recovered
            .with_label_values(&[channel.as_str()])
            .inc();
    }

    pub fn expired(&self, result: ExpiryResult) {
        self.expiry.with_label_values(&[result.label()]).inc();
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

    /// Starts timing a request, labelled by its route pattern (or `unmatched`) and method
    /// (a standard one, else `other`): never by anything the client chose.
    pub fn time_request(&self, req: &ServiceRequest) -> RequestTimer {
        let route = req.match_pattern();
        let route = route.as_deref().unwrap_or(ROUTE_UNMATCHED);
        RequestTimer {
            histogram: self
                .request_seconds
                .with_label_values(&[route, method_label(req.method())]),
            started: Instant::now(),
        }
    }

    /// The outbox gauges, from what the database reported: messages pending and dead, and
    /// how long the oldest pending one has waited.
    pub fn outbox(&self, pending: i64, dead: i64, oldest_pending_secs: i64) {
        self.relay_pending.set(pending);
        self.relay_dead.set(dead);
        self.relay_oldest_pending_seconds
            .set(oldest_pending_secs.max(0));
    }

    /// The pool gauges: connections in use, idle, and callers waiting for one.
    pub fn pool(&self, (in_use, idle, waiting): (usize, usize, usize)) {
        for (label, value) in [("in_use", in_use), ("idle", idle), ("waiting", waiting)] {
            self.db_pool
                .with_label_values(&[label])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// Group apply since start-up (`Store::group_stats`): groups, the payments they carried,
    /// and groups that failed as a whole.
    pub fn groups(&self, groups: u64, payments: u64, failed: u64) {
        // Two scrapes at once must not both add the same difference.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (counter, total) in [
            (&self.ledger_groups, groups),
            (&self.ledger_group_payments, payments),
            (&self.ledger_group_failures, failed),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
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
