//! RabbitMQ: a durable queue bound to paynotify's exchange (`relay.sink = "amqp"`).
//!
//! [`QueueConsumer::run`] connects, declares paynotify's exchange exactly as the service's
//! sink does (a durable topic exchange, no arguments, so both declarations agree), this
//! consumer's durable queue and its parked queue, binds the queue with each of
//! [`QueueSettings::bindings`], sets `basic.qos` to [`QueueSettings::prefetch`] and consumes
//! with manual acknowledgements:
//!
//! - each body is parsed into an [`Event`]; one that is not JSON, not an event, or whose
//!   `message_id` property is not the body's `{topic}:{biz_key}` is a poison message: logged
//!   once with its reason, parked, acknowledged, and no handler runs;
//! - the handler's `Ok` (returned only after its transaction committed) is `basic.ack`;
//! - [`Failure::Transient`] waits a growing delay ([`QueueSettings::retry_delay`] doubling
//!   up to [`QueueSettings::retry_delay_max`], 30 s by default), then `basic.nack` with
//!   requeue, so the message comes again; it is parked only once it failed on
//!   [`QueueSettings::max_attempts`] deliveries **and** at least
//!   [`QueueSettings::park_after`] (5 minutes by default) passed since its first failure,
//!   so that a database outage shorter than that parks nothing. [`Failure::Permanent`] and
//!   a poison message park at once.
//!
//! **Parking** publishes the original body and properties, its headers plus
//! `x-parked-reason`, `x-parked-attempts` and `x-parked-from` (this queue), persistent, to
//! [`QueueSettings::parked_queue`] through the default exchange, on a channel in confirm mode;
//! the parked queue is declared with the queue's `x-queue-type` only (plus
//! [`QueueSettings::parked_queue_arguments`]), never its TTL, length limit, dead-letter
//! exchange or delivery limit, so a parked message stays until someone takes it;
//! the original is acknowledged only after the broker confirmed the parked copy. A crash in
//! between parks it twice; a park that failed leaves the original unacknowledged (requeued),
//! so it is never lost.
//!
//! **Attempts.** RabbitMQ's classic queues do not count redeliveries (they only set
//! `redelivered`), so the consumer counts the failed deliveries of each message id, and when
//! this process first saw it fail, in memory: a restart of the process resets both, and a
//! message then gets up to `max_attempts` more deliveries and `park_after` more time (so
//! does every message once more than 100 000 ids failed at once: the memory is cleared
//! rather than grow without bound). Quorum queues (`x-queue-type = quorum` in [`QueueSettings::queue_arguments`]) carry
//! an `x-delivery-count` header; when it is present, the larger of the two counts is used.
//! Such a queue drops (or dead-letters) a message returned more than `x-delivery-limit`
//! times (RabbitMQ 4 sets 20 when none is given), so a message that reaches the limit is
//! parked then, whatever `park_after` says; the limit is read from `queue_arguments`, 20 for
//! a quorum queue without one. A queue's `x-message-ttl` also runs through requeues: one
//! shorter than `park_after` plus `retry_delay_max` can expire a failing message before it
//! is parked, which [`QueueConsumer::new`] warns about.
//!
//! **Concurrency.** Handlers run concurrently, each delivery in a task of its own, up to
//! `prefetch` at once (the broker sends no more unacknowledged deliveries than that): a
//! handler that waits on its database does not hold up the others, one that runs past
//! [`QueueSettings::handler_timeout`] (60 s by default) is cancelled and its delivery is a
//! transient failure (so a hung handler frees its slot), and acknowledging on one
//! channel from several tasks is safe with lapin. Events of different orders are
//! independent, and RabbitMQ does not keep the order of a requeued message anyway; a
//! handler whose work must be serial takes a lock (the example's SQLite connection is one).
//! Two deliveries of one message at once (a message published twice) are settled by the
//! inbox: one applies, the other is a duplicate.
//!
//! **Connection loss** (a closed connection, a broker restart, a channel the broker closed):
//! the session ends, the handlers in hand finish (their acknowledgements fail: the broker
//! redelivers what was unacknowledged, and the inbox makes those deliveries duplicates), and
//! the consumer connects again after a capped exponential backoff
//! ([`QueueSettings::reconnect_delay`] doubling up to
//! [`QueueSettings::reconnect_delay_max`]). [`QueueConsumer::run`] returns an error only after
//! [`QueueSettings::reconnect_attempts`] consecutive attempts failed to get as far as
//! consuming.
//!
//! **Shutdown**: when the `shutdown` future completes, the consumer cancels its
//! subscription, lets the handlers in hand finish and acknowledge, closes the channel and
//! the connection (which returns deliveries prefetched but not started to the queue) and
//! returns `Ok`.

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
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use tokio::task::JoinSet;

use crate::{Event, Failure, Handler};

/// AMQP `delivery_mode` 2: written to disk (in a durable queue).
const PERSISTENT: u8 = 2;
/// Message ids whose failed attempts are remembered at once; past this the memory is
/// cleared (the counts start again) rather than grow without bound.
const ATTEMPTS_REMEMBERED: usize = 100_000;
/// The longest `x-parked-reason`, in characters.
const REASON_MAX: usize = 1000;
/// How often a session checks that its connection and channel are still open.
const LIVENESS: Duration = Duration::from_secs(1);

