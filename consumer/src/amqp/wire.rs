//! The wire: a delivery's body and properties read into an [`Event`] (or the reason it is a
//! poison message), the headers RabbitMQ adds, and the parked copy's properties.

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, LongString, ShortString};

use crate::Event;

/// AMQP `delivery_mode` 2: written to disk (in a durable queue).
const PERSISTENT: u8 = 2;
/// The longest `x-parked-reason`, in characters.
const REASON_MAX: usize = 1000;

/// The body as an [`Event`], or why it is a poison message.
pub(super) fn parse(delivery: &Delivery) -> Result<Event, String> {
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

pub(super) fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// A quorum queue's `x-delivery-count`: how many times the message was delivered before.
pub(super) fn delivery_count(delivery: &Delivery) -> Option<u32> {
    let headers = delivery.properties.headers().as_ref()?;
    u32::try_from(integer(headers.inner().get("x-delivery-count")?)?.max(0)).ok()
}

/// An AMQP integer of any width.
pub(super) fn integer(value: &AMQPValue) -> Option<i64> {
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

/// The parked copy's properties: the original's, persistent, with its headers plus
/// `x-parked-reason` (at most [`REASON_MAX`] characters), `x-parked-attempts` and
/// `x-parked-from` (`queue`).
pub(super) fn parked_properties(
    delivery: &Delivery,
    reason: &str,
    attempts: u32,
    queue: &str,
) -> BasicProperties {
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
            AMQPValue::LongString(LongString::from(queue)),
        );
    delivery
        .properties
        .clone()
        .with_headers(headers)
        .with_delivery_mode(PERSISTENT)
}
