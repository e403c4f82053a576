//! The checks serde cannot express, one [`Validate`] per section; each mistake is a start-up
//! error naming its key.

use super::value::Validate;
use super::{
    ConfigError, DatabaseSettings, DatabaseUrl, LogSettings, OrderSettings, ReceiptSettings,
    ReconcileSettings, RedisNodes, RedisSettings, RedisTarget, RelaySettings, RetentionSettings,
    SandboxSettings, ServerSettings, Settings, SinkKind, check_amqp, invalid,
};

impl Settings {
    /// Every section in the order of its fields, then the one check that reads two sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (_, section) in self.sections() {
            section.validate()?;
        }
        self.relay.validate_stream_redis(&self.redis)
    }
}

/// The first of `checks` whose value is 0 is refused.
fn positive(checks: &[(&str, u64)]) -> Result<(), ConfigError> {
    match checks.iter().find(|(_, value)| *value == 0) {
        Some((key, _)) => Err(invalid(*key, "must be positive")),
        None => Ok(()),
    }
}

impl Validate for ServerSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1024..=16 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(invalid(
                "server.max_body_bytes",
                "must be between 1024 and 16777216",
            ));
        }
        if !(100..=300_000).contains(&self.body_timeout_ms) {
            return Err(invalid(
                "server.body_timeout_ms",
                "must be between 100 and 300000",
            ));
        }
        if self.workers > 1024 {
            return Err(invalid(
                "server.workers",
                "must be between 0 (one per core) and 1024",
            ));
        }
        if self.io_threads > 1024 {
            return Err(invalid(
                "server.io_threads",
                "must be between 0 (a quarter of the cores) and 1024",
            ));
        }
        if self.console_plain_http && !self.listen.ip().is_loopback() {
            return Err(invalid(
                "server.console_plain_http",
                format!(
                    "may be true only when server.listen ({}) is a loopback address",
                    self.listen
                ),
            ));
        }
        if self.api_token.is_empty() && !self.listen.ip().is_loopback() {
            return Err(invalid(
                "server.api_token",
                format!(
                    "must be set when server.listen ({}) is not a loopback address",
                    self.listen
                ),
            ));
        }
        Ok(())
    }
}

impl Validate for DatabaseSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        DatabaseUrl::parse(self.url.expose())?;
        if !(1..=1000).contains(&self.pool_size) {
            return Err(invalid("database.pool_size", "must be between 1 and 1000"));
        }
        positive(&[
            ("database.acquire_timeout_ms", self.acquire_timeout_ms),
            ("database.statement_timeout_ms", self.statement_timeout_ms),
            ("database.sync_wait_alert_ms", self.sync_wait_alert_ms),
        ])?;
        if self.group_apply_max > 1000 {
            return Err(invalid(
                "database.group_apply_max",
                "must be between 0 (off) and 1000",
            ));
        }
        Ok(())
    }
}

impl Validate for RedisSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_target()?;
        positive(&[
            ("redis.timeout_ms", self.timeout_ms),
            ("redis.result_ttl_secs", self.result_ttl_secs),
            ("redis.marker_ttl_ms", self.marker_ttl_ms),
        ])?;
        if self.recent_answers > 10_000_000 {
            return Err(invalid(
                "redis.recent_answers",
                "must be between 0 (none) and 10000000",
            ));
        }
        Ok(())
    }
}

impl Validate for OrderSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        positive(&[("orders.expire_after_secs", self.expire_after_secs)])?;
        if self.expire_after_secs > 30 * 24 * 3600 {
            return Err(invalid(
                "orders.expire_after_secs",
                "at most 2592000 (30 days)",
            ));
        }
        Ok(())
    }
}

impl Validate for RelaySettings {
    /// All but the Redis the stream sink writes to, which may be `redis.url`
    /// ([`RelaySettings::validate_stream_redis`]).
    fn validate(&self) -> Result<(), ConfigError> {
        positive(&[("relay.interval_ms", self.interval_ms)])?;
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(invalid("relay.batch_size", "must be between 1 and 10000"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("relay.max_attempts", "must be at least 1"));
        }
        match self.sink {
            SinkKind::Log => {}
            SinkKind::RedisStream if self.redis_stream.is_empty() => {
                return Err(invalid("relay.redis_stream", "must not be empty"));
            }
            SinkKind::RedisStream => {}
            SinkKind::Http if self.http_url.is_empty() => {
                return Err(invalid(
                    "relay.http_url",
                    "must be set when relay.sink = \"http\"",
                ));
            }
            SinkKind::Http if self.http_secret.is_empty() => {
                return Err(invalid(
                    "relay.http_secret",
                    "must be set when relay.sink = \"http\"",
                ));
            }
            SinkKind::Http => {}
            SinkKind::Amqp if self.amqp_url.is_empty() => {
                return Err(invalid(
                    "relay.amqp_url",
                    "must be set when relay.sink = \"amqp\"",
                ));
            }
            SinkKind::Amqp => check_amqp(self.amqp_url.expose(), &self.amqp_exchange)?,
        }
        Ok(())
    }
}

