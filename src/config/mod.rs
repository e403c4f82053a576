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
mod tests {
    use super::*;
    use std::io::Write;

    /// Settings from `contents` as a file and `env` as the environment.
    pub(super) fn load(contents: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(contents.as_bytes()).expect("write temp file");
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::load_from(f.path(), env)
    }

    #[test]
    fn the_shipped_default_file_loads() {
        let s = Settings::load_from(Path::new(DEFAULT_CONFIG_FILE), HashMap::new())
            .expect("config/default.toml must load");
        assert_eq!(
            DatabaseUrl::parse(s.database.url.expose()).expect("url"),
            DatabaseUrl::Sqlite("data/paynotify.db".into())
        );
        assert!(s.server.listen.ip().is_loopback());
        assert!(s.redis.url.is_empty());
        assert_eq!(s.relay.sink, SinkKind::Log);
    }

    #[test]
    fn an_unknown_key_is_named() {
        let err = load("[server]\nlisen = \"127.0.0.1:1\"\n", &[]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("server") && msg.contains("lisen"), "{msg}");
    }

    #[test]
    fn an_unknown_section_is_named() {
        let err = load("[serverr]\nlisten = \"127.0.0.1:1\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("serverr"), "{err}");
    }

    #[test]
    fn receipt_settings_default_to_rejected_for_a_week_and_bad_ones_name_their_key() {
        let s = load("", &[]).expect("defaults");
        assert_eq!(
            (s.receipts.store, s.receipts.keep_days, s.receipts.queue),
            (ReceiptMode::Rejected, 7, 1024)
        );
        assert_eq!(
            (
                s.receipts.anonymous_bytes_per_minute,
                s.receipts.anonymous_per_peer_per_minute,
                s.receipts.junk_prefix_bytes
            ),
            (1_048_576, 30, 256)
        );
        assert_eq!(
            (
                s.receipts.keyed_bytes_per_minute,
                s.receipts.unknown_key_bytes_per_minute
            ),
            (1_048_576, 1_048_576)
        );
        let s = load("[receipts]\nstore = \"all\"\nkeep_days = 30\n", &[]).expect("all");
        assert_eq!(
            (s.receipts.store, s.receipts.keep_days),
            (ReceiptMode::All, 30)
        );
        for (toml, key) in [
            ("[receipts]\nstore = \"some\"\n", "receipts.store"),
            ("[receipts]\nkeep_days = 0\n", "receipts.keep_days"),
            ("[receipts]\nqueue = 0\n", "receipts.queue"),
            (
                "[receipts]\nanonymous_bytes_per_minute = 2000000000\n",
                "receipts.anonymous_bytes_per_minute",
            ),
            (
                "[receipts]\nanonymous_per_peer_per_minute = 2000000\n",
                "receipts.anonymous_per_peer_per_minute",
            ),
            (
                "[receipts]\njunk_prefix_bytes = 100000\n",
                "receipts.junk_prefix_bytes",
            ),
            (
                "[receipts]\nkeyed_bytes_per_minute = 2000000000\n",
                "receipts.keyed_bytes_per_minute",
            ),
            (
                "[receipts]\nunknown_key_bytes_per_minute = 2000000000\n",
                "receipts.unknown_key_bytes_per_minute",
            ),
        ] {
            let err = load(toml, &[]).unwrap_err();
            assert!(err.to_string().contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let err = load("[database]\npool_size = \"many\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("database.pool_size"), "{err}");
        let err = load("[server]\nlisten = \"nowhere\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("server.listen"), "{err}");
        let err = load("[relay]\nsink = \"kafka\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("relay.sink"), "{err}");
        let err = load("[retention]\nkeep_days = 1\n", &[]).unwrap_err();
        assert!(err.to_string().contains("retention.keep_days"), "{err}");
        let err = load("[retention]\nevery_secs = 59\n", &[]).unwrap_err();
        assert!(err.to_string().contains("retention.every_secs"), "{err}");
        let err = load("[retention]\norders_keep_days = 365\n", &[]).unwrap_err();
        assert!(
            err.to_string().contains("retention.orders_keep_days"),
            "{err}"
        );
        let err = load("[bills]\nrun_at = \"25:00\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("bills.run_at"), "{err}");
        let err = load("[bills]\ntimezone = \"Mars/Olympus\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("bills.timezone"), "{err}");
        let err = load("[retention]\narchive_dir = \"\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("retention.archive_dir"), "{err}");
        let err = load("[retention]\nbill_items_keep_days = 29\n", &[]).unwrap_err();
        assert!(
            err.to_string().contains("retention.bill_items_keep_days"),
            "{err}"
        );
        let err = load("[retention]\nbill_lines_keep_days = 7\n", &[]).unwrap_err();
        assert!(
            err.to_string().contains("retention.bill_lines_keep_days"),
            "{err}"
        );
        let err = load("[server]\nbody_timeout_ms = 0\n", &[]).unwrap_err();
        assert!(err.to_string().contains("server.body_timeout_ms"), "{err}");
        let err = load("[database]\nurl = \"oracle://x\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("database.url"), "{err}");
    }

    #[test]
    fn environment_overrides_the_file_with_double_underscores() {
        let s = load(
            "[database]\npool_size = 4\n",
            &[
                ("PAYNOTIFY__DATABASE__POOL_SIZE", "9"),
                ("PAYNOTIFY__SERVER__API_TOKEN", "t0ken"),
                ("PAYNOTIFY_DATABASE_POOL_SIZE", "3"),
            ],
        )
        .expect("loads");
        assert_eq!(s.database.pool_size, 9);
        assert_eq!(s.server.api_token.expose(), "t0ken");
    }

    #[test]
    fn string_settings_from_the_environment_keep_their_exact_bytes() {
        for value in [
            "00012345", "9e9", "True", "false", "1.50", "0x10", "-0", " 7 ", "1e3",
        ] {
            let s = load(
                "",
                &[
                    ("PAYNOTIFY__SERVER__API_TOKEN", value),
                    ("PAYNOTIFY__RELAY__HTTP_SECRET", value),
                    ("PAYNOTIFY__REDIS__KEY_PREFIX", value),
                    ("PAYNOTIFY__RELAY__REDIS_STREAM", value),
                ],
            )
            .unwrap_or_else(|e| panic!("{value:?}: {e}"));
            assert_eq!(s.server.api_token.expose(), value);
            assert_eq!(s.relay.http_secret.expose(), value);
            assert_eq!(s.redis.key_prefix, value);
            assert_eq!(s.relay.redis_stream, value);
        }
    }

    #[test]
    fn numbers_and_booleans_from_the_environment_still_parse() {
        let s = load(
            "",
            &[
                ("PAYNOTIFY__SERVER__MAX_BODY_BYTES", "2048"),
                ("PAYNOTIFY__DATABASE__AUTO_MIGRATE", "false"),
                ("PAYNOTIFY__DATABASE__POOL_SIZE", "3"),
                ("PAYNOTIFY__RELAY__INTERVAL_MS", "250"),
                ("PAYNOTIFY__RELAY__SINK", "http"),
                ("PAYNOTIFY__RELAY__HTTP_URL", "http://127.0.0.1:1/hook"),
                ("PAYNOTIFY__RELAY__HTTP_SECRET", "s"),
                ("PAYNOTIFY__SERVER__LISTEN", "127.0.0.1:9"),
            ],
        )
        .expect("loads");
        assert_eq!(s.server.max_body_bytes, 2048);
        assert!(!s.database.auto_migrate);
        assert_eq!(s.database.pool_size, 3);
        assert_eq!(s.relay.interval_ms, 250);
        assert_eq!(s.relay.sink, SinkKind::Http);
        assert_eq!(s.server.listen.port(), 9);
        let err = load("", &[("PAYNOTIFY__DATABASE__POOL_SIZE", "many")]).unwrap_err();
        assert!(err.to_string().contains("database.pool_size"), "{err}");
        let err = load("", &[("PAYNOTIFY__DATABASE__AUTO_MIGRATE", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("database.auto_migrate"), "{err}");
    }

    #[test]
    fn group_apply_max_is_off_at_zero_and_bounded() {
        let on = load("", &[]).expect("default");
        assert_eq!(on.database.group_apply_max, 64);
        let off = load("[database]\ngroup_apply_max = 0\n", &[]).expect("0 turns it off");
        assert_eq!(off.database.group_apply_max, 0);
        for bad in [
            "[database]\ngroup_apply_max = 1001\n",
            "[database]\ngroup_apply_max = -1\n",
        ] {
            let err = load(bad, &[]).unwrap_err();
            assert!(
                err.to_string().contains("database.group_apply_max"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn thread_counts_resolve_zero_and_are_bounded() {
        let auto = load("", &[]).expect("default");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(auto.server.http_workers(), cores);
        assert_eq!(auto.server.runtime_threads(), (cores / 4).max(1));
        let set = load("[server]\nworkers = 3\nio_threads = 5\n", &[]).expect("set");
        assert_eq!(
            (set.server.http_workers(), set.server.runtime_threads()),
            (3, 5)
        );
        for (bad, key) in [
            ("[server]\nworkers = 1025\n", "server.workers"),
            ("[server]\nio_threads = 1025\n", "server.io_threads"),
            ("[server]\nio_threads = -1\n", "server.io_threads"),
        ] {
            let err = load(bad, &[]).unwrap_err();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn recent_answers_default_to_100000_and_are_bounded() {
        let on = load("", &[]).expect("default");
        assert_eq!(on.redis.recent_answers, 100_000);
        let off = load("[redis]\nrecent_answers = 0\n", &[]).expect("0 keeps none");
        assert_eq!(off.redis.recent_answers, 0);
        let err = load("[redis]\nrecent_answers = 10000001\n", &[]).unwrap_err();
        assert!(err.to_string().contains("redis.recent_answers"), "{err}");
    }

    #[test]
    fn an_in_memory_sqlite_database_is_refused_naming_database_url() {
        for url in [
            "sqlite://:memory:",
            "sqlite://:MEMORY:",
            "sqlite::memory:",
            "sqlite://file::memory:",
            "sqlite://file::memory:?cache=shared",
            "sqlite://file:pay.db?mode=memory",
            "sqlite://file:pay.db?cache=shared&mode=memory",
            "sqlite://file:?cache=shared",
        ] {
            let err = DatabaseUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains("database.url"), "{url}: {err}");
            assert!(err.contains("in-memory"), "{url}: {err}");
            let toml = format!("[database]\nurl = \"{url}\"\n");
            let err = load(&toml, &[]).unwrap_err().to_string();
            assert!(err.contains("database.url"), "{url}: {err}");
        }
        for file in [
            "sqlite://data/pay.db",
            "sqlite:///var/lib/pay.db",
            "sqlite://file:pay.db?mode=rwc",
            "sqlite://memory.db",
        ] {
            assert!(
                matches!(DatabaseUrl::parse(file), Ok(DatabaseUrl::Sqlite(_))),
                "{file}"
            );
        }
    }

    #[test]
    fn an_unknown_environment_key_is_named() {
        let err = load("", &[("PAYNOTIFY__DATABASE__POOLSIZE", "9")]).unwrap_err();
        assert!(err.to_string().contains("poolsize"), "{err}");
    }

    /// Found by the `config` fuzz target: an empty field name (`"" = 1`, or a variable named
    /// just `PAYNOTIFY__`) was reported as ``config key ``: unknown field `` `` ``.
    #[test]
    fn an_empty_key_is_reported_at_its_parent() {
        // The file, the variables, the key named, words of the message.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: [Case; 4] = [
            ("", &[("PAYNOTIFY__", "")], ".", "PAYNOTIFY__"),
            ("\"\" = 1\n", &[], ".", "unknown field ``"),
            ("[server]\n\"\" = 1\n", &[], "server", "unknown field ``"),
            (
                "",
                &[("PAYNOTIFY__SERVER__", "x")],
                "server.",
                "PAYNOTIFY__SERVER__",
            ),
        ];
        for (file, env, want_key, want_message) in cases {
            match load(file, env) {
                Err(ConfigError::Invalid { key, message }) => {
                    assert_eq!(key, want_key, "{file:?} {env:?}: {message}");
                    assert!(
                        message.contains(want_message),
                        "{file:?} {env:?}: {message}"
                    );
                }
                other => panic!("{file:?} {env:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_empty_token_is_refused_off_loopback() {
        let err = load("[server]\nlisten = \"0.0.0.0:8080\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("server.api_token"), "{err}");
        load(
            "[server]\nlisten = \"0.0.0.0:8080\"\napi_token = \"x\"\n",
            &[],
        )
        .expect("a token makes a public address acceptable");
        load("[server]\nlisten = \"[::1]:8080\"\n", &[]).expect("IPv6 loopback is loopback");
    }

    #[test]
    fn a_plain_http_console_is_allowed_on_loopback_only() {
        let s = load("", &[]).expect("defaults");
        assert!(!s.server.console_plain_http, "Secure by default");
        let err = load(
            "[server]\nlisten = \"0.0.0.0:8080\"\napi_token = \"x\"\nconsole_plain_http = true\n",
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("server.console_plain_http"),
            "{err}"
        );
        let s = load("[server]\nconsole_plain_http = true\n", &[]).expect("on loopback");
        assert!(s.server.console_plain_http);
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let s = load(
            r#"
[server]
api_token = "tok-SECRET-1"
[database]
url = "postgres://app:pw-SECRET-2@db/pay"
[relay]
http_secret = "hmac-SECRET-3"
[[wechat.merchants]]
mchid = "1900000001"
appid = "wx1"
apiv3_key = "0123456789abcdef0123456789SECRET"
"#,
            &[],
        )
        .expect("loads");
        let shown = format!("{s:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        let url = DatabaseUrl::parse(s.database.url.expose()).expect("url");
        assert!(!format!("{url:?}").contains("SECRET"));
    }

    #[test]
    fn a_wrong_length_apiv3_key_is_named() {
        let err = load(
            "[[wechat.merchants]]\nmchid = \"1\"\nappid = \"a\"\napiv3_key = \"short\"\n",
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("wechat.merchants[0].apiv3_key"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_value_from_the_environment_names_the_variable() {
        let err = load("", &[("PAYNOTIFY__SERVER__LISTEN", "nowhere")]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("server.listen"), "{msg}");
        assert!(
            msg.contains("environment variable PAYNOTIFY__SERVER__LISTEN"),
            "{msg}"
        );
        let err = load("", &[("PAYNOTIFY__DATABASE__POOLSIZE", "9")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("environment variable PAYNOTIFY__DATABASE__POOLSIZE"),
            "{err}"
        );
        // A check that runs after parsing names the variable too.
        let err = load("", &[("PAYNOTIFY__RETENTION__KEEP_DAYS", "1")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("environment variable PAYNOTIFY__RETENTION__KEEP_DAYS"),
            "{err}"
        );
        // The same mistake in the file says nothing about the environment.
        let err = load("[server]\nlisten = \"nowhere\"\n", &[]).unwrap_err();
        assert!(!err.to_string().contains("environment"), "{err}");
    }

    #[test]
    fn variables_that_configure_nothing_are_reported_with_the_right_spelling() {
        let vars = [
            ("PAYNOTIFY_SERVER_LISTEN", "0.0.0.0:9"),
            ("PAYNOTIFY__SERVER__LISTEN", "127.0.0.1:9"),
            ("PAYNOTIFY_CONFIG", "x.toml"),
            ("PAYNOTIFY__SERVER", "x"),
            ("PAYNOTIFYX", "x"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let warnings = unused_env_vars(vars);
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("PAYNOTIFY_SERVER_LISTEN is ignored")
                    && w.contains("did you mean PAYNOTIFY__SERVER__LISTEN?")),
            "{warnings:#?}"
        );
        assert!(
            warnings.iter().any(|w| w.contains("PAYNOTIFY__SERVER is")),
            "{warnings:#?}"
        );
        assert!(
            warnings.iter().any(|w| w.contains("PAYNOTIFYX is")),
            "{warnings:#?}"
        );
    }

    #[test]
    fn log_format_is_text_unless_json_is_asked_for() {
        assert_eq!(load("", &[]).expect("loads").log.format, LogFormat::Text);
        let s = load("[log]\nformat = \"json\"\n", &[]).expect("loads");
        assert_eq!(s.log.format, LogFormat::Json);
        let s = load("", &[("PAYNOTIFY__LOG__FORMAT", "json")]).expect("loads");
        assert_eq!(s.log.format, LogFormat::Json);
        let err = load("[log]\nformat = \"xml\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("log.format"), "{err}");
    }

    #[test]
    fn the_stream_sink_takes_relay_redis_url_before_redis_url() {
        let stream_url = |s: &Settings| match s.relay.stream_target(&s.redis).expect("target") {
            (key, RedisTarget::Nodes(RedisNodes::Single(url))) => (key, url),
            (key, other) => panic!("{key}: {other:?}"),
        };
        let s = load(
            "[redis]\nurl = \"redis://gate:6379\"\n[relay]\nsink = \"redis-stream\"\nredis_url = \"redis://events:6380\"\n",
            &[],
        )
        .expect("loads");
        assert_eq!(
            stream_url(&s),
            ("relay.redis_url", "redis://events:6380".to_owned())
        );
        let s = load(
            "[relay]\nsink = \"redis-stream\"\n",
            &[("PAYNOTIFY__RELAY__REDIS_URL", "redis://events:6380")],
        )
        .expect("a stream sink needs no gate");
        assert_eq!(stream_url(&s).1, "redis://events:6380");
        let s = load(
            "[redis]\nurl = \"redis://gate:6379\"\n[relay]\nsink = \"redis-stream\"\n",
            &[],
        )
        .expect("loads");
        assert_eq!(stream_url(&s).0, "redis.url");
        let err = load("[relay]\nsink = \"redis-stream\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("relay.redis_url"), "{err}");
        let err = load(
            "[relay]\nsink = \"redis-stream\"\nredis_url = \"redis+cluster://a:7000,b:7001\"\n",
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("relay.redis_url"), "{err}");
    }

    #[test]
    fn redis_url_names_one_node_or_a_cluster() {
        assert_eq!(
            RedisNodes::parse("redis://127.0.0.1:6379/0").expect("single"),
            RedisNodes::Single("redis://127.0.0.1:6379/0".into())
        );
        let cluster =
            |nodes: &[&str]| RedisNodes::Cluster(nodes.iter().map(|n| (*n).to_owned()).collect());
        assert_eq!(
            RedisNodes::parse("redis+cluster://10.0.0.1:7000").expect("one seed"),
            cluster(&["redis://10.0.0.1:7000"])
        );
        assert_eq!(
            RedisNodes::parse("redis+cluster://:pw@a:7000,b:7001").expect("seeds"),
            cluster(&["redis://:pw@a:7000", "redis://:pw@b:7001"])
        );
        assert_eq!(
            RedisNodes::parse("redis://a:7000, redis://b:7001,c:7002").expect("list"),
            cluster(&["redis://a:7000", "redis://b:7001", "redis://c:7002"])
        );
        for bad in [
            "rediss://a:1",
            "http://a",
            "redis://a:1,,b:2",
            "redis://a:1,http://b:2",
        ] {
            let err = RedisNodes::parse(bad).unwrap_err().to_string();
            assert!(err.contains("redis.url"), "{bad}: {err}");
        }
        let err = load(
            "[redis]\nurl = \"redis+cluster://a:7000,b:7001\"\n[relay]\nsink = \"redis-stream\"\n",
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("redis.url"), "{err}");
        assert!(
            !format!(
                "{:?}",
                RedisNodes::parse("redis+cluster://:SECRET@a:1").expect("ok")
            )
            .contains("SECRET")
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let err =
            Settings::load_from(Path::new("/nonexistent/p.toml"), HashMap::new()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/p.toml"), "{err}");
    }
}
