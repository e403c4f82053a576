//! `relay.sink = "amqp"`: every event to a RabbitMQ exchange, with publisher confirms.
//!
//! One connection and one confirm-mode channel, made on first use and again after any
//! failure, never at start-up: a broker that is down when the service starts must not stop
//! the notify endpoints. A batch is published whole (pipelined), then every confirm is
//! awaited; an event counts as delivered only on its broker ack. A nack, a returned message
//! (`mandatory`, no queue bound for its routing key), a lost connection or a confirm that does
//! not come in time is an `Err`, and the relay keeps the row pending with backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use super::sink::{Event, Health, Published, Sink, SinkError};
use crate::config::{ConfigError, check_amqp, invalid};

/// How long a whole batch may wait for its confirms before the unconfirmed events count as
/// failed (well inside the relay's lease).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// AMQP `delivery_mode` 2: the broker writes the message to disk (with a durable queue).
const PERSISTENT: u8 = 2;
/// An AMQP short string (`message_id`, a routing key) holds at most this many bytes.
const SHORT_STRING_MAX: usize = 255;

/// A live connection and its confirm-mode channel.
struct Link {
    connection: Connection,
    channel: Channel,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

pub struct AmqpSink {
    url: String,
    exchange: ShortString,
    /// Bound on connecting (TCP, handshake, declare, confirm mode).
    timeout: Duration,
    /// Held for a whole batch: one batch at a time on the channel, so its confirms are its own.
    link: tokio::sync::Mutex<Option<Link>>,
    /// What the last connection attempt or batch found, for `/readyz` while a batch runs.
    up: AtomicBool,
}

impl std::fmt::Debug for AmqpSink {
    /// The URL may carry a password: never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSink")
            .field("exchange", &self.exchange.as_str())
            .finish_non_exhaustive()
    }
}

impl AmqpSink {
    /// Checks the URL and the exchange name only; connects on the first delivery (or
    /// [`Sink::is_up`]).
    pub fn new(url: &str, exchange: &str, timeout: Duration) -> Result<Self, ConfigError> {
        check_amqp(url, exchange)?;
        let exchange = ShortString::try_new(exchange)
            .map_err(|_| invalid("relay.amqp_exchange", "must be at most 255 bytes"))?;
        Ok(Self {
            url: url.to_owned(),
            exchange,
            timeout,
            link: tokio::sync::Mutex::new(None),
            up: AtomicBool::new(false),
        })
    }

