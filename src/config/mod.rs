//! Loads and checks the configuration: one TOML file plus `PAYNOTIFY__SECTION__KEY` overrides.
//!
//! Every mistake is a start-up error that names the key; secrets never show in `Debug` output.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod db_hosts;
mod defaults;
mod durations;
mod env;
mod provider_api;
mod redis_target;
mod urls;
mod validate;
pub mod value;

pub use env::{ENV_PREFIX, env_var_key, unused_env_vars};
use env::{error_key, name_env_source};
pub use provider_api::{Deprecation, ProviderApiSettings};
pub use redis_target::{RedisTarget, Sentinels};
pub use urls::{DatabaseUrl, RedisNodes, check_amqp};
pub use value::{ConfigError, Secret, invalid};

/// The file used when neither `--config` nor `$PAYNOTIFY_CONFIG` names one.
pub const DEFAULT_CONFIG_FILE: &str = "config/default.toml";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    /// `[[wechat.merchants]]`: src/channel/wechat.
    pub wechat: crate::channel::wechat::settings::WechatSettings,
    /// `[[alipay.apps]]`: src/channel/alipay.
    pub alipay: crate::channel::alipay::settings::AlipaySettings,
    pub orders: OrderSettings,
    pub relay: RelaySettings,
    pub retention: RetentionSettings,
    /// `[receipts]`: what arrived at the notify URLs, kept for diagnosis (src/receipts).
    pub receipts: ReceiptSettings,
    pub sandbox: SandboxSettings,
    /// `[reconcile]`: asking the providers about unpaid orders, and closing at the provider
    /// before closing here (src/reconcile).
    pub reconcile: ReconcileSettings,
    /// `[provider_api]`: the HTTPS client that calls the providers' APIs (src/https.rs,
    /// src/channel/api.rs).
    pub provider_api: ProviderApiSettings,
    /// `[certificates]`: downloaded platform certificates kept fresh (src/certificates).
    pub certificates: crate::certificates::settings::CertificateSettings,
    /// `[bills]`: the daily bill reconciliation (src/bills).
    pub bills: crate::bills::settings::BillSettings,
    /// `[refunds]`: refunds started through paynotify, followed to the end (src/refunds).
    pub refunds: crate::refunds::settings::RefundSettings,
    /// `[transfers]`: merchant transfers started through paynotify, their caps, followed to
    /// the end (src/transfers).
    pub transfers: crate::transfers::settings::TransferSettings,
    /// `[merchants]`: provider accounts added through `/admin/merchants` (src/merchants).
    pub merchants: crate::merchants::settings::MerchantSettings,
    /// `[secrets]`: the master key that seals their keys at rest (src/merchants/seal.rs).
    pub secrets: crate::merchants::settings::SecretsSettings,
    pub log: LogSettings,
    /// The old key names this configuration used, filled in by [`Settings::load_from`]
    /// (see `Settings::deprecations`).
    #[serde(skip)]
    pub deprecations: Vec<Deprecation>,
}

impl Settings {
    /// Every section with its name, in the order of the fields: what [`Settings::validate`]
    /// checks and what a mistyped environment variable is matched against. A new section
    /// (a provider's, say) is its field above and one line here.
    pub(crate) fn sections(&self) -> [(&'static str, &dyn value::Validate); 19] {
        [
            ("server", &self.server),
            ("database", &self.database),
            ("redis", &self.redis),
            ("wechat", &self.wechat),
            ("alipay", &self.alipay),
            ("orders", &self.orders),
            ("relay", &self.relay),
            ("retention", &self.retention),
            ("receipts", &self.receipts),
            ("sandbox", &self.sandbox),
            ("reconcile", &self.reconcile),
            ("provider_api", &self.provider_api),
            ("certificates", &self.certificates),
            ("bills", &self.bills),
            ("refunds", &self.refunds),
            ("transfers", &self.transfers),
            ("merchants", &self.merchants),
            ("secrets", &self.secrets),
            ("log", &self.log),
        ]
    }
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, the event's fields at the top level, for log shippers.
    Json,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    /// The whole request body must arrive within this many milliseconds of the request head
    /// (else 408 and the connection is closed).
    pub body_timeout_ms: u64,
    /// Bearer token for `/orders` and `/admin`; may be empty only on a loopback address.
    pub api_token: Secret,
    /// HTTP workers: each reads requests and verifies signatures on a thread of its own.
    /// 0: one per core.
    pub workers: usize,
    /// Threads of the runtime that talks to the database, Redis and the sinks (its work is
    /// waiting, not computing). 0: a quarter of the cores, at least one.
    pub io_threads: usize,
    /// The console is served over plain http to a browser on this machine: its session
    /// cookie goes without `Secure` to a request straight from loopback. Only with a loopback
    /// `listen`; otherwise the cookie is always `Secure` (TLS may end in a proxy on this
    /// machine that adds no forwarding header).
    pub console_plain_http: bool,
}

impl ServerSettings {
    /// `server.workers`, with 0 resolved.
    pub fn http_workers(&self) -> usize {
        match self.workers {
            0 => cores(),
            n => n,
        }
    }

