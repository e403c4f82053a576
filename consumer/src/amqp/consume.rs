//! The consume loop: connecting, declaring and subscribing (and again after a lost
//! connection), then each delivery in a task of its own: handled, then acknowledged,
//! requeued or parked. The guarantees are the [module documentation](super)'s.

use std::collections::HashMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::message::{Delivery, DeliveryResult};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, LongString, ShortString};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use tokio::task::JoinSet;

use super::QueueError;
use super::settings::{Names, QueueSettings, check, delivery_limit, parked_arguments};
use super::wire::{delivery_count, parked_properties, parse, truncate};
use crate::backoff::backoff;
use crate::{Failure, Handler};

/// Message ids whose failed attempts are remembered at once; past this the memory is
/// cleared (the counts start again) rather than grow without bound.
const ATTEMPTS_REMEMBERED: usize = 100_000;
/// How often a session checks that its connection and channel are still open.
const LIVENESS: Duration = Duration::from_secs(1);

/// Consumes the queue with manual acknowledgements: `basic.ack` only after the handler
/// finished (committed). See the [module documentation](super).
pub struct QueueConsumer {
    url: String,
    settings: QueueSettings,
    queue: ShortString,
    exchange: ShortString,
    parked_queue: ShortString,
    bindings: Vec<ShortString>,
}

impl std::fmt::Debug for QueueConsumer {
    /// The URL may carry a password: never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueConsumer")
            .field("queue", &self.settings.queue)
            .field("exchange", &self.settings.exchange)
            .finish_non_exhaustive()
    }
}

/// A live session's connection and channels.
struct Link {
    connection: Connection,
    channel: Channel,
    /// The confirm-mode channel parks go out on, one at a time (so a broker return is
    /// always the current park's).
    park: Arc<tokio::sync::Mutex<Channel>>,
    consumer: lapin::Consumer,
}

/// How a session that got as far as consuming ended.
enum End {
    Shutdown,
    Lost(QueueError),
}

/// One message id's failures seen by this process.
struct Attempts {
    count: u32,
    first: Instant,
}

/// What every delivery's task shares.
struct Shared<H> {
    handler: Arc<H>,
    settings: QueueSettings,
    parked_queue: ShortString,
    /// Failed deliveries per message id (see the module documentation).
    attempts: Mutex<HashMap<String, Attempts>>,
    /// The queue's delivery limit ([`delivery_limit`]).
    delivery_limit: Option<u32>,
}

impl QueueConsumer {
    /// Checks the URL and the settings; connects in [`QueueConsumer::run`].
    pub fn new(amqp_url: &str, settings: QueueSettings) -> Result<Self, QueueError> {
        let Names {
            queue,
            exchange,
            parked_queue,
            bindings,
        } = check(amqp_url, &settings)?;
        Ok(Self {
            url: amqp_url.to_owned(),
            queue,
            exchange,
            parked_queue,
            bindings,
            settings,
        })
    }

