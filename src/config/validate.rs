//! The checks serde cannot express; each mistake is a start-up error naming its key.

use super::{ConfigError, DatabaseUrl, RedisNodes, Settings, SinkKind, check_amqp, invalid};

impl Settings {
    /// The checks serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        if !(1024..=16 * 1024 * 1024).contains(&s.max_body_bytes) {
            return Err(invalid(
                "server.max_body_bytes",
                "must be between 1024 and 16777216",
            ));
        }
        if !(100..=300_000).contains(&s.body_timeout_ms) {
            return Err(invalid(
                "server.body_timeout_ms",
                "must be between 100 and 300000",
            ));
        }
        if s.api_token.is_empty() && !s.listen.ip().is_loopback() {
            return Err(invalid(
                "server.api_token",
                format!(
                    "must be set when server.listen ({}) is not a loopback address",
                    s.listen
                ),
            ));
        }
        DatabaseUrl::parse(self.database.url.expose())?;
        if !(1..=1000).contains(&self.database.pool_size) {
            return Err(invalid("database.pool_size", "must be between 1 and 1000"));
        }
        if self.database.acquire_timeout_ms == 0 {
            return Err(invalid("database.acquire_timeout_ms", "must be positive"));
        }
        if self.database.statement_timeout_ms == 0 {
            return Err(invalid("database.statement_timeout_ms", "must be positive"));
        }
        if self.database.group_apply_max > 1000 {
            return Err(invalid(
                "database.group_apply_max",
                "must be between 0 (off) and 1000",
            ));
        }
        let r = &self.redis;
        if !r.url.is_empty() {
            RedisNodes::parse(r.url.expose())?;
        }
        for (key, value) in [
            ("redis.timeout_ms", r.timeout_ms),
            ("redis.result_ttl_secs", r.result_ttl_secs),
            ("redis.marker_ttl_ms", r.marker_ttl_ms),
            ("orders.expire_after_secs", self.orders.expire_after_secs),
            ("relay.interval_ms", self.relay.interval_ms),
            ("reconcile.every_secs", self.reconcile.every_secs),
            (
                "reconcile.connect_timeout_ms",
                self.reconcile.connect_timeout_ms,
            ),
            ("reconcile.timeout_ms", self.reconcile.timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        self.wechat.validate()?;
        let relay = &self.relay;
        if !(1..=10_000).contains(&relay.batch_size) {
            return Err(invalid("relay.batch_size", "must be between 1 and 10000"));
        }
        if relay.max_attempts == 0 {
            return Err(invalid("relay.max_attempts", "must be at least 1"));
        }
        match relay.sink {
            SinkKind::Log => {}
            SinkKind::RedisStream if relay.stream_url(r).1.is_empty() => {
                return Err(invalid(
                    "relay.redis_url",
                    "(or redis.url) must be set when relay.sink = \"redis-stream\"",
                ));
            }
            SinkKind::RedisStream
                if matches!(
                    RedisNodes::parse(relay.stream_url(r).1.expose()),
                    Ok(RedisNodes::Cluster(_))
                ) =>
            {
                return Err(invalid(
                    relay.stream_url(r).0,
                    "must name one node when relay.sink = \"redis-stream\" (the stream sink does not use Redis Cluster)",
                ));
            }
            SinkKind::RedisStream if relay.redis_stream.is_empty() => {
                return Err(invalid("relay.redis_stream", "must not be empty"));
            }
            SinkKind::RedisStream => {}
            SinkKind::Http if relay.http_url.is_empty() => {
                return Err(invalid(
                    "relay.http_url",
                    "must be set when relay.sink = \"http\"",
                ));
            }
            SinkKind::Http if relay.http_secret.is_empty() => {
                return Err(invalid(
                    "relay.http_secret",
                    "must be set when relay.sink = \"http\"",
                ));
            }
            SinkKind::Http => {}
            SinkKind::Amqp if relay.amqp_url.is_empty() => {
                return Err(invalid(
                    "relay.amqp_url",
                    "must be set when relay.sink = \"amqp\"",
                ));
            }
            SinkKind::Amqp => check_amqp(relay.amqp_url.expose(), &relay.amqp_exchange)?,
        }
        if !(2..=3650).contains(&self.retention.keep_days) {
            return Err(invalid(
                "retention.keep_days",
                "must be between 2 (providers retry for up to 25 hours) and 3650",
            ));
        }
        if !(1..=3650).contains(&self.receipts.keep_days) {
            return Err(invalid("receipts.keep_days", "must be between 1 and 3650"));
        }
        if !(1..=1_000_000).contains(&self.receipts.queue) {
            return Err(invalid("receipts.queue", "must be between 1 and 1000000"));
        }
        if self.receipts.anonymous_bytes_per_minute > 1 << 30 {
            return Err(invalid(
                "receipts.anonymous_bytes_per_minute",
                "at most 1073741824 (1 GiB)",
            ));
        }
        if self.receipts.anonymous_per_peer_per_minute > 1_000_000 {
            return Err(invalid(
                "receipts.anonymous_per_peer_per_minute",
                "at most 1000000",
            ));
        }
        if self.receipts.junk_prefix_bytes > 4096 {
            return Err(invalid("receipts.junk_prefix_bytes", "at most 4096"));
        }
        let rc = &self.reconcile;
        if !(1..=10_000).contains(&rc.batch) {
            return Err(invalid("reconcile.batch", "must be between 1 and 10000"));
        }
        if !(1..=10_000).contains(&rc.max_qps) {
            return Err(invalid("reconcile.max_qps", "must be between 1 and 10000"));
        }
        if !(1..=3600).contains(&rc.max_run_secs) {
            return Err(invalid(
                "reconcile.max_run_secs",
                "must be between 1 and 3600",
            ));
        }
        if let Some(path) = &rc.ca_file
            && !path.is_file()
        {
            return Err(invalid(
                "reconcile.ca_file",
                format!("{} is not a readable file", path.display()),
            ));
        }
        if self.orders.expire_after_secs > 30 * 24 * 3600 {
            return Err(invalid(
                "orders.expire_after_secs",
                "at most 2592000 (30 days)",
            ));
        }
        Ok(())
    }
}
