//! The statements whose SQL differs per backend, and the hot ones, written once as fixed SQL
//! with typed binds.
//!
//! Diesel marks every `UPDATE` and every `Insertable` insert on PostgreSQL as unsafe to cache,
//! so each one costs an extra round trip to prepare it. These statements have fixed SQL text,
//! are prepared once per connection, and run in one round trip each (measured in
//! docs/benchmarks.md). Placeholders come from the backend.
//!
//! Insert-unless-exists, the arbiter of first-vs-duplicate: PostgreSQL and SQLite say
//! `ON CONFLICT (key) DO NOTHING` and report 0 rows. MySQL has no such clause that is exact:
//! `INSERT IGNORE` also swallows truncation and type errors, and the affected-rows value of
//! `ON DUPLICATE KEY UPDATE` (1, 2 or 0, and `CLIENT_FOUND_ROWS` changes it) is ambiguous. So
//! on MySQL the plain insert fails with error 1062 naming the key — InnoDB rolls back that
//! statement alone, the transaction goes on — and [`unless_exists`] turns exactly that error,
//! for exactly that key, into 0 rows.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::Sqlite;

use super::types::{Json, Payload, UtcTs};
use crate::notice::{Digest, Notice};
use crate::time::Timestamp;

/// The unique key a MySQL duplicate-key error names: the primary key.
pub const PRIMARY: &str = "PRIMARY";

/// The rows an insert-unless-exists wrote: MySQL's duplicate-key error (1062) for `key`
/// becomes 0, as `ON CONFLICT DO NOTHING` reports elsewhere. Any other error stays an error.
pub fn unless_exists(result: QueryResult<usize>, key: &str) -> QueryResult<usize> {
    match result {
        // "Duplicate entry '…' for key 'PRIMARY'" (MariaDB), "… for key 'orders.PRIMARY'"
        // (MySQL 8).
        Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, info))
            if info.message().ends_with(&format!("'{key}'"))
                || info.message().ends_with(&format!(".{key}'")) =>
        {
            Ok(0)
        }
        other => other,
    }
}

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
    ($out:ident; {$text:expr} $($rest:tt)*) => {
        $out.push_sql($text);
        sql!($out; $($rest)*);
    };
}

/// "The order is waiting", for a statement that finds the order by its primary key. Written
/// as an expression of the column, which no partial index's `WHERE status = 'WAIT_PAY'` can
/// serve, so the planner has only the primary key to find the row by: with statistics taken
/// while no order waited, reading a whole partial index looked cheaper than one lookup, and
/// was read whole once per statement while a sale filled it (docs/design.md, "Plans that do
/// not depend on statistics"). The same SQL on every backend (`status` is `NOT NULL`).
pub const WAITING: &str = "COALESCE(status, '') = 'WAIT_PAY'";

/// Declares a statement: its SQL on every backend and a static query id (so the prepared
/// statement is cached). `unless_exists:` is the `ON CONFLICT … DO NOTHING` clause, written on
/// PostgreSQL and SQLite only (MySQL: see [`unless_exists`]).
macro_rules! statement {
    ($name:ident, |$self_:ident, $out:ident| { $($sql:tt)* } $(, unless_exists: $conflict:literal)?) => {
        impl QueryFragment<Pg> for $name<'_> {
            fn walk_ast<'b>(&'b $self_, mut $out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                sql!($out; $($sql)*);
                $( $out.push_sql($conflict); )?
                Ok(())
            }
        }
        impl QueryFragment<Sqlite> for $name<'_> {
            fn walk_ast<'b>(&'b $self_, mut $out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
                sql!($out; $($sql)*);
                $( $out.push_sql($conflict); )?
                Ok(())
            }
        }
        impl QueryFragment<Mysql> for $name<'_> {
            fn walk_ast<'b>(&'b $self_, mut $out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
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

/// Records a payment callback; 0 rows when `(out_trade_no, channel)` exists.
pub struct InsertPayCallback<'a> {
    pub out_trade_no: &'a str,
    pub channel: &'a str,
    pub transaction_id: &'a str,
    pub amount_fen: i64,
    pub digest: &'a str,
    pub created_at: Timestamp,
    /// When the provider says it was paid, if the notice says.
    pub occurred_at: Option<Timestamp>,
}