    /// `server.io_threads`, with 0 resolved.
    pub fn runtime_threads(&self) -> usize {
        match self.io_threads {
            0 => (cores() / 4).max(1),
            n => n,
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `sqlite://PATH` or `postgres://…`; may hold a password, hence a secret.
    pub url: Secret,
    pub pool_size: u32,
    pub auto_migrate: bool,
    /// Longest wait for a pooled connection before answering 503.
    pub acquire_timeout_ms: u64,
    /// PostgreSQL `statement_timeout` set on every connection.
    pub statement_timeout_ms: u64,
    /// `/readyz` says `degraded` (503) while a commit has waited this long for a synchronous
    /// standby (PostgreSQL `SyncRep`) or a semi-sync acknowledgement (MariaDB/MySQL).
    pub sync_wait_alert_ms: u64,
    /// Most payments applied together in one transaction (group apply); 0 turns it off.
    pub group_apply_max: u32,
    /// After a failover, orders acknowledged this long before it and not `PAID`/`REFUNDED`
    /// on the new writer are reconciled at once; 0: not remembered.
    pub failover_recheck_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    pub url: Secret,
    /// Prefix of every gate key (several deployments can share one Redis).
    pub key_prefix: String,
    pub timeout_ms: u64,
    pub result_ttl_secs: u64,
    pub marker_ttl_ms: u64,
    /// Final answers each instance also keeps in memory, so a repeat it answered lately
    /// needs no Redis round trip (between half and all of them are kept); 0: none.
    pub recent_answers: usize,
    /// Redis Sentinel, instead of `url`: the sentinels' `host:port` (asked in this order).
    #[serde(deserialize_with = "redis_target::address_list")]
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the master under.
    pub sentinel_master: String,
    /// The sentinels' password; empty: none.
    pub sentinel_password: Secret,
    /// Replicas that must have a stream write (`WAIT`) before it counts as sent; unset: 1
    /// through sentinels, 0 otherwise.
    pub wait_replicas: Option<u32>,
    /// How long `WAIT` waits for them.
    pub wait_timeout_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrderSettings {
    pub expire_after_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkKind {
    Log,
    RedisStream,
    Http,
    /// RabbitMQ (AMQP 0-9-1) with publisher confirms.
    Amqp,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySettings {
    pub sink: SinkKind,
    pub interval_ms: u64,
    pub batch_size: u32,
    pub max_attempts: u32,
    pub redis_stream: String,
    /// The Redis that holds the stream (`sink = "redis-stream"`); empty: the `[redis]` one
    /// (`redis.url` or the sentinels). Give the
    /// stream a Redis of its own when the gate's Redis keeps nothing on disk: a flushed or
    /// restarted stream loses events the outbox has already marked sent.
    pub redis_url: Secret,
    pub http_url: String,
    pub http_secret: Secret,
    /// `amqp://user:password@host:port/vhost` (vhost `/` is `%2f`); may hold a password.
    pub amqp_url: Secret,
    /// A durable topic exchange, declared at connection; routing key = the event's topic.
    pub amqp_exchange: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// How often the retention job runs (partitions, purge, archive).
    pub every_secs: u64,
    /// Sent messages and idempotency keys are kept this long.
    pub keep_days: u32,
    /// Final orders created longer ago than this (at least 366: refunds come up to a year
    /// after the payment) are archived with their callbacks and anomalies, then removed.
    pub orders_keep_days: u32,
    /// Where the archive's files go (`src/archive`); created at start-up.
    pub archive_dir: PathBuf,
    /// The daily bill runs' differences (`bill_item`) are deleted this long after their date.
    pub bill_items_keep_days: u32,
    /// Bill rows a run left behind (`bill_line`) are deleted this long after their date.
    pub bill_lines_keep_days: u32,
}

/// Which notify requests leave a receipt (`receipts.store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiptMode {
    /// Only requests that were not answered with the provider's success.
    #[default]
    Rejected,
    /// Every request.
    All,
    /// None.
    Off,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiptSettings {
    pub store: ReceiptMode,
    /// Receipts older than this are purged by the retention job.
    pub keep_days: u32,
    /// Receipts waiting for the writer; when full, new ones are dropped and counted.
    pub queue: usize,
    /// Bytes a minute that receipts of anonymous requests (unverified, and neither keyed
    /// within its budget nor naming an unknown key within its own) may take; past it they are
    /// dropped and counted.
    pub anonymous_bytes_per_minute: usize,
    /// Receipts of anonymous requests kept per peer address a minute.
    pub anonymous_per_peer_per_minute: u32,
    /// How much of the body of an anonymous request is kept (with its length and SHA-256).
    pub junk_prefix_bytes: usize,
    /// Bytes a minute that receipts kept whole of requests in their provider's shape, naming
    /// a configured key, whose signature did not verify may take; past it they are kept as
    /// anonymous ones.
    pub keyed_bytes_per_minute: usize,
    /// The same for requests refused for naming a key not known yet (a WeChat serial during
    /// a certificate rotation), counted apart so that no other flood crowds them out.
    pub unknown_key_bytes_per_minute: usize,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSettings {
    pub wechat_private_key_file: Option<PathBuf>,
    pub alipay_private_key_file: Option<PathBuf>,
}

/// The two jobs that ask the providers (their client is `[provider_api]`). Only merchants/apps with API
/// credentials (`wechat.merchants[].private_key_file`, `alipay.apps[].app_private_key_file`)
/// are asked; without any, orders expire as before, locally.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileSettings {
    /// An unpaid order is first queried this long after it was created.
    pub after_secs: u64,
    /// Each order is queried at most once per this many seconds.
    pub every_secs: u64,
    /// Orders per run of the reconcile job, oldest first.
    pub batch: u32,
    /// How long past `expire_at` an order whose provider cannot be reached stays `WAIT_PAY`
    /// before it is closed here anyway (a later payment becomes `PAID_AFTER_CLOSE`).
    pub close_grace_secs: u64,
    /// The longest one run of the reconcile or expiry job goes on asking; what is left is
    /// the next run's (every 10 s), so a backlog never holds one run for its whole length.
    pub max_run_secs: u64,
    /// The old names of `provider_api.max_qps`, `connect_timeout_ms`, `timeout_ms` and
    /// `ca_file`: still read, moved there at load (see `provider_api`).
    #[serde(rename = "max_qps")]
    old_max_qps: Option<u32>,
    #[serde(rename = "connect_timeout_ms")]
    old_connect_timeout_ms: Option<u64>,
    #[serde(rename = "timeout_ms")]
    old_timeout_ms: Option<u64>,
    #[serde(rename = "ca_file")]
    old_ca_file: Option<PathBuf>,
}

impl Settings {
    /// Reads the file chosen by `--config`, else `$PAYNOTIFY_CONFIG`, else the default file,
    /// then applies the `PAYNOTIFY__…` variables of this process.
    pub fn load(explicit: Option<&Path>) -> Result<Self, ConfigError> {
        let from_env = std::env::var_os("PAYNOTIFY_CONFIG").map(PathBuf::from);
        let path = explicit
            .map(Path::to_path_buf)
            .or(from_env)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_FILE));
        // vars_os: a variable that is not UTF-8 must not panic start-up; such a value
        // cannot configure anything, and start-up warns about its name (see
        // `unused_env_vars`).
        let overrides = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}__")))
            .collect();
        Self::load_from(&path, overrides)
    }

    /// Reads `path` and applies `overrides` (environment-style names, `PAYNOTIFY__SECTION__KEY`).
    pub fn load_from(path: &Path, overrides: HashMap<String, String>) -> Result<Self, ConfigError> {
        let file_error = |message: String| ConfigError::File {
            path: path.to_path_buf(),
            message,
        };
        if !path.is_file() {
            return Err(file_error("not found (or not a file)".to_owned()));
        }
        let from_env = overrides.clone();
        let merged = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator("__")
                    .separator("__")
                    // Values stay strings: serde parses numbers and booleans where a field
                    // is one, and a string field (a token, a secret) keeps its exact bytes.
                    // `try_parsing(true)` would turn `00012345` into `12345`.
                    .try_parsing(false)
                    .source(Some(overrides)),
            )
            .build()
            .map_err(|e| file_error(e.to_string()))?;
        // Which keys were set, before the values are taken: a key set under both its old and
        // its new name is refused.
        let set: Vec<&str> = provider_api::MOVED
            .iter()
            .map(|moved| moved.new)
            .filter(|key| merged.get::<config::Value>(key).is_ok())
            .collect();
        let mut settings: Settings = serde_path_to_error::deserialize(merged)
            .map_err(|e| {
                let key = error_key(e.path());
                invalid(key, e.into_inner().to_string())
            })
            .map_err(|e| name_env_source(e, &from_env))?;
        settings
            .move_old_keys(|key| set.contains(&key))
            .map_err(|e| name_env_source(e, &from_env))?;
        settings
            .validate()
            .map_err(|e| settings.name_old_key(e))
            .map_err(|e| name_env_source(e, &from_env))?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests;