    /// Runs until `shutdown` completes (then `Ok`) or [`QueueSettings::reconnect_attempts`]
    /// consecutive connection attempts failed (then [`QueueError::GaveUp`]).
    pub async fn run<H: Handler>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), QueueError> {
        let shared = Arc::new(Shared {
            handler: Arc::new(handler),
            settings: self.settings.clone(),
            parked_queue: self.parked_queue.clone(),
            attempts: Mutex::new(HashMap::new()),
            delivery_limit: delivery_limit(&self.settings.queue_arguments),
        });
        let mut shutdown = pin!(shutdown);
        let mut failures = 0u32;
        let mut delay = self.settings.reconnect_delay;
        loop {
            match self.session(&shared, shutdown.as_mut()).await {
                Ok(End::Shutdown) => return Ok(()),
                Ok(End::Lost(e)) => {
                    tracing::warn!(queue = %self.settings.queue, error = %e, "amqp: the connection was lost; reconnecting");
                    failures = 0;
                    delay = self.settings.reconnect_delay;
                }
                Err(e) => {
                    failures += 1;
                    if failures >= self.settings.reconnect_attempts {
                        tracing::error!(queue = %self.settings.queue, attempts = failures, error = %e, "amqp: giving up");
                        return Err(QueueError::GaveUp {
                            attempts: failures,
                            last: Box::new(e),
                        });
                    }
                    tracing::warn!(queue = %self.settings.queue, attempt = failures, error = %e, retry_in_ms = delay.as_millis() as u64, "amqp: could not connect and consume; retrying");
                }
            }
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
            delay = delay
                .saturating_mul(2)
                .min(self.settings.reconnect_delay_max);
        }
    }

    /// Declares the parked queue on a channel of its own. One that exists with other
    /// arguments (declared by an earlier version with the work queue's TTL or length limit,
    /// say) is refused by the broker (406, which closes the channel); it is then used as it
    /// is, with a warning, rather than stopping the consumer.
    async fn declare_parked(&self, connection: &Connection) -> Result<(), QueueError> {
        let declare = |channel: Channel, passive: bool| {
            let queue = self.parked_queue.clone();
            let arguments = if passive {
                FieldTable::default()
            } else {
                parked_arguments(&self.settings)
            };
            async move {
                let declared = channel
                    .queue_declare(
                        queue,
                        QueueDeclareOptions {
                            durable: true,
                            passive,
                            ..QueueDeclareOptions::default()
                        },
                        arguments,
                    )
                    .await;
                if channel.status().connected() {
                    let _ = channel.close(200, ShortString::from("declared")).await;
                }
                declared
            }
        };
        let Err(refused) = declare(connection.create_channel().await?, false).await else {
            return Ok(());
        };
        declare(connection.create_channel().await?, true)
            .await
            .map_err(|_| refused.clone())?;
        tracing::warn!(queue = %self.settings.parked_queue, error = %refused, "amqp: the parked queue exists with other arguments; using it as it is (see docs/operations.md, \"A consumer parked events\")");
        Ok(())
    }

    /// Connects, declares, binds, sets the prefetch and subscribes.
    async fn open(&self) -> Result<Link, QueueError> {
        let properties = ConnectionProperties::default().with_connection_name(LongString::from(
            format!("paynotify-consumer:{}", self.settings.queue),
        ));
        let connection = Connection::connect(&self.url, properties).await?;
        let channel = connection.create_channel().await?;
        channel
            .exchange_declare(
                self.exchange.clone(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                self.queue.clone(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                self.settings.queue_arguments.clone(),
            )
            .await?;
        self.declare_parked(&connection).await?;
        for binding in &self.bindings {
            channel
                .queue_bind(
                    self.queue.clone(),
                    self.exchange.clone(),
                    binding.clone(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        let park = connection.create_channel().await?;
        park.confirm_select(ConfirmSelectOptions::default()).await?;
        channel
            .basic_qos(self.settings.prefetch, BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                self.queue.clone(),
                ShortString::from(""),
                BasicConsumeOptions {
                    no_ack: false,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(Link {
            connection,
            channel,
            park: Arc::new(tokio::sync::Mutex::new(park)),
            consumer,
        })
    }

    /// One connection's life: `Err` when it never got as far as consuming.
    async fn session<H: Handler>(
        &self,
        shared: &Arc<Shared<H>>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<End, QueueError> {
        let timeout = self.settings.timeout;
        let link = tokio::select! {
            _ = &mut shutdown => return Ok(End::Shutdown),
            opened = tokio::time::timeout(timeout, self.open()) => match opened {
                Ok(link) => link?,
                Err(_) => return Err(QueueError::Timeout { what: "connecting and declaring", after: timeout }),
            },
        };
        tracing::info!(queue = %self.settings.queue, prefetch = self.settings.prefetch, "amqp: consuming");
        let (tx, mut deliveries) = tokio::sync::mpsc::unbounded_channel::<DeliveryResult>();
        link.consumer.set_delegate(move |delivery: DeliveryResult| {
            let tx = tx.clone();
            async move {
                // The receiver is gone only once the session ended; the channel's close
                // returns the delivery to the queue.
                let _ = tx.send(delivery);
            }
        });
        let mut tasks = JoinSet::new();
        // Set when the session ends: a delivery waiting out its retry delay is requeued at
        // once instead of holding up the shutdown or the reconnection.
        let (ending, ending_rx) = tokio::sync::watch::channel(false);
        let mut liveness = tokio::time::interval(LIVENESS);
        let end = loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => break End::Shutdown,
                delivery = deliveries.recv() => match delivery {
                    Some(Ok(Some(delivery))) => {
                        tasks.spawn(process(shared.clone(), link.park.clone(), delivery, ending_rx.clone()));
                    }
                    Some(Ok(None)) | None => {
                        break End::Lost(QueueError::Lost("the subscription was cancelled".to_owned()));
                    }
                    Some(Err(e)) => break End::Lost(QueueError::Amqp(e)),
                },
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => log_join(joined),
                _ = liveness.tick() => {
                    if !link.connection.status().connected() || !link.channel.status().connected() {
                        break End::Lost(QueueError::Lost("the connection or channel closed".to_owned()));
                    }
                    // A closed park channel (the broker closes a channel on a publish
                    // error) would fail every park until the session is renewed. A park in
                    // progress holds the lock; it is looked at on a later tick.
                    if let Ok(park) = link.park.try_lock() && !park.status().connected() {
                        break End::Lost(QueueError::Lost("the park channel closed".to_owned()));
                    }
                }
            }
        };
        if matches!(end, End::Shutdown) {
            let cancel = link
                .channel
                .basic_cancel(link.consumer.tag(), BasicCancelOptions::default());
            if let Ok(Err(e)) = tokio::time::timeout(timeout, cancel).await {
                tracing::warn!(queue = %self.settings.queue, error = %e, "amqp: basic.cancel failed");
            }
        }
        // After the cancel: a delivery requeued now is not handed straight back.
        let _ = ending.send(true);
        // Deliveries received but not started stay unacknowledged: closing the channel
        // returns them to the queue. The handlers in hand finish and acknowledge.
        drop(deliveries);
        while let Some(joined) = tasks.join_next().await {
            log_join(joined);
        }
        let _ = tokio::time::timeout(
            timeout,
            link.channel.close(200, ShortString::from("shutting down")),
        )
        .await;
        let _ = tokio::time::timeout(
            timeout,
            link.connection
                .close(200, ShortString::from("shutting down")),
        )
        .await;
        Ok(end)
    }
}

fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        tracing::error!(error = %e, "amqp: a delivery's task ended abnormally");
    }
}

impl<H> Shared<H> {
    fn attempts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Attempts>> {
        // The map holds counts only; one a panicking task left is still usable.
        self.attempts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one more failed delivery of `id`; returns the failed deliveries so far and
    /// the time since the first failure this process saw.
    fn failed(&self, id: &str, delivered_before: Option<u32>) -> (u32, Duration) {
        let mut attempts = self.attempts();
        if attempts.len() >= ATTEMPTS_REMEMBERED && !attempts.contains_key(id) {
            tracing::warn!(
                remembered = attempts.len(),
                "amqp: too many failing message ids to remember; their attempt counts start again"
            );
            attempts.clear();
        }
        let entry = attempts.entry(id.to_owned()).or_insert_with(|| Attempts {
            count: 0,
            first: Instant::now(),
        });
        entry.count = entry
            .count
            .saturating_add(1)
            .max(delivered_before.map_or(0, |n| n.saturating_add(1)));
        (entry.count, entry.first.elapsed())
    }

    fn forget(&self, id: &str) {
        self.attempts().remove(id);
    }

    fn retry_delay(&self, attempts: u32) -> Duration {
        backoff(
            self.settings.retry_delay,
            self.settings.retry_delay_max,
            attempts,
        )
    }
}

/// One delivery: parse, handle, then acknowledge, requeue or park.
async fn process<H: Handler>(
    shared: Arc<Shared<H>>,
    park: Arc<tokio::sync::Mutex<Channel>>,
    delivery: Delivery,
    mut ending: tokio::sync::watch::Receiver<bool>,
) {
    let queue = shared.settings.queue.as_str();
    let tag = delivery.delivery_tag;
    let event = match parse(&delivery) {
        Ok(event) => event,
        Err(reason) => {
            let property = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|m| truncate(m.as_str(), 100));
            tracing::warn!(queue, delivery_tag = tag, message_id = ?property, %reason, "amqp: a poison message; parking it");
            settle_park(&shared, &park, &delivery, &reason, 1, None, &mut ending).await;
            return;
        }
    };
    let id = event.message_id();
    // The handler in a task of its own, so that a panic is a failure of this delivery
    // (requeued) instead of a delivery never settled; cut off past its time.
    let task = tokio::spawn(shared.handler.handle(event));
    let handled = finish(task, shared.settings.handler_timeout).await;
    match handled {
        Ok(()) => {
            shared.forget(&id);
            ack(queue, &id, &delivery).await;
        }
        Err(Failure::Permanent(reason)) => {
            tracing::warn!(queue, message_id = %id, %reason, "amqp: the handler cannot apply this message; parking it");
            let reason = format!("permanent: {reason}");
            settle_park(
                &shared,
                &park,
                &delivery,
                &reason,
                1,
                Some(&id),
                &mut ending,
            )
            .await;
        }
        Err(Failure::Transient(reason)) => {
            let (attempts, failing_for) = shared.failed(&id, delivery_count(&delivery));
            // Requeued once more, the queue itself would drop it.
            let at_limit = shared.delivery_limit.is_some_and(|limit| attempts >= limit);
            if at_limit
                || attempts >= shared.settings.max_attempts
                    && failing_for >= shared.settings.park_after
            {
                let failing_ms = failing_for.as_millis() as u64;
                tracing::warn!(queue, message_id = %id, attempts, failing_ms, %reason, "amqp: failed on every attempt; parking it");
                let reason = format!(
                    "failed {attempts} times over {failing_ms} ms; the last: transient: {reason}"
                );
                settle_park(
                    &shared,
                    &park,
                    &delivery,
                    &reason,
                    attempts,
                    Some(&id),
                    &mut ending,
                )
                .await;
            } else {
                let delay = shared.retry_delay(attempts);
                tracing::warn!(queue, message_id = %id, attempts, %reason, retry_in_ms = delay.as_millis() as u64, "amqp: a transient failure; requeueing");
                pause(delay, &mut ending).await;
                requeue(queue, &id, &delivery).await;
            }
        }
    }
}

/// What a handler's task came to: its result, or a transient failure when it panicked or
/// ran past `limit` (then it is cancelled).
async fn finish(
    mut task: tokio::task::JoinHandle<Result<(), Failure>>,
    limit: Option<Duration>,
) -> Result<(), Failure> {
    let joined = match limit {
        None => (&mut task).await,
        Some(limit) => match tokio::time::timeout(limit, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                task.abort();
                return Err(Failure::Transient(format!(
                    "the handler did not finish within {} ms (handler_timeout); cancelled",
                    limit.as_millis()
                )));
            }
        },
    };
    joined.unwrap_or_else(|e| Err(Failure::Transient(format!("the handler panicked: {e}"))))
}

/// Waits `delay`, or less when the session ends.
async fn pause(delay: Duration, ending: &mut tokio::sync::watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = ending.wait_for(|ended| *ended) => {}
    }
}

async fn ack(queue: &str, id: &str, delivery: &Delivery) {
    match delivery.acker.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(queue, message_id = %id, "amqp: not acknowledged (the channel closed); the broker redelivers it and the inbox makes it a duplicate")
        }
        Err(e) => {
            tracing::warn!(queue, message_id = %id, error = %e, "amqp: basic.ack failed; the broker redelivers it and the inbox makes it a duplicate")
        }
    }
}

