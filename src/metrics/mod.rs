//! Counters operators alert on, registered in one Prometheus registry.
//!
//! Every label value comes from a type here ([`Counted`], [`Refusal`], [`GateResult`], a
//! route pattern, a standard method), never from a string at a call site or from a client.
//! Each family keeps its label types and recording methods in its own file: `notify`
//! (notifications, gate, receipts), `provider` (provider calls and the jobs built on them),
//! `relay` (outbox, pool and group gauges) and `http` (request latency).

mod http;
mod notify;
mod provider;
mod relay;

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

pub use http::{ROUTE_UNMATCHED, RequestTimer, method_label};
pub use notify::{Counted, GateResult, ReceiptResult, Refusal};
pub use provider::{ExpiryResult, ProviderCall, RefreshResult};

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
    /// Transfers started through paynotify, by channel; and their final statuses, as a
    /// provider's answer brought them, by result.
    pub transfers_started: IntCounterVec,
    pub transfers_final: IntCounterVec,
    /// `TRANSFER_ANOMALY` raised, by channel and reason (`UNKNOWN_TRANSFER`: money out that
    /// paynotify did not send), apart from the payments' [`Metrics::anomalies`].
    pub transfer_anomalies: IntCounterVec,
    /// How long the oldest transfer of each channel and not-final status has waited since it
    /// was recorded (0: none), as the transfer job last read it.
    pub transfers_open_oldest_seconds: IntGaugeVec,
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
    /// Provider accounts by channel, mode, source (`config`, `api`) and status.
    pub accounts: IntGaugeVec,
    /// Reloads of the stored accounts by result (`ok`, `failed`): `failed` when the database
    /// could not be read or a changed account did not open or build.
    pub account_reload: IntCounterVec,
    /// Seconds since this instance last read the stored accounts without error.
    pub account_reload_lag_seconds: IntGauge,
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
            "Calls to a provider's API (query, close, combine_query, combine_close, refund_query, refund, transfer, transfer_query, transfer_cancel) by channel and answer",
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
        let transfers_started = counter(
            "paynotify_transfers_started_total",
            "Transfers recorded and sent through POST /transfers, by channel",
            &["channel"],
        );
        let transfers_final = counter(
            "paynotify_transfers_final_total",
            "Transfers that a provider's answer made final: success, fail, cancelled (a notification counts in paynotify_notifications_total)",
            &["channel", "result"],
        );
        let transfer_anomalies = counter(
            "paynotify_transfer_anomalies_total",
            "Transfer notifications and answers recorded as TRANSFER_ANOMALY, by channel and reason (UNKNOWN_TRANSFER: money out paynotify did not send)",
            &["channel", "reason"],
        );
        let transfers_open_oldest_seconds = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "paynotify_transfers_open_oldest_seconds",
                    "Age of the oldest transfer not final, by channel and status (0: none), as the transfer job last read it",
                ),
                &["channel", "status"],
            )
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
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
        let accounts = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "paynotify_accounts",
                    "Provider accounts (WeChat merchants, Alipay apps) by channel, mode, source (config, api) and status",
                ),
                &["channel", "mode", "source", "status"],
            )
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
        );
        let account_reload = counter(
            "paynotify_account_reload_total",
            "Reloads of the accounts stored through /admin/merchants, by result (ok, failed)",
            &["result"],
        );
        let account_reload_lag_seconds = register(
            &registry,
            IntGauge::new(
                "paynotify_account_reload_lag_seconds",
                "Seconds since this instance last read the stored accounts without error",
            )
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
        );
        Self {
            registry,
            accounts,
            account_reload,
            account_reload_lag_seconds,
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
            transfers_started,
            transfers_final,
            transfer_anomalies,
            transfers_open_oldest_seconds,
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