impl RelaySettings {
    /// The stream sink's Redis (`relay.redis_url`, else `redis.url` or `redis.sentinels`):
    /// set, and not a cluster.
    fn validate_stream_redis(&self, redis: &RedisSettings) -> Result<(), ConfigError> {
        if self.sink != SinkKind::RedisStream {
            return Ok(());
        }
        let (key, target) = self.stream_target(redis)?;
        if matches!(target, RedisTarget::Nodes(RedisNodes::Cluster(_))) {
            return Err(invalid(
                key,
                "must name one node when relay.sink = \"redis-stream\" (the stream sink does not use Redis Cluster)",
            ));
        }
        Ok(())
    }
}

impl Validate for RetentionSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(60..=86_400).contains(&self.every_secs) {
            return Err(invalid(
                "retention.every_secs",
                "must be between 60 and 86400 (partitions are made three days ahead)",
            ));
        }
        if !(2..=3650).contains(&self.keep_days) {
            return Err(invalid(
                "retention.keep_days",
                "must be between 2 (providers retry for up to 25 hours) and 3650",
            ));
        }
        if !(366..=36500).contains(&self.orders_keep_days) {
            return Err(invalid(
                "retention.orders_keep_days",
                "must be between 366 (a refund may come up to a year after the payment) and 36500",
            ));
        }
        if self.archive_dir.as_os_str().is_empty() {
            return Err(invalid("retention.archive_dir", "must name a directory"));
        }
        if !(30..=36500).contains(&self.bill_items_keep_days) {
            return Err(invalid(
                "retention.bill_items_keep_days",
                "must be between 30 (a bill day is compared again for a week) and 36500",
            ));
        }
        if !(8..=3650).contains(&self.bill_lines_keep_days) {
            return Err(invalid(
                "retention.bill_lines_keep_days",
                "must be between 8 (the daily job reruns the past week) and 3650",
            ));
        }
        Ok(())
    }
}

impl Validate for ReceiptSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=3650).contains(&self.keep_days) {
            return Err(invalid("receipts.keep_days", "must be between 1 and 3650"));
        }
        if !(1..=1_000_000).contains(&self.queue) {
            return Err(invalid("receipts.queue", "must be between 1 and 1000000"));
        }
        if self.anonymous_bytes_per_minute > 1 << 30 {
            return Err(invalid(
                "receipts.anonymous_bytes_per_minute",
                "at most 1073741824 (1 GiB)",
            ));
        }
        if self.anonymous_per_peer_per_minute > 1_000_000 {
            return Err(invalid(
                "receipts.anonymous_per_peer_per_minute",
                "at most 1000000",
            ));
        }
        for (key, value) in [
            (
                "receipts.keyed_bytes_per_minute",
                self.keyed_bytes_per_minute,
            ),
            (
                "receipts.unknown_key_bytes_per_minute",
                self.unknown_key_bytes_per_minute,
            ),
        ] {
            if value > 1 << 30 {
                return Err(invalid(key, "at most 1073741824 (1 GiB)"));
            }
        }
        if self.junk_prefix_bytes > 4096 {
            return Err(invalid("receipts.junk_prefix_bytes", "at most 4096"));
        }
        Ok(())
    }
}

/// Its key files are read only when `paynotify replay` uses them.
impl Validate for SandboxSettings {}

impl Validate for ReconcileSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        positive(&[("reconcile.every_secs", self.every_secs)])?;
        if !(1..=10_000).contains(&self.batch) {
            return Err(invalid("reconcile.batch", "must be between 1 and 10000"));
        }
        if !(1..=3600).contains(&self.max_run_secs) {
            return Err(invalid(
                "reconcile.max_run_secs",
                "must be between 1 and 3600",
            ));
        }
        Ok(())
    }
}

/// `log.format` is an enum serde has checked.
impl Validate for LogSettings {}
