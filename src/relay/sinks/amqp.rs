//! `relay.sink = "amqp"`: every event to a RabbitMQ exchange, with publisher confirms.
//!
//! One connection and one confirm-mode channel, made on first use and again after any
//! failure, never at start-up: a broker that is down when the service starts must not stop
//! the notify endpoints. A batch is published whole (pipelined), then every confirm is
//! awaited; an event counts as delivered only on its broker ack. A nack, a returned message
//! (`mandatory`, no queue bound for its routing key), a lost connection or a confirm that does
//! not come in time is an `Err`, and the relay keeps the row pending with backoff. Returns are
//! paired with their events by id, not by the confirm lapin delivers them with
//! ([`pair_returns`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use crate::config::{ConfigError, check_amqp, invalid};
use crate::relay::sink::{Event, Health, Published, Sink, SinkError};

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
                (
                    *i,
                    m.properties.message_id().clone(),
                    Box::pin(publish),
                    None,
                )
            })
            .collect();
        let written = tokio::time::timeout_at(
            deadline,
            std::future::poll_fn(|cx| {
                let mut done = true;
                for (_, _, publish, outcome) in &mut publishes {
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
        let mut in_flight = Vec::with_capacity(publishes.len());
        // A publish that failed leaves its event unconfirmed; so does one never written.
        let mut all_confirmed = true;
        for (i, message_id, _, outcome) in publishes {
            match outcome {
                Some(Ok(confirm)) => {
                    pending.push((i, confirm));
                    in_flight.push(InFlight {
                        index: i,
                        outbox_id: events[i].id,
                        message_id,
                    });
                }
                // The channel is gone: this event stays pending.
                Some(Err(error)) => {
                    all_confirmed = false;
                    results[i] = Err(SinkError::Amqp(Arc::new(error)));
                }
                None => all_confirmed = false,
            }
        }
        // lapin hands a return to whichever confirm it completes next (a multiple-ack in
        // hash-map order), not to the return's own publish: the returns are gathered from
        // every confirm and paired with their events by id afterwards.
        let mut returns = Vec::new();
        for (i, confirm) in pending {
            results[i] = match tokio::time::timeout_at(deadline, confirm).await {
                Ok(Ok(Confirmation::Ack(returned))) => {
                    returns.extend(returned.as_ref().map(Returned::from));
                    Ok(())
                }
                Ok(Ok(Confirmation::Nack(returned))) => {
                    returns.extend(returned.as_ref().map(Returned::from));
                    Err(SinkError::AmqpNack)
                }
                Ok(Ok(Confirmation::NotRequested)) => {
                    all_confirmed = false;
                    Err(SinkError::AmqpNotConfirmed)
                }
                Ok(Err(error)) => {
                    all_confirmed = false;
                    Err(SinkError::Amqp(Arc::new(error)))
                }
                Err(_) => {
                    all_confirmed = false;
                    Err(SinkError::AmqpConfirmTimeout(CONFIRM_TIMEOUT))
                }
            };
        }
        pair_returns(&mut results, &in_flight, &returns, all_confirmed);
        results
    }
}

/// One publish awaiting its confirm: the event's place in the batch and the ids a return
/// carries back.
struct InFlight {
    index: usize,
    outbox_id: i64,
    message_id: Option<ShortString>,
}

/// A returned message, by the ids it was published with.
#[derive(Debug)]
struct Returned {
    outbox_id: Option<i64>,
    message_id: Option<ShortString>,
    code: u16,
    text: String,
}

impl From<&BasicReturnMessage> for Returned {
    fn from(r: &BasicReturnMessage) -> Self {
        let properties = &r.delivery.properties;
        let outbox_id = properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("outbox_id"))
            .and_then(|v| match v {
                AMQPValue::LongLongInt(id) => Some(*id),
                _ => None,
            });
        Self {
            outbox_id,
            message_id: properties.message_id().clone(),
            code: r.reply_code,
            text: r.reply_text.to_string(),
        }
    }
}

/// Fails every event the broker returned, found by the return's `outbox_id` header and
/// `message_id` (both must match, so a message that shares only one is not taken for ours).
///
/// The broker sends every return before its publish's ack, so once every confirm of the
/// batch is in, every return of the batch is too, and an ack without a return is a
/// delivery. Otherwise a return may still be owed to any ack, and none is trusted. A return
/// that matches no publish means the pairing itself cannot be relied on: no ack of the
/// batch is trusted either.
fn pair_returns(
    results: &mut [Result<(), SinkError>],
    in_flight: &[InFlight],
    returns: &[Returned],
    all_confirmed: bool,
) {
    let by_id: HashMap<i64, &InFlight> = in_flight.iter().map(|f| (f.outbox_id, f)).collect();
    let mut unmatched = None;
    for r in returns {
        let own = r
            .outbox_id
            .and_then(|id| by_id.get(&id))
            .filter(|f| f.message_id.is_some() && f.message_id == r.message_id);
        match own {
            Some(f) => {
                results[f.index] = Err(SinkError::AmqpReturned {
                    code: r.code,
                    text: r.text.clone(),
                });
            }
            None => {
                tracing::warn!(outbox_id = ?r.outbox_id, message_id = ?r.message_id.as_ref().map(ShortString::as_str), code = r.code, text = %r.text, "amqp: a returned message matches no publish of the batch");
                unmatched.get_or_insert(r);
            }
        }
    }
    let untrusted = match unmatched {
        Some(r) => SinkError::AmqpReturnUnmatched {
            code: r.code,
            text: r.text.clone(),
        },
        None if !all_confirmed => SinkError::AmqpReturnsUnsettled,
        None => return,
    };
    for result in results.iter_mut().filter(|r| r.is_ok()) {
        *result = Err(untrusted.clone());
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
                        Err(SinkError::Amqp(_)
                            | SinkError::AmqpConfirmTimeout(_)
                            | SinkError::AmqpReturnUnmatched { .. })
                    )
                });
            if broken {
                // Reconnect on the next batch; confirms and returns still owed on this
                // channel are moot, and a fresh channel starts with no return queued.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn in_flight(ids: &[i64]) -> Vec<InFlight> {
        ids.iter()
            .enumerate()
            .map(|(index, &id)| InFlight {
                index,
                outbox_id: id,
                message_id: Some(ShortString::from(format!("ORDER_PAID:K-{id}"))),
            })
            .collect()
    }

    fn returned(outbox_id: Option<i64>, message_id: Option<&str>) -> Returned {
        Returned {
            outbox_id,
            message_id: message_id.map(ShortString::from),
            code: 312,
            text: "NO_ROUTE".to_owned(),
        }
    }

    fn acked(n: usize) -> Vec<Result<(), SinkError>> {
        (0..n).map(|_| Ok(())).collect()
    }

    fn sent(results: &[Result<(), SinkError>]) -> Vec<bool> {
        results.iter().map(Result::is_ok).collect()
    }

    #[test]
    fn a_return_fails_its_own_event_whichever_confirm_carried_it() {
        let flight = in_flight(&[7, 8, 9]);
        let mut results = acked(3);
        // lapin may have handed it to event 7's or 9's confirm: the ids decide.
        pair_returns(
            &mut results,
            &flight,
            &[returned(Some(8), Some("ORDER_PAID:K-8"))],
            true,
        );
        assert_eq!(sent(&results), [true, false, true]);
        assert!(
            matches!(&results[1], Err(SinkError::AmqpReturned { code: 312, text }) if text == "NO_ROUTE"),
            "{:?}",
            results[1]
        );
    }

    #[test]
    fn a_return_matching_no_publish_marks_nothing_sent() {
        for stranger in [
            returned(Some(99), Some("ORDER_PAID:K-99")),
            // One id ours, the other not: not ours.
            returned(Some(8), Some("ORDER_PAID:K-99")),
            returned(Some(99), Some("ORDER_PAID:K-8")),
            returned(None, Some("ORDER_PAID:K-8")),
            returned(Some(8), None),
            returned(None, None),
        ] {
            let flight = in_flight(&[7, 8, 9]);
            let mut results = acked(3);
            pair_returns(&mut results, &flight, std::slice::from_ref(&stranger), true);
            assert_eq!(sent(&results), [false, false, false], "{stranger:?}");
            assert!(
                results
                    .iter()
                    .all(|r| matches!(r, Err(SinkError::AmqpReturnUnmatched { code: 312, .. }))),
                "{stranger:?}: {results:?}"
            );
        }
    }

    #[test]
    fn a_return_matching_no_publish_beside_matching_ones_still_marks_nothing_sent() {
        let flight = in_flight(&[7, 8, 9]);
        let mut results = acked(3);
        pair_returns(
            &mut results,
            &flight,
            &[
                returned(Some(8), Some("ORDER_PAID:K-8")),
                returned(Some(42), Some("ORDER_PAID:K-42")),
            ],
            true,
        );
        assert_eq!(sent(&results), [false, false, false]);
        assert!(matches!(results[1], Err(SinkError::AmqpReturned { .. })));
    }

    #[test]
    fn acks_are_not_trusted_until_every_confirm_of_the_batch_is_in() {
        let flight = in_flight(&[7, 8, 9]);
        let mut results = acked(3);
        results[2] = Err(SinkError::AmqpConfirmTimeout(CONFIRM_TIMEOUT));
        pair_returns(
            &mut results,
            &flight,
            &[returned(Some(8), Some("ORDER_PAID:K-8"))],
            false,
        );
        assert!(matches!(results[0], Err(SinkError::AmqpReturnsUnsettled)));
        assert!(matches!(results[1], Err(SinkError::AmqpReturned { .. })));
        assert!(matches!(results[2], Err(SinkError::AmqpConfirmTimeout(_))));
    }

    #[test]
    fn a_nacked_event_stays_a_nack_without_a_return_of_its_own() {
        let flight = in_flight(&[7, 8]);
        let mut results = vec![Err(SinkError::AmqpNack), Ok(())];
        pair_returns(&mut results, &flight, &[], true);
        assert!(matches!(results[0], Err(SinkError::AmqpNack)));
        assert!(results[1].is_ok());
    }
}