/// Where and how to read.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// This consumer's durable queue (declared when missing).
    pub queue: String,
    /// paynotify's `relay.amqp_exchange` (a durable topic exchange; default
    /// `paynotify.events`), declared when missing.
    pub exchange: String,
    /// Routing keys the queue is bound with: topics (`ORDER_PAID`) or `#` for all.
    pub bindings: Vec<String>,
    /// `basic.qos` prefetch: unacknowledged messages in hand at once, and so the most
    /// handlers running at once (at least 1).
    pub prefetch: u16,
    /// Deliveries of one message before it is parked on `parked_queue` and acknowledged
    /// (at least 1).
    pub max_attempts: u32,
    /// Where poison messages go (`{queue}.parked` by default).
    pub parked_queue: String,
    /// `queue.declare` arguments of the queue (e.g. `x-queue-type = quorum`,
    /// `x-message-ttl`, `x-max-length`, a dead-letter exchange); a queue that exists must
    /// have been declared with the same ones. Only `x-queue-type` is carried over to the
    /// parked queue: a TTL, a length limit or a delivery limit there would drop parked
    /// messages silently.
    pub queue_arguments: FieldTable,
    /// `queue.declare` arguments of the parked queue, over the `x-queue-type` taken from
    /// `queue_arguments` (empty by default); a parked queue that exists must have been
    /// declared with the same ones.
    pub parked_queue_arguments: FieldTable,
    /// The wait before a transiently failed delivery is requeued (100 ms by default); doubles
    /// with each failed attempt of the message, up to `retry_delay_max` (30 s by default).
    /// A park that failed is retried after the same growing wait.
    pub retry_delay: Duration,
    pub retry_delay_max: Duration,
    /// A transiently failing message is parked only once it failed on `max_attempts`
    /// deliveries and at least this long passed since its first failure seen by this process
    /// (5 minutes by default; a restart starts it again). Zero parks after `max_attempts`
    /// alone.
    pub park_after: Duration,
    /// The wait before reconnecting; doubles with each consecutive failure, up to
    /// `reconnect_delay_max`.
    pub reconnect_delay: Duration,
    pub reconnect_delay_max: Duration,
    /// Consecutive connection attempts that fail (to connect, declare or consume) before
    /// [`QueueConsumer::run`] gives up with an error (at least 1).
    pub reconnect_attempts: u32,
    /// Bound on connecting and declaring, on one park's publish and confirm, and on closing.
    pub timeout: Duration,
    /// The longest one handler may run (60 s by default): past it the handler is cancelled
    /// (dropped at its next `.await`: a transaction it had open is not committed) and the
    /// delivery counts as a [`Failure::Transient`], requeued after its retry delay or parked,
    /// so a handler that hangs (a lock never granted, a peer that never answers) does not
    /// hold its prefetch slot for ever. `None`: no limit.
    pub handler_timeout: Option<Duration>,
}