    /// Connects, opens a channel in confirm mode and declares the exchange (a durable
    /// topic exchange; declaring an existing one with the same type is a no-op).
    async fn connect(&self) -> Result<Link, SinkError> {
        let connect = async {
            let properties = ConnectionProperties::default()
                .with_connection_name(LongString::from("paynotify-relay"));
            let connection = Connection::connect(&self.url, properties).await?;
            let channel = connection.create_channel().await?;
            channel
                .exchange_declare(
                    self.exchange.clone(),
                    lapin::ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(Link {
                connection,
                channel,
            })
        };
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(link)) => Ok(link),
            Ok(Err(e)) => Err(SinkError::Amqp(Arc::new(e))),
            Err(_) => Err(SinkError::AmqpTimeout(self.timeout)),
        }
    }

    /// Makes `slot` hold an open link, connecting when there is none or it was lost.
    async fn ensure(&self, slot: &mut Option<Link>) -> Result<(), SinkError> {
        if slot.as_ref().is_some_and(Link::is_open) {
            return Ok(());
        }
        if let Some(old) = slot.take() {
            // Best effort: the broker may already have closed it.
            let _ = tokio::time::timeout(
                self.timeout,
                old.connection.close(200, ShortString::from("reconnecting")),
            )
            .await;
        }
        match self.connect().await {
            Ok(link) => {
                self.up.store(true, Ordering::Relaxed);
                *slot = Some(link);
                Ok(())
            }
            Err(e) => {
                self.up.store(false, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Publishes every event (pipelined), then awaits every confirm.
    ///
    /// `basic_publish` resolves once its frames are written, so awaiting each in turn would
    /// cost one trip through lapin's I/O loop per event. The publishes are polled together
    /// instead, first in event order (a publish queues its frames and takes its delivery tag
    /// on its first poll), so the batch leaves in order and in a few writes.
    async fn publish_batch(&self, link: &Link, events: &[Event]) -> Vec<Result<(), SinkError>> {
        let deadline = tokio::time::Instant::now() + CONFIRM_TIMEOUT;
        let mut results: Vec<Result<(), SinkError>> = Vec::with_capacity(events.len());
        let mut messages = Vec::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            match message(e) {
                Ok(message) => {
                    results.push(Err(SinkError::NotSent));
                    messages.push((i, message));
                }
                Err(error) => results.push(Err(error)),
            }
        }
        let mut publishes: Vec<_> = messages
            .iter()
            .map(|(i, m)| {
                let publish = link.channel.basic_publish(
                    self.exchange.clone(),
                    m.routing_key.clone(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &m.body,
                    m.properties.clone(),
                );
                (*i, Box::pin(publish), None)
            })
            .collect();
        let written = tokio::time::timeout_at(
            deadline,
            std::future::poll_fn(|cx| {
                let mut done = true;
                for (_, publish, outcome) in &mut publishes {
                    if outcome.is_none() {
                        match publish.as_mut().poll(cx) {
                            std::task::Poll::Ready(result) => *outcome = Some(result),
                            std::task::Poll::Pending => done = false,
                        }
                    }
                }
                if done {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            }),
        )
        .await;
        if written.is_err() {
            return events
                .iter()
                .map(|_| Err(SinkError::AmqpConfirmTimeout(CONFIRM_TIMEOUT)))
                .collect();
        }
        let mut pending = Vec::with_capacity(publishes.len());
        for (i, _, outcome) in publishes {
            match outcome {
                Some(Ok(confirm)) => pending.push((i, confirm)),
                // The channel is gone: this event stays pending.
                Some(Err(error)) => results[i] = Err(SinkError::Amqp(Arc::new(error))),
                None => {}
            }
        }
        for (i, confirm) in pending {
            results[i] = match tokio::time::timeout_at(deadline, confirm).await {
                Ok(Ok(Confirmation::Ack(None))) => Ok(()),
                Ok(Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)))) => {
                    Err(SinkError::AmqpReturned {
                        code: returned.reply_code,
                        text: returned.reply_text.to_string(),
                    })
                }
                Ok(Ok(Confirmation::Nack(None))) => Err(SinkError::AmqpNack),
                Ok(Ok(Confirmation::NotRequested)) => Err(SinkError::AmqpNotConfirmed),
                Ok(Err(error)) => Err(SinkError::Amqp(Arc::new(error))),
                Err(_) => Err(SinkError::AmqpConfirmTimeout(CONFIRM_TIMEOUT)),
            };
        }
        results
    }
}

/// An event as it goes on the wire: the body the http sink posts, its routing key (the
/// topic) and its properties.
struct Message {
    body: Vec<u8>,
    routing_key: ShortString,
    properties: BasicProperties,
}

/// An AMQP short string, or the event's error naming what was too long (never a panic: the
/// values come from the outbox).
fn short(what: &str, value: String) -> Result<ShortString, SinkError> {
    let shown: String = value.chars().take(32).collect();
    ShortString::try_new(value).map_err(|_| {
        SinkError::Refused(format!(
            "amqp: {what} {shown}… is longer than {SHORT_STRING_MAX} bytes"
        ))
    })
}

fn message(e: &Event) -> Result<Message, SinkError> {
    let body = serde_json::to_vec(e).map_err(|err| SinkError::Encode(Arc::new(err)))?;
    let routing_key = short("topic", e.topic.clone())?;
    let message_id = short("message_id", format!("{}:{}", e.topic, e.biz_key))?;
    let mut headers = FieldTable::default();
    headers
        .insert(
            ShortString::from("topic"),
            AMQPValue::LongString(LongString::from(e.topic.as_str())),
        )
        .insert(
            ShortString::from("biz_key"),
            AMQPValue::LongString(LongString::from(e.biz_key.as_str())),
        )
        .insert(ShortString::from("outbox_id"), AMQPValue::LongLongInt(e.id));
    let properties = BasicProperties::default()
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(PERSISTENT)
        .with_message_id(message_id)
        .with_headers(headers);
    Ok(Message {
        body,
        routing_key,
        properties,
    })
}

impl Sink for AmqpSink {
    fn name(&self) -> &'static str {
        "amqp"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            if events.is_empty() {
                return Vec::new();
            }
            let mut slot = self.link.lock().await;
            if let Err(e) = self.ensure(&mut slot).await {
                return vec![Err(e); events.len()];
            }
            let Some(link) = slot.as_ref() else {
                return vec![Err(SinkError::NotSent); events.len()];
            };
            let results = self.publish_batch(link, events).await;
            let broken = !link.is_open()
                || results.iter().any(|r| {
                    matches!(
                        r,
                        Err(SinkError::Amqp(_) | SinkError::AmqpConfirmTimeout(_))
                    )
                });
            if broken {
                // Reconnect on the next batch; confirms still owed on this channel are moot.
                self.up.store(false, Ordering::Relaxed);
                if let Some(old) = slot.take() {
                    let _ = tokio::time::timeout(
                        self.timeout,
                        old.connection.close(200, ShortString::from("reconnecting")),
                    )
                    .await;
                }
            } else {
                self.up.store(true, Ordering::Relaxed);
            }
            results
        })
    }

    /// Connects when there is no open link; while a batch is being published, the state the
    /// last attempt found.
    fn is_up(&self) -> Health<'_> {
        Box::pin(async move {
            let Ok(mut slot) = self.link.try_lock() else {
                return self.up.load(Ordering::Relaxed);
            };
            self.ensure(&mut slot).await.is_ok()
        })
    }
}
