//! The defaults of every section: those of `config/default.toml`, so a file only needs the
//! keys it changes.

use std::net::SocketAddr;

use super::{
    DatabaseSettings, OrderSettings, ReceiptMode, ReceiptSettings, ReconcileSettings,
    RedisSettings, RelaySettings, RetentionSettings, Secret, ServerSettings, SinkKind,
};

impl Default for ReceiptSettings {
    fn default() -> Self {
        Self {
            store: ReceiptMode::Rejected,
            keep_days: 7,
            queue: 1024,
            anonymous_bytes_per_minute: 1024 * 1024,
            anonymous_per_peer_per_minute: 30,
            junk_prefix_bytes: 256,
            keyed_bytes_per_minute: 1024 * 1024,
            unknown_key_bytes_per_minute: 1024 * 1024,
        }
    }
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        Self {
            after_secs: 300,
            every_secs: 300,
            batch: 100,
            close_grace_secs: 3600,
            max_run_secs: 120,
            old_max_qps: None,
            old_connect_timeout_ms: None,
            old_timeout_ms: None,
            old_ca_file: None,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 65536,
            body_timeout_ms: 10_000,
            api_token: Secret::default(),
            workers: 0,
            io_threads: 0,
            console_plain_http: false,
        }
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: Secret::new("sqlite://data/paynotify.db"),
            pool_size: 16,
            auto_migrate: true,
            acquire_timeout_ms: 2000,
            statement_timeout_ms: 5000,
            sync_wait_alert_ms: 2000,
            group_apply_max: 64,
            failover_recheck_secs: 600,
        }
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: Secret::default(),
            key_prefix: "paynotify:".to_owned(),
            timeout_ms: 50,
            result_ttl_secs: 172_800,
            marker_ttl_ms: 5000,
            recent_answers: 100_000,
            sentinels: Vec::new(),
            sentinel_master: String::new(),
            sentinel_password: Secret::default(),
            wait_replicas: None,
            wait_timeout_ms: 1000,
        }
    }
}

impl Default for OrderSettings {
    fn default() -> Self {
        Self {
            expire_after_secs: 1800,
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            sink: SinkKind::Log,
            interval_ms: 1000,
            batch_size: 100,
            max_attempts: 16,
            redis_stream: "paynotify:events".to_owned(),
            redis_url: Secret::default(),
            http_url: String::new(),
            http_secret: Secret::default(),
            amqp_url: Secret::default(),
            amqp_exchange: "paynotify.events".to_owned(),
        }
    }
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            every_secs: 3600,
            keep_days: 7,
            orders_keep_days: 400,
            archive_dir: "data/archive".into(),
            bill_items_keep_days: 400,
            bill_lines_keep_days: 31,
        }
    }
}