impl QueueSettings {
    pub fn new(queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            exchange: "paynotify.events".to_owned(),
            bindings: vec!["#".to_owned()],
            prefetch: 32,
            max_attempts: 5,
            parked_queue: format!("{queue}.parked"),
            queue_arguments: FieldTable::default(),
            parked_queue_arguments: FieldTable::default(),
            retry_delay: Duration::from_millis(100),
            retry_delay_max: Duration::from_secs(30),
            park_after: Duration::from_secs(300),
            reconnect_delay: Duration::from_millis(200),
            reconnect_delay_max: Duration::from_secs(10),
            reconnect_attempts: 10,
            timeout: Duration::from_secs(10),
            handler_timeout: Some(Duration::from_secs(60)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    /// A setting that cannot work (a malformed URL, a name longer than AMQP allows).
    #[error("amqp: invalid setting {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("amqp: {what}: no answer within {} ms", .after.as_millis())]
    Timeout { what: &'static str, after: Duration },
    /// The connection or channel closed, or the broker cancelled the subscription.
    #[error("amqp: {0}")]
    Lost(String),
    /// Every one of `attempts` consecutive attempts to connect and consume failed.
    #[error(
        "amqp: gave up after {attempts} consecutive failed connection attempts; the last: {last}"
    )]
    GaveUp {
        attempts: u32,
        last: Box<QueueError>,
    },
}

/// Consumes the queue with manual acknowledgements: `basic.ack` only after the handler
/// finished (committed). See the [module documentation](self).
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

fn short(what: &'static str, value: &str) -> Result<ShortString, QueueError> {
    ShortString::try_new(value).map_err(|_| QueueError::Invalid {
        what,
        reason: "longer than 255 bytes".to_owned(),
    })
}

fn invalid(what: &'static str, reason: &str) -> QueueError {
    QueueError::Invalid {
        what,
        reason: reason.to_owned(),
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
        amqp_url
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|reason| QueueError::Invalid {
                what: "amqp_url",
                reason,
            })?;
        if settings.queue.is_empty() {
            return Err(invalid("queue", "must not be empty"));
        }
        if settings.parked_queue.is_empty() || settings.parked_queue == settings.queue {
            return Err(invalid(
                "parked_queue",
                "must be a queue name other than the queue's",
            ));
        }
        if settings.prefetch == 0 {
            return Err(invalid(
                "prefetch",
                "must be at least 1 (0 is unlimited in AMQP)",
            ));
        }
        if settings.max_attempts == 0 {
            return Err(invalid("max_attempts", "must be at least 1"));
        }
        if settings.reconnect_attempts == 0 {
            return Err(invalid("reconnect_attempts", "must be at least 1"));
        }
        if settings.handler_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid(
                "handler_timeout",
                "must be above zero (None: no limit)",
            ));
        }
        if settings.bindings.is_empty() {
            return Err(invalid(
                "bindings",
                "must hold at least one routing key (`#` for all)",
            ));
        }
        let bindings = settings
            .bindings
            .iter()
            .map(|b| short("bindings", b))
            .collect::<Result<_, _>>()?;
        let ttl = settings
            .queue_arguments
            .inner()
            .get("x-message-ttl")
            .and_then(integer)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        if let Some(ttl) = ttl
            && ttl < settings.park_after.saturating_add(settings.retry_delay_max)
        {
            tracing::warn!(
                queue = %settings.queue,
                ttl_ms = ttl.as_millis() as u64,
                park_after_ms = settings.park_after.as_millis() as u64,
                "amqp: the queue's x-message-ttl is shorter than park_after plus retry_delay_max: a message failing that long expires before it is parked"
            );
        }
        Ok(Self {
            url: amqp_url.to_owned(),
            queue: short("queue", &settings.queue)?,
            exchange: short("exchange", &settings.exchange)?,
            parked_queue: short("parked_queue", &settings.parked_queue)?,
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

    /// The parked queue's `queue.declare` arguments: the queue's type, then
    /// [`QueueSettings::parked_queue_arguments`].
    fn parked_arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        if let Some(kind) = self.settings.queue_arguments.inner().get("x-queue-type") {
            arguments.insert(ShortString::from("x-queue-type"), kind.clone());
        }
        for (key, value) in self.settings.parked_queue_arguments.inner() {
            arguments.insert(key.clone(), value.clone());
        }
        arguments
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
                self.parked_arguments()
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

/// The body as an [`Event`], or why it is a poison message.
fn parse(delivery: &Delivery) -> Result<Event, String> {
    let value: serde_json::Value =
        serde_json::from_slice(&delivery.data).map_err(|e| format!("the body is not JSON: {e}"))?;
    let event: Event =
        serde_json::from_value(value).map_err(|e| format!("the body is not an event: {e}"))?;
    if let Some(id) = delivery.properties.message_id() {
        let expected = event.message_id();
        if id.as_str() != expected {
            return Err(format!(
                "the message_id property {:?} is not the body's {{topic}}:{{biz_key}} {:?}",
                truncate(id.as_str(), 100),
                truncate(&expected, 100)
            ));
        }
    }
    Ok(event)
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// A quorum queue's `x-delivery-count`: how many times the message was delivered before.
fn delivery_count(delivery: &Delivery) -> Option<u32> {
    let headers = delivery.properties.headers().as_ref()?;
    u32::try_from(integer(headers.inner().get("x-delivery-count")?)?.max(0)).ok()
}

/// An AMQP integer of any width.
fn integer(value: &AMQPValue) -> Option<i64> {
    Some(match value {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    })
}

/// RabbitMQ 4's `x-delivery-limit` of a quorum queue declared without one.
const QUORUM_DELIVERY_LIMIT: u32 = 20;

/// The returns after which the queue drops a message: its `x-delivery-limit`, or
/// [`QUORUM_DELIVERY_LIMIT`] for a quorum queue without one; `None` when it never does.
fn delivery_limit(arguments: &FieldTable) -> Option<u32> {
    let arguments = arguments.inner();
    if let Some(limit) = arguments.get("x-delivery-limit").and_then(integer) {
        // Negative is "unlimited" on RabbitMQ 4.
        return u32::try_from(limit).ok();
    }
    let quorum = matches!(
        arguments.get("x-queue-type"),
        Some(AMQPValue::LongString(kind)) if kind.as_bytes() == b"quorum"
    );
    quorum.then_some(QUORUM_DELIVERY_LIMIT)
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
        let doublings = attempts.saturating_sub(1).min(16);
        self.settings
            .retry_delay
            .saturating_mul(1 << doublings)
            .min(self.settings.retry_delay_max)
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
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers
        .insert(
            ShortString::from("x-parked-reason"),
            AMQPValue::LongString(LongString::from(truncate(reason, REASON_MAX))),
        )
        .insert(
            ShortString::from("x-parked-attempts"),
            AMQPValue::LongLongInt(attempts.into()),
        )
        .insert(
            ShortString::from("x-parked-from"),
            AMQPValue::LongString(LongString::from(shared.settings.queue.as_str())),
        );
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        .with_delivery_mode(PERSISTENT);
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
