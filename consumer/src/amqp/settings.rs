//! What a consumer reads and how: [`QueueSettings`], the checks a
//! [`QueueConsumer`](super::QueueConsumer) makes of them before it connects, and what the
//! queue's arguments imply (the parked queue's arguments, the delivery limit).

use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::QueueError;
use super::wire::integer;

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
    /// [`QueueConsumer::run`](super::QueueConsumer::run) gives up with an error (at least 1).
    pub reconnect_attempts: u32,
    /// Bound on connecting and declaring, on one park's publish and confirm, and on closing.
    pub timeout: Duration,
    /// The longest one handler may run (60 s by default): past it the handler is cancelled
    /// (dropped at its next `.await`: a transaction it had open is not committed) and the
    /// delivery counts as a [`Failure::Transient`](crate::Failure::Transient), requeued after its retry delay or parked,
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

/// The names a consumer declares, binds and parks with, as AMQP short strings.
pub(super) struct Names {
    pub(super) queue: ShortString,
    pub(super) exchange: ShortString,
    pub(super) parked_queue: ShortString,
    pub(super) bindings: Vec<ShortString>,
}

/// Checks the URL and the settings ([`QueueError::Invalid`] names the one refused), warns
/// when the queue's `x-message-ttl` can expire a failing message before it is parked, and
/// returns the names.
pub(super) fn check(amqp_url: &str, settings: &QueueSettings) -> Result<Names, QueueError> {
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
    Ok(Names {
        queue: short("queue", &settings.queue)?,
        exchange: short("exchange", &settings.exchange)?,
        parked_queue: short("parked_queue", &settings.parked_queue)?,
        bindings,
    })
}

/// The parked queue's `queue.declare` arguments: the queue's type, then
/// [`QueueSettings::parked_queue_arguments`].
pub(super) fn parked_arguments(settings: &QueueSettings) -> FieldTable {
    let mut arguments = FieldTable::default();
    if let Some(kind) = settings.queue_arguments.inner().get("x-queue-type") {
        arguments.insert(ShortString::from("x-queue-type"), kind.clone());
    }
    for (key, value) in settings.parked_queue_arguments.inner() {
        arguments.insert(key.clone(), value.clone());
    }
    arguments
}

/// RabbitMQ 4's `x-delivery-limit` of a quorum queue declared without one.
const QUORUM_DELIVERY_LIMIT: u32 = 20;

/// The returns after which the queue drops a message: its `x-delivery-limit`, or
/// [`QUORUM_DELIVERY_LIMIT`] for a quorum queue without one; `None` when it never does.
pub(super) fn delivery_limit(arguments: &FieldTable) -> Option<u32> {
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