async fn requeue(queue: &str, id: &str, delivery: &Delivery) {
    let nack = delivery.acker.nack(BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    });
    match nack.await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(queue, message_id = %id, "amqp: not requeued (the channel closed); the broker redelivers it")
        }
        Err(e) => {
            tracing::warn!(queue, message_id = %id, error = %e, "amqp: basic.nack failed; the broker redelivers it")
        }
    }
}

/// Parks a copy and acknowledges the original once the copy is confirmed; when parking
/// fails, requeues the original (after the retry delay) so that it is parked next time.
async fn settle_park<H>(
    shared: &Shared<H>,
    park: &tokio::sync::Mutex<Channel>,
    delivery: &Delivery,
    reason: &str,
    attempts: u32,
    id: Option<&str>,
    ending: &mut tokio::sync::watch::Receiver<bool>,
) {
    let queue = shared.settings.queue.as_str();
    let shown = id.unwrap_or("(unparsed)");
    match park_copy(shared, park, delivery, reason, attempts).await {
        Ok(()) => {
            if let Some(id) = id {
                shared.forget(id);
            }
            ack(queue, shown, delivery).await;
        }
        Err(e) => {
            tracing::error!(queue, message_id = %shown, error = %e, "amqp: parking failed; requeueing the message to park it again");
            pause(shared.retry_delay(attempts), ending).await;
            requeue(queue, shown, delivery).await;
        }
    }
}