impl<'a> InsertPayCallback<'a> {
    /// The callback row of a payment notice.
    pub fn of(n: &'a Notice, digest: &'a Digest, created_at: Timestamp) -> Self {
        Self {
            out_trade_no: &n.out_trade_no,
            channel: n.channel.as_str(),
            transaction_id: &n.transaction_id,
            amount_fen: n.amount_fen,
            digest: digest.as_str(),
            created_at,
            occurred_at: n.occurred_at,
        }
    }
}

statement!(InsertPayCallback, |self, out| {
    "INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at, occurred_at) VALUES ("
    [Text: self.out_trade_no] ", " [Text: self.channel] ", " [Text: self.transaction_id] ", "
    [BigInt: &self.amount_fen] ", " [Text: self.digest] ", " [UtcTs: &self.created_at] ", "
    [Nullable<UtcTs>: &self.occurred_at] ")"
}, unless_exists: " ON CONFLICT (out_trade_no, channel) DO NOTHING");

/// Gives the callback row of an order to the payment `paid`, taking it from the payment
/// `held_by` (another account's, recorded as a `MERCHANT_MISMATCH`): 1 row, or 0 when
/// another transaction took it first.
pub struct ReplacePayCallback<'a> {
    pub paid: InsertPayCallback<'a>,
    pub held_by: &'a str,
}

statement!(ReplacePayCallback, |self, out| {
    "UPDATE pay_callback SET transaction_id = " [Text: self.paid.transaction_id]
    ", amount_fen = " [BigInt: &self.paid.amount_fen] ", digest = " [Text: self.paid.digest]
    ", created_at = " [UtcTs: &self.paid.created_at]
    ", occurred_at = " [Nullable<UtcTs>: &self.paid.occurred_at]
    " WHERE out_trade_no = " [Text: self.paid.out_trade_no] " AND channel = " [Text: self.paid.channel]
    " AND transaction_id = " [Text: self.held_by]
});

/// Records a refund callback; 0 rows when `(out_refund_no, channel, out_trade_no)` exists.
pub struct InsertRefundCallback<'a> {
    pub out_refund_no: &'a str,
    pub channel: &'a str,
    pub out_trade_no: &'a str,
    pub refund_id: &'a str,
    pub refund_fen: i64,
    pub status: &'a str,
    pub digest: &'a str,
    pub created_at: Timestamp,
    /// When the provider says it was refunded, if the notice says.
    pub occurred_at: Option<Timestamp>,
    /// The trade's running refund total the provider reported with it (Alipay), if any.
    pub running_total_fen: Option<i64>,
}

statement!(InsertRefundCallback, |self, out| {
    "INSERT INTO refund_callback (out_refund_no, channel, out_trade_no, refund_id, refund_fen, status, digest, created_at, occurred_at, running_total_fen) VALUES ("
    [Text: self.out_refund_no] ", " [Text: self.channel] ", " [Text: self.out_trade_no] ", "
    [Text: self.refund_id] ", " [BigInt: &self.refund_fen] ", " [Text: self.status] ", "
    [Text: self.digest] ", " [UtcTs: &self.created_at] ", " [Nullable<UtcTs>: &self.occurred_at] ", " [Nullable<BigInt>: &self.running_total_fen] ")"
}, unless_exists: " ON CONFLICT (out_refund_no, channel, out_trade_no) DO NOTHING");

/// Records a notification that changes no order; 0 rows when it was recorded before.
pub struct InsertStatusCallback<'a> {
    pub out_trade_no: &'a str,
    pub channel: &'a str,
    pub transaction_id: &'a str,
    pub status: &'a str,
    pub amount_fen: i64,
    pub created_at: Timestamp,
}

statement!(InsertStatusCallback, |self, out| {
    "INSERT INTO status_callback (out_trade_no, channel, transaction_id, status, amount_fen, created_at) VALUES ("
    [Text: self.out_trade_no] ", " [Text: self.channel] ", " [Text: self.transaction_id] ", "
    [Text: self.status] ", " [BigInt: &self.amount_fen] ", " [UtcTs: &self.created_at] ")"
}, unless_exists: " ON CONFLICT (out_trade_no, channel, transaction_id, status) DO NOTHING");

