//! The three statements of a first delivery, written as fixed SQL with typed binds.
//!
//! Diesel marks every `UPDATE` and every `Insertable` insert on PostgreSQL as unsafe to cache,
//! so each one costs an extra round trip to prepare it. These statements have fixed SQL text,
//! are prepared once per connection, and run in one round trip each (measured in
//! docs/benchmarks.md). The SQL is plain ANSI with `ON CONFLICT`, valid on PostgreSQL and
//! SQLite; placeholders come from the backend.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer, SmallInt, Text};
use diesel::sqlite::Sqlite;

use super::types::{Json, Payload, UtcTs};
use crate::time::Timestamp;

/// Pushes literal SQL and `[SqlType: value]` binds in order.
macro_rules! sql {
    ($out:ident;) => {};
    ($out:ident; $lit:literal $($rest:tt)*) => {
        $out.push_sql($lit);
        sql!($out; $($rest)*);
    };
    ($out:ident; [$st:ty : $val:expr] $($rest:tt)*) => {
        $out.push_bind_param::<$st, _>($val)?;
        sql!($out; $($rest)*);
    };
}

/// Declares a statement: its SQL on every backend, a static query id (so the prepared
/// statement is cached).
macro_rules! statement {
    ($name:ident, |$self_:ident, $out:ident| { $($sql:tt)* }) => {
        impl QueryFragment<Pg> for $name<'_> {
            fn walk_ast<'b>(&'b $self_, mut $out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                sql!($out; $($sql)*);
                Ok(())
            }
        }
        impl QueryFragment<Sqlite> for $name<'_> {
            fn walk_ast<'b>(&'b $self_, mut $out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
                sql!($out; $($sql)*);
                Ok(())
            }
        }
        impl QueryId for $name<'_> {
            type QueryId = $name<'static>;
            const HAS_STATIC_QUERY_ID: bool = true;
        }
    };
}

/// Records a payment callback; affects 0 rows when `(out_trade_no, channel)` exists.
pub struct InsertPayCallback<'a> {
    pub out_trade_no: &'a str,
    pub channel: &'a str,
    pub transaction_id: &'a str,
    pub amount_fen: i64,
    pub digest: &'a str,
    pub created_at: Timestamp,
}

statement!(InsertPayCallback, |self, out| {
    "INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) VALUES ("
    [Text: self.out_trade_no] ", " [Text: self.channel] ", " [Text: self.transaction_id] ", "
    [BigInt: &self.amount_fen] ", " [Text: self.digest] ", " [UtcTs: &self.created_at]
    ") ON CONFLICT (out_trade_no, channel) DO NOTHING"
});

/// The payment compare-and-set: `WAIT_PAY → PAID` only when amount and currency match.
pub struct MarkPaid<'a> {
    pub order_no: &'a str,
    pub amount_fen: i64,
    pub currency: &'a str,
    pub channel: &'a str,
    pub transaction_id: &'a str,
    pub paid_at: Timestamp,
}

statement!(MarkPaid, |self, out| {
    "UPDATE orders SET status = 'PAID', channel = " [Text: self.channel]
    ", transaction_id = " [Text: self.transaction_id] ", paid_at = " [UtcTs: &self.paid_at]
    " WHERE order_no = " [Text: self.order_no] " AND status = 'WAIT_PAY' AND amount_fen = "
    [BigInt: &self.amount_fen] " AND currency = " [Text: self.currency]
});

/// A new pending outbox message. `ONCE = false`: fails on an existing `(topic, biz_key)`
/// (an event the transaction just earned, so a clash is a bug that must roll it back).
/// `ONCE = true`: affects 0 rows when the message exists (an anomaly is recorded once).
pub struct InsertMessage<'a, const ONCE: bool = false> {
    pub topic: &'a str,
    pub biz_key: &'a str,
    pub payload: Payload,
    pub status: i16,
    pub attempts: i32,
    pub now: Timestamp,
}

impl<const ONCE: bool> InsertMessage<'_, ONCE> {
    fn walk<'b, DB>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()>
    where
        DB: diesel::backend::Backend,
        str: diesel::serialize::ToSql<Text, DB>,
        i16: diesel::serialize::ToSql<SmallInt, DB>,
        i32: diesel::serialize::ToSql<Integer, DB>,
        Payload: diesel::serialize::ToSql<Json, DB>,
        Timestamp: diesel::serialize::ToSql<UtcTs, DB>,
        DB: diesel::sql_types::HasSqlType<Json> + diesel::sql_types::HasSqlType<UtcTs>,
    {
        sql!(out;
            "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) VALUES ("
            [Text: self.topic] ", " [Text: self.biz_key] ", " [Json: &self.payload] ", "
            [SmallInt: &self.status] ", " [Integer: &self.attempts] ", " [UtcTs: &self.now] ", "
            [UtcTs: &self.now] ")"
        );
        if ONCE {
            out.push_sql(" ON CONFLICT (topic, biz_key) DO NOTHING");
        }
        Ok(())
    }
}

impl<const ONCE: bool> QueryFragment<Pg> for InsertMessage<'_, ONCE> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.walk(out)
    }
}

impl<const ONCE: bool> QueryFragment<Sqlite> for InsertMessage<'_, ONCE> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        self.walk(out)
    }
}

impl<const ONCE: bool> QueryId for InsertMessage<'_, ONCE> {
    type QueryId = InsertMessage<'static, ONCE>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<'a, const ONCE: bool> InsertMessage<'a, ONCE> {
    fn of(message: &'a crate::outbox::Message, now: Timestamp) -> Self {
        Self {
            topic: message.topic.as_str(),
            biz_key: &message.biz_key,
            payload: Payload(message.payload.clone()),
            status: crate::outbox::status::PENDING,
            attempts: 0,
            now,
        }
    }
}

impl<'a> InsertMessage<'a, false> {
    /// The message, pending from `now`.
    pub fn pending(message: &'a crate::outbox::Message, now: Timestamp) -> Self {
        Self::of(message, now)
    }
}

impl<'a> InsertMessage<'a, true> {
    /// The message, pending from `now`, unless it exists.
    pub fn once(message: &'a crate::outbox::Message, now: Timestamp) -> Self {
        Self::of(message, now)
    }
}
