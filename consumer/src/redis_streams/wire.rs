//! The wire: a paynotify event from a stream entry's fields, and the replies of
//! `XREADGROUP`, `XAUTOCLAIM` and `XPENDING` (RESP2 and RESP3) read into plain values.

use std::collections::HashMap;

use redis::Value;

use crate::Event;

/// One stream entry as read: its id and its fields, `None` when the entry was deleted
/// from the stream while pending.
pub(super) struct Entry {
    pub(super) id: String,
    pub(super) fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// A paynotify event from an entry's fields, or why it is not one.
pub(super) fn parse(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Event, String> {
    let field = |name: &str| -> Result<String, String> {
        let value = fields
            .iter()
            .find(|(n, _)| n.as_slice() == name.as_bytes())
            .map(|(_, v)| v)
            .ok_or_else(|| format!("missing field `{name}`"))?;
        String::from_utf8(value.clone()).map_err(|_| format!("field `{name}` is not UTF-8"))
    };
    let id = field("id")?;
    let id: i64 = id
        .parse()
        .map_err(|_| format!("field `id` is not an integer: {id:?}"))?;
    let payload = field("payload")?;
    let payload =
        serde_json::from_str(&payload).map_err(|e| format!("field `payload` is not JSON: {e}"))?;
    Ok(Event {
        id,
        topic: field("topic")?,
        biz_key: field("biz_key")?,
        payload,
        created_at: field("created_at")?,
    })
}

fn unexpected(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}

fn array(v: Value) -> Result<Vec<Value>, redis::RedisError> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        _ => Err(unexpected("an array")),
    }
}

fn bytes(v: Value) -> Result<Vec<u8>, redis::RedisError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        _ => Err(unexpected("a string")),
    }
}

fn string(v: Value) -> Result<String, redis::RedisError> {
    String::from_utf8(bytes(v)?).map_err(|_| unexpected("a UTF-8 string"))
}

fn integer(v: Value) -> Result<u64, redis::RedisError> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| unexpected("a count")),
        other => string(other)?.parse().map_err(|_| unexpected("an integer")),
    }
}

/// `[[id, [field, value, …] | nil], …]`.
fn entries(v: Value) -> Result<Vec<Entry>, redis::RedisError> {
    let mut out = Vec::new();
    for item in array(v)? {
        let mut item = array(item)?.into_iter();
        let Some(id) = item.next() else {
            return Err(unexpected("a stream entry with an id"));
        };
        let id = string(id)?;
        let fields = match item.next() {
            None | Some(Value::Nil) => None,
            Some(Value::Map(pairs)) => Some(
                pairs
                    .into_iter()
                    .map(|(n, v)| Ok((bytes(n)?, bytes(v)?)))
                    .collect::<Result<Vec<_>, redis::RedisError>>()?,
            ),
            Some(list) => {
                let mut flat = array(list)?.into_iter();
                let mut pairs = Vec::new();
                while let Some(name) = flat.next() {
                    let Some(value) = flat.next() else {
                        return Err(unexpected("an even number of field items"));
                    };
                    pairs.push((bytes(name)?, bytes(value)?));
                }
                Some(pairs)
            }
        };
        out.push(Entry { id, fields });
    }
    Ok(out)
}