/// A new order; 0 rows when `order_no` exists.
pub struct InsertOrder<'a> {
    pub order: &'a crate::order::NewOrder,
}

statement!(InsertOrder, |self, out| {
    "INSERT INTO orders (order_no, amount_fen, currency, subject, created_at, expire_at, combine_out_trade_no) VALUES ("
    [Text: &self.order.order_no] ", " [BigInt: &self.order.amount_fen] ", "
    [Text: &self.order.currency] ", " [Text: &self.order.subject] ", "
    [UtcTs: &self.order.created_at] ", " [UtcTs: &self.order.expire_at] ", "
    [Nullable<Text>: &self.order.combine_out_trade_no] ")"
}, unless_exists: " ON CONFLICT (order_no) DO NOTHING");

/// A new combination (`combined_order`); 0 rows when its number exists.
pub struct InsertCombination<'a> {
    pub combine_out_trade_no: &'a str,
    pub channel: &'a str,
    pub account: &'a str,
    pub amount_fen: i64,
    pub sub_order_count: i32,
    pub sub_orders: &'a str,
    pub request_digest: &'a str,
    pub created_at: Timestamp,
    pub expire_at: Timestamp,
}

statement!(InsertCombination, |self, out| {
    "INSERT INTO combined_order (combine_out_trade_no, channel, account, amount_fen, sub_order_count, sub_orders, request_digest, created_at, expire_at) VALUES ("
    [Text: self.combine_out_trade_no] ", " [Text: self.channel] ", " [Text: self.account] ", "
    [BigInt: &self.amount_fen] ", " [diesel::sql_types::Integer: &self.sub_order_count] ", "
    [Text: self.sub_orders] ", " [Text: self.request_digest] ", "
    [UtcTs: &self.created_at] ", " [UtcTs: &self.expire_at] ")"
}, unless_exists: " ON CONFLICT (combine_out_trade_no) DO NOTHING");

/// The account a new order names for one channel, written in the order's transaction right
/// after [`InsertOrder`] wrote the order. A row already there is an error: orders are never
/// removed, so it would be another order's account.
pub struct InsertOrderAccount<'a> {
    pub order_no: &'a str,
    pub channel: &'a str,
    pub account: &'a str,
}

statement!(InsertOrderAccount, |self, out| {
    "INSERT INTO order_account (order_no, channel, account) VALUES ("
    [Text: self.order_no] ", " [Text: self.channel] ", " [Text: self.account] ")"
});

/// Claims an `Idempotency-Key` for a request; 0 rows when the key exists.
pub struct ClaimIdempotencyKey<'a> {
    pub key: &'a str,
    pub request_digest: &'a str,
    pub created_at: Timestamp,
}

statement!(ClaimIdempotencyKey, |self, out| {
    "INSERT INTO idempotency_key (idem_key, request_digest, response_status, response_body, created_at) VALUES ("
    [Text: self.key] ", " [Text: self.request_digest] ", 0, '', " [UtcTs: &self.created_at] ")"
}, unless_exists: " ON CONFLICT (idem_key) DO NOTHING");

/// The payment compare-and-set: `WAIT_PAY → PAID` only when amount and currency match, and
/// the order names no other account of the channel ([`OWNED_BY_OTHER`]).
pub struct MarkPaid<'a> {
    pub order_no: &'a str,
    pub amount_fen: i64,
    pub currency: &'a str,
    pub channel: &'a str,
    pub account: &'a str,
    pub transaction_id: &'a str,
    pub paid_at: Timestamp,
}

impl<'a> MarkPaid<'a> {
    /// The compare-and-set a payment notice asks for.
    pub fn of(n: &'a Notice, paid_at: Timestamp) -> Self {
        Self {
            order_no: &n.out_trade_no,
            amount_fen: n.amount_fen,
            currency: &n.currency,
            channel: n.channel.as_str(),
            account: n.account(),
            transaction_id: &n.transaction_id,
            paid_at,
        }
    }
}

/// The owner check: the order (`orders.order_no`, or the alias the statement gives) names
/// another account of the channel in `order_account`. Reached by that table's primary key.
/// An order paid by an account it does not name is a `MERCHANT_MISMATCH`, never a payment.
macro_rules! owned_by_other {
    ($order:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM order_account oa WHERE oa.order_no = ",
            $order,
            " AND oa.channel = "
        )
    };
}

