//! A Redis stream.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::relay::sink::{Event, Health, Published, Sink, SinkError};

/// `XADD {stream} * id … topic … biz_key … payload … created_at …`, one pipeline per batch.
///
/// The connection is made on first use and again after a failed attempt, never at
/// start-up: Redis being down when the service starts must not stop the notify endpoints.
/// Until Redis answers, every delivery fails and the relay keeps the rows with backoff.
pub struct RedisStreamSink {
    client: redis::Client,
    connection: tokio::sync::OnceCell<ConnectionManager>,
    stream: String,
    timeout: Duration,
}

impl RedisStreamSink {
    /// Checks the URL only; connects on the first delivery (or [`Sink::is_up`]).
    pub fn new(url: &str, stream: &str, timeout: Duration) -> Result<Self, SinkError> {
        let client = redis::Client::open(url).map_err(|e| SinkError::Redis(Arc::new(e)))?;
        Ok(Self {
            client,
            connection: tokio::sync::OnceCell::new(),
            stream: stream.to_owned(),
            timeout,
        })
    }

    /// [`RedisStreamSink::new`], then connects now: an error if Redis does not answer.
    pub async fn connect(url: &str, stream: &str, timeout: Duration) -> Result<Self, SinkError> {
        let sink = Self::new(url, stream, timeout)?;
        sink.connection().await?;
        Ok(sink)
    }

    /// The shared connection, made now if there is none yet (at most `timeout`); once made,
    /// the connection manager reconnects by itself.
    async fn connection(&self) -> Result<ConnectionManager, SinkError> {
        let timeout = self.timeout;
        self.connection
            .get_or_try_init(|| async move {
                tokio::time::timeout(timeout, self.client.get_connection_manager())
                    .await
                    .map_err(|_| SinkError::RedisTimeout(timeout))?
                    .map_err(|e| SinkError::Redis(Arc::new(e)))
            })
            .await
            .cloned()
    }
}

impl Sink for RedisStreamSink {
    fn name(&self) -> &'static str {
        "redis-stream"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            for e in events {
                pipe.cmd("XADD")
                    .arg(&self.stream)
                    .arg("*")
                    .arg("id")
                    .arg(e.id)
                    .arg("topic")
                    .arg(&e.topic)
                    .arg("biz_key")
                    .arg(&e.biz_key)
                    .arg("payload")
                    .arg(e.payload.to_string())
                    .arg("created_at")
                    .arg(&e.created_at);
            }
            let mut connection = match self.connection().await {
                Ok(connection) => connection,
                Err(e) => return vec![Err(e); events.len()],
            };
            let sent = tokio::time::timeout(
                self.timeout,
                pipe.query_async::<Vec<String>>(&mut connection),
            )
            .await;
            let outcome = match sent {
                Ok(Ok(ids)) if ids.len() == events.len() => Ok(()),
                Ok(Ok(ids)) => Err(SinkError::RedisShortAnswer {
                    ids: ids.len(),
                    events: events.len(),
                }),
                Ok(Err(e)) => Err(SinkError::Redis(Arc::new(e))),
                Err(_) => Err(SinkError::RedisTimeout(self.timeout)),
            };
            vec![outcome; events.len()]
        })
    }

    fn is_up(&self) -> Health<'_> {
        Box::pin(async move {
            let Ok(mut connection) = self.connection().await else {
                return false;
            };
            let pong = tokio::time::timeout(
                self.timeout,
                redis::cmd("PING").query_async::<String>(&mut connection),
            )
            .await;
            matches!(pong, Ok(Ok(_)))
        })
    }
}
