//! Where relayed events go. Every sink delivers the same event (interface.md, "Relay sinks");
//! a new broker is one more implementation of [`Sink`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use ring::hmac;
use serde::Serialize;

use crate::config::{RelaySettings, Secret, SinkKind};
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

pub type Published<'a> = Pin<Box<dyn Future<Output = Vec<Result<(), String>>> + Send + 'a>>;
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
    pub fn new(url: &str, stream: &str, timeout: Duration) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            connection: tokio::sync::OnceCell::new(),
            stream: stream.to_owned(),
            timeout,
        })
    }

    /// [`RedisStreamSink::new`], then connects now: an error if Redis does not answer.
    pub async fn connect(url: &str, stream: &str, timeout: Duration) -> Result<Self, String> {
        let sink = Self::new(url, stream, timeout)?;
        sink.connection().await?;
        Ok(sink)
    }

    /// The shared connection, made now if there is none yet (at most `timeout`); once made,
    /// the connection manager reconnects by itself.
    async fn connection(&self) -> Result<ConnectionManager, String> {
        let timeout = self.timeout;
        self.connection
            .get_or_try_init(|| async move {
                tokio::time::timeout(timeout, self.client.get_connection_manager())
                    .await
                    .map_err(|_| {
                        format!(
                            "redis: not connected (no answer within {} ms)",
                            timeout.as_millis()
                        )
                    })?
                    .map_err(|e| format!("redis: not connected: {e}"))
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
                Ok(Ok(ids)) => Err(format!(
                    "XADD answered {} ids for {} events",
                    ids.len(),
                    events.len()
                )),
                Ok(Err(e)) => Err(format!("redis: {e}")),
                Err(_) => Err(format!(
                    "redis: no answer within {} ms",
                    self.timeout.as_millis()
                )),
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
    /// The build has no TLS stack: the URL must be plain `http://` (put TLS in front).
    pub fn new(url: &str, secret: &Secret) -> Result<Self, String> {
        if !url.starts_with("http://") {
            return Err("relay.http_url must be an http:// URL (no TLS in this build)".into());
        }
        // A redirect is not a delivery: reqwest would repeat a POST as a body-less GET.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
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
) -> Result<(), String> {
    let body = serde_json::to_string(&e).map_err(|err| err.to_string())?;
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
        .map_err(|err| format!("http: {err}"))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("http: {}", response.status()))
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
            let mut results = vec![Err("http: not sent".to_owned()); events.len()];
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
/// mistake (a malformed URL), never a sink that is down.
pub fn from_settings(
    relay: &RelaySettings,
    redis_url: &Secret,
    timeout: Duration,
) -> Result<Box<dyn Sink>, String> {
    Ok(match relay.sink {
        SinkKind::Log => Box::new(LogSink),
        SinkKind::RedisStream => Box::new(RedisStreamSink::new(
            redis_url.expose(),
            &relay.redis_stream,
            timeout,
        )?),
        SinkKind::Http => Box::new(HttpSink::new(&relay.http_url, &relay.http_secret)?),
    })
}