// A sub-order of a combination is not moved here: its `ORDER_PAID` names the combination,
// which only the full transaction reads (`MarkSubPaid`).
statement!(MarkPaid, |self, out| {
    "UPDATE orders SET status = 'PAID', channel = " [Text: self.channel]
    ", transaction_id = " [Text: self.transaction_id] ", paid_at = " [UtcTs: &self.paid_at]
    " WHERE order_no = " [Text: self.order_no] " AND " {WAITING} " AND amount_fen = "
    [BigInt: &self.amount_fen] " AND currency = " [Text: self.currency]
    " AND combine_out_trade_no IS NULL"
    " AND NOT " {owned_by_other!("orders.order_no")} [Text: self.channel]
    " AND oa.account <> " [Text: self.account] ")"
});

/// [`MarkPaid`] for a sub-order of the combination `combination`: the same checks, and the
/// order must be a sub-order of exactly that combination.
pub struct MarkSubPaid<'a> {
    pub paid: MarkPaid<'a>,
    pub combination: &'a str,
}

statement!(MarkSubPaid, |self, out| {
    "UPDATE orders SET status = 'PAID', channel = " [Text: self.paid.channel]
    ", transaction_id = " [Text: self.paid.transaction_id] ", paid_at = " [UtcTs: &self.paid.paid_at]
    " WHERE order_no = " [Text: self.paid.order_no] " AND " {WAITING} " AND amount_fen = "
    [BigInt: &self.paid.amount_fen] " AND currency = " [Text: self.paid.currency]
    " AND combine_out_trade_no = " [Text: self.combination]
    " AND NOT " {owned_by_other!("orders.order_no")} [Text: self.paid.channel]
    " AND oa.account <> " [Text: self.paid.account] ")"
});

/// A new pending outbox message, an event the transaction just earned (written once by the
/// compare-and-set or callback row that earned it, or by [`InsertAnomaly`]).
pub struct InsertMessage<'a> {
    pub topic: &'a str,
    pub biz_key: &'a str,
    pub payload: Payload,
    pub now: Timestamp,
}

statement!(InsertMessage, |self, out| {
    "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) VALUES ("
    [Text: self.topic] ", " [Text: self.biz_key] ", " [Json: &self.payload] ", 0, 0, "
    [UtcTs: &self.now] ", " [UtcTs: &self.now] ")"
});

/// Records a payment anomaly under its message's key; 0 rows when the key exists: an anomaly
/// is raised once, however often what raises it arrives. Its outbox message is written only
/// when this wrote a row (`local_message` is partitioned by time and keeps no key that could
/// tell).
pub struct InsertAnomaly<'a> {
    pub biz_key: &'a str,
    pub order_no: &'a str,
    pub payload: Payload,
    pub created_at: Timestamp,
}

statement!(InsertAnomaly, |self, out| {
    "INSERT INTO payment_anomaly (biz_key, order_no, payload, created_at) VALUES ("
    [Text: self.biz_key] ", " [Text: self.order_no] ", " [Json: &self.payload] ", "
    [UtcTs: &self.created_at] ")"
}, unless_exists: " ON CONFLICT (biz_key) DO NOTHING");

impl<'a> InsertAnomaly<'a> {
    /// The anomaly row of a `PAYMENT_ANOMALY` message.
    pub fn of(message: &'a crate::outbox::Message, created_at: Timestamp) -> Self {
        Self {
            biz_key: &message.biz_key,
            order_no: message.payload["order_no"].as_str().unwrap_or_default(),
            payload: Payload(message.payload.clone()),
            created_at,
        }
    }
}

impl<'a> InsertMessage<'a> {
    /// The message, pending from `now`.
    pub fn pending(message: &'a crate::outbox::Message, now: Timestamp) -> Self {
        Self {
            topic: message.topic.as_str(),
            biz_key: &message.biz_key,
            payload: Payload(message.payload.clone()),
            now,
        }
    }
}

