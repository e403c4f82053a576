//! Where relayed events go. Every sink delivers the same event (interface.md, "Relay sinks");
//! a new broker is one more implementation of [`Sink`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use ring::hmac;
use serde::Serialize;

use crate::channel::api::{ClientSettings, client_builder};
use crate::config::{ConfigError, RedisSettings, RelaySettings, Secret, SinkKind, invalid};
use crate::notice::hex;

/// One outbox row as consumers receive it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub id: i64,
    pub topic: String,
    pub biz_key: String,
    pub payload: serde_json::Value,
    /// RFC 3339.
    pub created_at: String,
}

/// Why one event was not delivered; the relay records it in `last_error` and retries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    #[error("redis: {0}")]
    Redis(#[source] Arc<redis::RedisError>),
    #[error("redis: no answer within {} ms", .0.as_millis())]
    RedisTimeout(Duration),
    #[error("redis: XADD answered {ids} ids for {events} events")]
    RedisShortAnswer { ids: usize, events: usize },
    #[error("http: {0}")]
    Http(#[source] Arc<reqwest::Error>),
    #[error("http: the receiver answered {0}")]
    HttpStatus(u16),
    #[error("amqp: {0}")]
    Amqp(#[source] Arc<lapin::Error>),
    #[error("amqp: no connection within {} ms", .0.as_millis())]
    AmqpTimeout(Duration),
    #[error("amqp: the broker refused the message (nack)")]
    AmqpNack,
    /// `mandatory` and no queue is bound for the routing key.
    #[error("amqp: the broker returned the message unroutable ({code} {text})")]
    AmqpReturned { code: u16, text: String },
    #[error("amqp: no confirm within {} s", .0.as_secs())]
    AmqpConfirmTimeout(Duration),
    #[error("amqp: the channel is not in confirm mode")]
    AmqpNotConfirmed,
    /// The broker returned a message that matches no publish of the batch, so no return can
    /// be ruled out for any ack in it.
    #[error(
        "amqp: the broker returned a message this batch did not publish ({code} {text}); no ack in the batch is trusted"
    )]
    AmqpReturnUnmatched { code: u16, text: String },
    /// Acked, but some confirm of the batch never came: a return for this event may still
    /// be owed.
    #[error("amqp: acked, but the batch's confirms did not all arrive, so a return may be owed")]
    AmqpReturnsUnsettled,
    #[error("the event could not be encoded: {0}")]
    Encode(#[source] Arc<serde_json::Error>),
    /// The batch ended before this event was tried.
    #[error("not sent")]
    NotSent,
    /// The sink refused the event; its own words.
    #[error("{0}")]
    Refused(String),
}

pub type Published<'a> = Pin<Box<dyn Future<Output = Vec<Result<(), SinkError>>> + Send + 'a>>;
/// The answer of [`Sink::is_up`].
pub type Health<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// Delivers a batch; one result per event, in order. An `Err` is retried with backoff.
pub trait Sink: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a>;
    /// Whether the sink can take events now, for `/readyz` (bounded in time; never an
    /// error). Sinks that cannot be down say `true`.
    fn is_up(&self) -> Health<'_> {
        Box::pin(async { true })
    }
}

/// One structured log line per event (the embedded default).
#[derive(Debug, Default)]
pub struct LogSink;

impl Sink for LogSink {
    fn name(&self) -> &'static str {
        "log"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            events
                .iter()
                .map(|e| {
                    tracing::info!(
                        target: "paynotify::events",
                        id = e.id,
                        topic = %e.topic,
                        biz_key = %e.biz_key,
                        payload = %e.payload,
                        created_at = %e.created_at,
                        "event"
                    );
                    Ok(())
                })
                .collect()
        })
    }
}

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

/// `POST {url}` with the event as JSON, `Idempotency-Key: {topic}:{biz_key}` and
/// `Paynotify-Signature: t={unix},v1={hex HMAC-SHA256(secret, "{t}.{body}")}`.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    key: hmac::Key,
    /// False while the last batch delivered nothing: the receiver is unreachable or refusing.
    last_batch_delivered: AtomicBool,
}

impl HttpSink {
    /// `http://` or `https://`; HTTPS trusts the system's roots plus `reconcile.ca_file`.
    pub fn new(url: &str, secret: &Secret, tls: &ClientSettings) -> Result<Self, ConfigError> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "relay.http_url",
                "must be an http:// or https:// URL",
            ));
        }
        // A redirect is not a delivery: reqwest would repeat a POST as a body-less GET.
        let client = client_builder(tls)?
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| invalid("relay.http_url", e.to_string()))?;
        Ok(Self {
            client,
            url: url.to_owned(),
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.expose().as_bytes()),
            last_batch_delivered: AtomicBool::new(true),
        })
    }
}

async fn post(
    client: reqwest::Client,
    url: String,
    key: hmac::Key,
    e: Event,
) -> Result<(), SinkError> {
    let body = serde_json::to_string(&e).map_err(|err| SinkError::Encode(Arc::new(err)))?;
    let t = chrono::Utc::now().timestamp();
    let mac = hmac::sign(&key, format!("{t}.{body}").as_bytes());
    let response = client
        .post(&url)
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", format!("{}:{}", e.topic, e.biz_key))
        .header(
            "Paynotify-Signature",
            format!("t={t},v1={}", hex(mac.as_ref())),
        )
        .body(body)
        .send()
        .await
        .map_err(|err| SinkError::Http(Arc::new(err)))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(SinkError::HttpStatus(response.status().as_u16()))
    }
}

impl Sink for HttpSink {
    fn name(&self) -> &'static str {
        "http"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            // The whole batch at once, so a batch takes at most one timeout (10 s).
            let mut posts = tokio::task::JoinSet::new();
            for (i, e) in events.iter().enumerate() {
                let (client, url, key) = (self.client.clone(), self.url.clone(), self.key.clone());
                let e = e.clone();
                posts.spawn(async move { (i, post(client, url, key, e).await) });
            }
            let mut results = vec![Err(SinkError::NotSent); events.len()];
            while let Some(done) = posts.join_next().await {
                if let Ok((i, result)) = done {
                    results[i] = result;
                }
            }
            if !results.is_empty() {
                self.last_batch_delivered
                    .store(results.iter().any(Result::is_ok), Ordering::Relaxed);
            }
            results
        })
    }

    /// Down while the last batch delivered nothing (the receiver is not probed: a POST
    /// would be an event).
    fn is_up(&self) -> Health<'_> {
        let up = self.last_batch_delivered.load(Ordering::Relaxed);
        Box::pin(async move { up })
    }
}

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
            let (key, url) = relay.stream_url(redis);
            Box::new(
                RedisStreamSink::new(url.expose(), &relay.redis_stream, timeout)
                    .map_err(|e| invalid(key, e.to_string()))?,
            )
        }
        SinkKind::Http => Box::new(HttpSink::new(&relay.http_url, &relay.http_secret, tls)?),
        SinkKind::Amqp => Box::new(super::amqp::AmqpSink::new(
            relay.amqp_url.expose(),
            &relay.amqp_exchange,
            timeout,
        )?),
    })
}