async fn park_copy<H>(
    shared: &Shared<H>,
    park: &tokio::sync::Mutex<Channel>,
    delivery: &Delivery,
    reason: &str,
    attempts: u32,
) -> Result<(), String> {
    let timeout = shared.settings.timeout;
    let properties = parked_properties(delivery, reason, attempts, shared.settings.queue.as_str());
    let channel = park.lock().await;
    let published = tokio::time::timeout(
        timeout,
        channel.basic_publish(
            ShortString::from(""),
            shared.parked_queue.clone(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &delivery.data,
            properties,
        ),
    )
    .await;
    let confirm = match published {
        Ok(Ok(confirm)) => confirm,
        Ok(Err(e)) => return Err(format!("publish: {e}")),
        Err(_) => return Err(format!("publish: no answer within {timeout:?}")),
    };
    match tokio::time::timeout(timeout, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(format!(
            "the broker returned the parked copy ({} {}): is {} declared?",
            returned.reply_code, returned.reply_text, shared.settings.parked_queue
        )),
        Ok(Ok(Confirmation::Nack(_))) => {
            Err("the broker refused the parked copy (nack)".to_owned())
        }
        Ok(Ok(Confirmation::NotRequested)) => {
            Err("the park channel is not in confirm mode".to_owned())
        }
        Ok(Err(e)) => Err(format!("confirm: {e}")),
        Err(_) => Err(format!("confirm: no answer within {timeout:?}")),
    }
}