/// PostgreSQL: a payment's common case — its first delivery, for an order that is waiting for
/// exactly this amount — as ONE statement, run on its own (one round trip, committed by
/// itself), in place of `BEGIN`, [`InsertPayCallback`], [`MarkPaid`], [`InsertMessage`],
/// `COMMIT`.
///
/// The order row is locked first, found by its primary key and only while it waits for exactly
/// this amount and currency (`FOR UPDATE`, which under READ COMMITTED waits for a concurrent
/// writer and re-checks the row as it committed; a duplicate of a paid order locks nothing).
/// So once `target` holds the order, nothing else can move it before this statement commits.
/// Every table is reached by its primary key and nothing else (see [`WAITING`]), whatever the
/// statistics say. The callback row is written
/// only for a locked, waiting order, and only if its key is new (`ON CONFLICT DO NOTHING`,
/// the arbiter as everywhere else); the order moves only with a new callback row, and the
/// `ORDER_PAID` message only with the move. So the statement writes all three rows or none.
/// The last column checks that once more: a callback row without its message is cast to an
/// error, which undoes the whole statement.
///
/// It answers `(applied, seen_digest, guard)`: `applied` is 1 when the three rows were
/// written; `seen_digest` is the digest of this key's callback row as committed before the
/// statement began (`NULL` when there was none). Anything but `applied = 1` or a seen digest
/// equal to the notice's wrote nothing, and goes through the full transaction, which decides
/// every other case (duplicates racing a first delivery, conflicts, anomalies, unknown orders).
pub struct PayFirst<'a> {
    pub out_trade_no: &'a str,
    pub channel: &'a str,
    pub account: &'a str,
    pub transaction_id: &'a str,
    pub amount_fen: i64,
    pub currency: &'a str,
    pub digest: &'a str,
    pub now: Timestamp,
    pub occurred_at: Option<Timestamp>,
    pub payload: Payload,
}

impl QueryFragment<Pg> for PayFirst<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        sql!(out;
            "WITH target AS (SELECT order_no FROM orders WHERE order_no = " [Text: self.out_trade_no]
            " AND " {WAITING} " AND amount_fen = " [BigInt: &self.amount_fen]
            " AND currency = " [Text: self.currency] " AND combine_out_trade_no IS NULL"
            " AND NOT " {owned_by_other!("orders.order_no")} [Text: self.channel]
            " AND oa.account <> " [Text: self.account] ") FOR UPDATE), "
            "cb AS (INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at, occurred_at) "
            "SELECT order_no, " [Text: self.channel] ", " [Text: self.transaction_id] ", "
            [BigInt: &self.amount_fen] ", " [Text: self.digest] ", " [UtcTs: &self.now] ", "
            [Nullable<UtcTs>: &self.occurred_at]
            " FROM target ON CONFLICT (out_trade_no, channel) DO NOTHING RETURNING out_trade_no), "
            "paid AS (UPDATE orders SET status = 'PAID', channel = " [Text: self.channel]
            ", transaction_id = " [Text: self.transaction_id] ", paid_at = " [UtcTs: &self.now]
            " WHERE order_no = (SELECT out_trade_no FROM cb) AND " {WAITING} " RETURNING order_no), "
            "message AS (INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) "
            "SELECT 'ORDER_PAID', order_no, " [Json: &self.payload] ", 0, 0, " [UtcTs: &self.now]
            ", " [UtcTs: &self.now] " FROM paid RETURNING 1) "
            "SELECT (SELECT count(*) FROM message), "
            "(SELECT digest FROM pay_callback WHERE out_trade_no = " [Text: self.out_trade_no]
            " AND channel = " [Text: self.channel] "), "
            "CAST(CASE WHEN (SELECT count(*) FROM cb) = (SELECT count(*) FROM message) THEN '0' "
            "ELSE 'paynotify: a callback row without its order change, undone: ' || (SELECT count(*) FROM cb) END AS bigint)"
        );
        Ok(())
    }
}

impl QueryId for PayFirst<'_> {
    type QueryId = PayFirst<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for PayFirst<'_> {
    type SqlType = (BigInt, diesel::sql_types::Nullable<Text>, BigInt);
}

