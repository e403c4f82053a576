//! A Redis stream.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{ConfigError, RedisNodes, RedisTarget, invalid};
use crate::redis_master::{Held, Master};
use crate::relay::sink::{Event, Health, Published, Sink, SinkError};

/// `XADD {stream} * id … topic … biz_key … payload … created_at …`, one pipeline per batch,
/// then, when replicas are asked for, `WAIT replicas timeout`: a batch counts as delivered
/// only once that many replicas have it, so a failover cannot take back an event the outbox
/// marked sent.
///
/// The connection is made on first use and again after a failed attempt, never at
/// start-up: Redis being down when the service starts must not stop the notify endpoints.
/// Until Redis answers, every delivery fails and the relay keeps the rows with backoff.
/// Through sentinels, a failed batch makes the next one ask the sentinels for the master.
pub struct RedisStreamSink {
    master: Arc<Master>,
    stream: String,
    timeout: Duration,
    /// `WAIT`'s replicas and timeout; 0 replicas: no `WAIT`.
    replicas: u32,
    wait: Duration,
}

impl RedisStreamSink {
    /// One node at `url`, no `WAIT`. Checks the URL only; connects on the first delivery (or
    /// [`Sink::is_up`]).
    pub fn new(url: &str, stream: &str, timeout: Duration) -> Result<Self, SinkError> {
        let master = Master::node(url, "relay.redis_url", timeout, timeout).map_err(|e| {
            SinkError::Redis(Arc::new(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid Redis URL",
                e.to_string(),
            ))))
        })?;
        Ok(Self::with(master, stream, timeout, 0, Duration::ZERO))
    }

    /// The stream on `target` (named by `key`): a `WAIT` for `replicas` replicas, up to
    /// `wait`, after every batch when `replicas` is positive. Nothing connects yet.
    pub fn on(
        key: &'static str,
        target: &RedisTarget,
        stream: &str,
        timeout: Duration,
        replicas: u32,
        wait: Duration,
    ) -> Result<Self, ConfigError> {
        // A WAIT's answer comes after up to `wait`: the connection must wait that long too.
        let response = timeout + wait;
        let master = match target {
            RedisTarget::Nodes(RedisNodes::Single(url)) => {
                Master::node(url, key, timeout, response)?
            }
            RedisTarget::Sentinels(sentinels) => Master::sentinels(sentinels, timeout, response)?,
            RedisTarget::Nodes(RedisNodes::Cluster(_)) => {
                return Err(invalid(
                    key,
                    "must name one node (the stream sink does not use Redis Cluster)",
                ));
            }
        };
        Ok(Self::with(master, stream, timeout, replicas, wait))
    }

    fn with(
        master: Master,
        stream: &str,
        timeout: Duration,
        replicas: u32,
        wait: Duration,
    ) -> Self {
        Self {
            master: Arc::new(master),
            stream: stream.to_owned(),
            timeout,
            replicas,
            wait,
        }
    }

    /// [`RedisStreamSink::new`], then connects now: an error if Redis does not answer.
    pub async fn connect(url: &str, stream: &str, timeout: Duration) -> Result<Self, SinkError> {
        let sink = Self::new(url, stream, timeout)?;
        sink.connection().await?;
        Ok(sink)
    }

    /// The shared connection, made now if there is none yet (waiting at most `timeout`).
    async fn connection(&self) -> Result<Held, SinkError> {
        tokio::time::timeout(self.timeout, self.master.connection())
            .await
            .map_err(|_| SinkError::RedisTimeout(self.timeout))?
            .map_err(|e| SinkError::Redis(Arc::new(e)))
    }

    /// The batch's `XADD`s, then its `WAIT`; `Ok` only when both answered in full.
    async fn deliver(&self, events: &[Event]) -> Result<(), SinkError> {
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
        let Held {
            mut connection,
            generation,
        } = self.connection().await?;
        let sent = tokio::time::timeout(
            self.timeout,
            pipe.query_async::<Vec<String>>(&mut connection),
        )
        .await;
        match sent {
            Ok(Ok(ids)) if ids.len() == events.len() => {}
            Ok(Ok(ids)) => {
                return Err(SinkError::RedisShortAnswer {
                    ids: ids.len(),
                    events: events.len(),
                });
            }
            Ok(Err(e)) => {
                self.master.failed(generation, Some(&e));
                return Err(SinkError::Redis(Arc::new(e)));
            }
            Err(_) => {
                self.master.failed(generation, None);
                return Err(SinkError::RedisTimeout(self.timeout));
            }
        }
        if self.replicas == 0 {
            return Ok(());
        }
        let wait_ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX);
        let acked = tokio::time::timeout(
            self.timeout + self.wait,
            redis::cmd("WAIT")
                .arg(self.replicas)
                .arg(wait_ms)
                .query_async::<u64>(&mut connection),
        )
        .await;
        match acked {
            Ok(Ok(acked)) if acked >= u64::from(self.replicas) => Ok(()),
            Ok(Ok(acked)) => {
                // The master lost its replicas, or is an old master still taking writes that
                // the sentinels have replaced: through sentinels, ask them again.
                if self.master.through_sentinels() {
                    self.master.forget(generation);
                }
                Err(SinkError::RedisNotReplicated {
                    acked,
                    wanted: self.replicas,
                })
            }
            Ok(Err(e)) => {
                self.master.failed(generation, Some(&e));
                Err(SinkError::Redis(Arc::new(e)))
            }
            Err(_) => {
                self.master.failed(generation, None);
                Err(SinkError::RedisTimeout(self.timeout + self.wait))
            }
        }
    }
}

impl Sink for RedisStreamSink {
    fn name(&self) -> &'static str {
        "redis-stream"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            let outcome = self.deliver(events).await;
            vec![outcome; events.len()]
        })
    }

    /// Connected to a node that answers `ROLE` as a master (or does not know `ROLE`).
    fn is_up(&self) -> Health<'_> {
        Box::pin(async move {
            let Ok(Held {
                mut connection,
                generation,
            }) = self.connection().await
            else {
                return false;
            };
            let checked =
                tokio::time::timeout(self.timeout, self.master.check_role(&mut connection)).await;
            match checked {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    self.master.failed(generation, Some(&e));
                    false
                }
                Err(_) => {
                    self.master.failed(generation, None);
                    false
                }
            }
        })
    }
}
