//! The sinks, and the one that `relay.sink` names.

pub mod amqp;
pub mod http;
pub mod log;
pub mod redis_stream;

use std::time::Duration;

pub use amqp::AmqpSink;
pub use http::HttpSink;
pub use log::LogSink;
pub use redis_stream::RedisStreamSink;

use crate::config::{ConfigError, RedisSettings, RelaySettings, SinkKind};
use crate::https::ClientSettings;
use crate::relay::sink::Sink;

/// The sink `relay.sink` names. Nothing is contacted here: an error is a configuration
/// mistake (a malformed URL) naming its key, never a sink that is down.
pub fn from_settings(
    relay: &RelaySettings,
    redis: &RedisSettings,
    timeout: Duration,
    tls: &ClientSettings,
) -> Result<Box<dyn Sink>, ConfigError> {
    Ok(match relay.sink {
        SinkKind::Log => Box::new(LogSink),
        SinkKind::RedisStream => {
            let (key, target) = relay.stream_target(redis)?;
            Box::new(RedisStreamSink::on(
                key,
                &target,
                &relay.redis_stream,
                timeout,
                redis.wait_replicas_for(&target),
                Duration::from_millis(redis.wait_timeout_ms),
            )?)
        }
        SinkKind::Http => Box::new(HttpSink::new(&relay.http_url, &relay.http_secret, tls)?),
        SinkKind::Amqp => Box::new(AmqpSink::new(
            relay.amqp_url.expose(),
            &relay.amqp_exchange,
            timeout,
        )?),
    })
}