/// `XREADGROUP`'s reply: nil (timed out) or `[[stream, entries]]` (or a map in RESP3).
pub(super) fn read_reply(v: Value) -> Result<Vec<Entry>, redis::RedisError> {
    let streams = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(pairs) => pairs.into_iter().map(|(_, e)| e).collect(),
        other => array(other)?
            .into_iter()
            .map(|s| {
                let mut s = array(s)?.into_iter();
                s.nth(1)
                    .ok_or_else(|| unexpected("a [stream, entries] pair"))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut out = Vec::new();
    for e in streams {
        out.extend(entries(e)?);
    }
    Ok(out)
}

/// `XPENDING`'s extended reply: each entry's delivery count, by id.
pub(super) fn pending_reply(v: Value) -> Result<HashMap<String, u64>, redis::RedisError> {
    let mut counts = HashMap::new();
    for row in array(v)? {
        let mut row = array(row)?.into_iter();
        let (Some(id), Some(_owner), Some(_idle), Some(count)) =
            (row.next(), row.next(), row.next(), row.next())
        else {
            return Err(unexpected("an XPENDING row of fewer than 4 items"));
        };
        counts.insert(string(id)?, integer(count)?);
    }
    Ok(counts)
}

/// What one `XAUTOCLAIM` brought.
pub(super) struct Claimed {
    pub(super) next: String,
    pub(super) entries: Vec<Entry>,
    /// Pending entries deleted from the stream: nothing left to hand over.
    pub(super) deleted: Vec<String>,
    /// Deleted entries answered as a bare nil (Redis 6.2): claimed now, so this
    /// consumer's own pending read (`0`) shows them with their ids, and acknowledges them.
    pub(super) unnamed_deleted: bool,
}

/// `XAUTOCLAIM`'s reply: `[next cursor, entries, deleted ids]` (Redis 7), or `[next
/// cursor, entries]` with a nil entry for one deleted while pending (6.2).
pub(super) fn autoclaim_reply(v: Value) -> Result<Claimed, redis::RedisError> {
    let mut parts = array(v)?.into_iter();
    let (Some(next), Some(claimed)) = (parts.next(), parts.next()) else {
        return Err(unexpected("an XAUTOCLAIM reply of a cursor and entries"));
    };
    let mut deleted = Vec::new();
    let mut kept = Vec::new();
    let items = array(claimed)?;
    let count = items.len();
    let items: Vec<Value> = items.into_iter().filter(|v| *v != Value::Nil).collect();
    let unnamed_deleted = items.len() < count;
    for e in entries(Value::Array(items))? {
        match e.fields {
            Some(_) => kept.push(e),
            None => deleted.push(e.id),
        }
    }
    if let Some(ids) = parts.next() {
        for id in array(ids)? {
            deleted.push(string(id)?);
        }
    }
    Ok(Claimed {
        next: string(next)?,
        entries: kept,
        deleted,
        unnamed_deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn parses_an_entry_or_says_why_not() {
        let good = f(&[
            ("id", "7"),
            ("topic", "ORDER_PAID"),
            ("biz_key", "O1"),
            ("payload", "{\"a\":1}"),
            ("created_at", "2024-01-01T00:00:00Z"),
        ]);
        let event = parse(&good).expect("an event");
        assert_eq!(event.message_id(), "ORDER_PAID:O1");
        assert_eq!(event.payload["a"], 1);
        let missing = f(&[("id", "7"), ("topic", "ORDER_PAID"), ("payload", "{}")]);
        assert!(parse(&missing).unwrap_err().contains("biz_key"));
        let mut not_json = good.clone();
        not_json[3].1 = b"{nope".to_vec();
        assert!(parse(&not_json).unwrap_err().contains("not JSON"));
        let mut bad_id = good;
        bad_id[0].1 = b"x".to_vec();
        assert!(parse(&bad_id).unwrap_err().contains("not an integer"));
    }

    #[test]
    fn autoclaim_replies_of_redis_6_and_7_name_the_deleted_entries() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let entry =
            |id: &str| Value::Array(vec![bulk(id), Value::Array(vec![bulk("id"), bulk("1")])]);
        // Redis 7: the third element lists the deleted ids.
        let seven = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("1-0")]),
            Value::Array(vec![bulk("2-0"), bulk("3-0")]),
        ]);
        let c = autoclaim_reply(seven).expect("a reply");
        assert_eq!(c.next, "0-0");
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.deleted, vec!["2-0".to_owned(), "3-0".to_owned()]);
        assert!(!c.unnamed_deleted);
        // An entry with nil fields.
        let nil_fields = Value::Array(vec![
            bulk("5-0"),
            Value::Array(vec![
                entry("1-0"),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ]);
        let c = autoclaim_reply(nil_fields).expect("a reply");
        assert_eq!(c.next, "5-0");
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.deleted, vec!["2-0".to_owned()]);
        // Redis 6.2: a bare nil in place of the entry.
        let six = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![Value::Nil, entry("1-0")]),
        ]);
        let c = autoclaim_reply(six).expect("a reply");
        assert_eq!(c.entries.len(), 1);
        assert!(c.deleted.is_empty());
        assert!(
            c.unnamed_deleted,
            "to be read again from the own pending list"
        );
    }
}