/// PostgreSQL: [`PayFirst`] for a group of payments at once — one statement, one commit for
/// all of them (see `store/group.rs`). Every notice in it names a different order.
///
/// The same rules per notice: the waiting order rows are locked first, found by their primary
/// keys (`= ANY` of the group's keys, never a join the planner could hash over a whole index;
/// `FOR UPDATE`, in `order_no` order), skipping any that another transaction holds (`SKIP LOCKED`: that notice is left
/// undecided and takes the ordinary path, which waits for the lock, so one busy order never
/// holds up a whole group), a callback row is written only
/// for a locked order waiting for exactly its amount and only if its key is new, the order
/// moves only with a new callback row, `ORDER_PAID` only with the move, and a callback row
/// without its message is cast to an error that undoes the whole statement. It answers one row
/// per notice: `(position, applied, seen_digest, guard)`, `position` counting from 1 in the
/// order the arrays were bound.
pub struct PayGroup<'a> {
    pub out_trade_no: Vec<&'a str>,
    pub channel: Vec<&'a str>,
    pub account: Vec<&'a str>,
    pub transaction_id: Vec<&'a str>,
    pub amount_fen: Vec<i64>,
    pub currency: Vec<&'a str>,
    pub digest: Vec<&'a str>,
    pub payload: Vec<Payload>,
    pub now: Vec<Timestamp>,
    pub occurred_at: Vec<Option<Timestamp>>,
}

impl QueryFragment<Pg> for PayGroup<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        use diesel::sql_types::Array;
        sql!(out;
            "WITH input AS (SELECT * FROM unnest("
            [Array<Text>: &self.out_trade_no] ", " [Array<Text>: &self.channel] ", "
            [Array<Text>: &self.transaction_id] ", " [Array<BigInt>: &self.amount_fen] ", "
            [Array<Text>: &self.currency] ", " [Array<Text>: &self.digest] ", "
            [Array<Json>: &self.payload] ", " [Array<UtcTs>: &self.now] ", "
            [Array<Nullable<UtcTs>>: &self.occurred_at] ", " [Array<Text>: &self.account]
            ") WITH ORDINALITY AS i(out_trade_no, channel, transaction_id, amount_fen, currency, digest, payload, now, occurred_at, account, position)), "
            "locked AS (SELECT order_no, amount_fen, currency FROM orders "
            "WHERE order_no = ANY(ARRAY(SELECT out_trade_no FROM input)) AND " {WAITING}
            " AND combine_out_trade_no IS NULL ORDER BY order_no FOR UPDATE SKIP LOCKED), "
            "target AS (SELECT l.order_no FROM locked l JOIN input i ON i.out_trade_no = l.order_no "
            "WHERE l.amount_fen = i.amount_fen AND l.currency = i.currency AND NOT "
            {owned_by_other!("l.order_no")} "i.channel AND oa.account <> i.account)), "
            "cb AS (INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at, occurred_at) "
            "SELECT i.out_trade_no, i.channel, i.transaction_id, i.amount_fen, i.digest, i.now, i.occurred_at"
            " FROM input i JOIN target t ON t.order_no = i.out_trade_no "
            "ON CONFLICT (out_trade_no, channel) DO NOTHING RETURNING out_trade_no), "
            "paid AS (UPDATE orders o SET status = 'PAID', channel = i.channel, transaction_id = i.transaction_id, paid_at = i.now"
            " FROM input i WHERE o.order_no = ANY(ARRAY(SELECT out_trade_no FROM cb)) "
            "AND i.out_trade_no = o.order_no AND " {WAITING} " RETURNING o.order_no), "
            "message AS (INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) "
            "SELECT 'ORDER_PAID', i.out_trade_no, i.payload, 0, 0, i.now, i.now"
            " FROM input i JOIN paid p ON p.order_no = i.out_trade_no RETURNING biz_key) "
            "SELECT i.position, i.out_trade_no IN (SELECT biz_key FROM message), "
            "(SELECT pc.digest FROM pay_callback pc WHERE pc.out_trade_no = i.out_trade_no AND pc.channel = i.channel), "
            "CAST(CASE WHEN (SELECT count(*) FROM cb) = (SELECT count(*) FROM message) THEN '0' "
            "ELSE 'paynotify: a callback row without its order change, undone: ' || (SELECT count(*) FROM cb) END AS bigint) "
            "FROM input i"
        );
        Ok(())
    }
}

impl QueryId for PayGroup<'_> {
    type QueryId = PayGroup<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for PayGroup<'_> {
    type SqlType = (BigInt, diesel::sql_types::Bool, Nullable<Text>, BigInt);
}
