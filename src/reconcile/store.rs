//! The queries of the reconcile and expiry jobs: which unpaid orders to ask the providers
//! about, and when to ask again.

use std::collections::HashMap;

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::notice::ChannelId;
use crate::order::OrderStatus;
use crate::store::schema::{order_account, orders};
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// An order as the reconcile and expiry jobs see it (unpaid, but for the admin endpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderAtProvider {
    pub order_no: String,
    pub status: OrderStatus,
    /// The accounts named at creation, at most one per channel; none: every one with
    /// credentials.
    pub accounts: Vec<NamedAccount>,
    pub expire_at: Timestamp,
    /// Closes at the provider that failed so far (the backoff's exponent).
    pub close_attempts: i32,
    /// The combination a sub-order belongs to; `None` for an ordinary order.
    pub combine_out_trade_no: Option<String>,
}

/// One row of `order_account`: the account an order is paid through on one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedAccount {
    /// As stored ([`ChannelId::as_str`]).
    pub channel: String,
    pub account: String,
}

impl OrderAtProvider {
    /// The account the order names on `channel`, if it names one there.
    pub fn account_on(&self, channel: ChannelId) -> Option<&str> {
        self.accounts
            .iter()
            .find(|named| named.channel == channel.as_str())
            .map(|named| named.account.as_str())
    }
}

/// The columns of `orders` an [`OrderAtProvider`] is built from.
#[derive(Queryable)]
struct Row {
    order_no: String,
    status: OrderStatus,
    expire_at: Timestamp,
    close_attempts: i32,
    combine_out_trade_no: Option<String>,
}

type Columns = (
    orders::order_no,
    orders::status,
    orders::expire_at,
    orders::close_attempts,
    orders::combine_out_trade_no,
);

const COLUMNS: Columns = (
    orders::order_no,
    orders::status,
    orders::expire_at,
    orders::close_attempts,
    orders::combine_out_trade_no,
);

impl Store {
    /// Unpaid orders created before `created_before` and not yet expired, not asked about
    /// since their `next_query_at`, oldest first.
    pub async fn orders_to_query(
        &self,
        now: Timestamp,
        created_before: Timestamp,
        limit: i64,
    ) -> Result<Vec<OrderAtProvider>, StoreError> {
        let rows: Vec<Row> = with_conn!(self, conn => {
            orders::table
                .filter(orders::status.eq(OrderStatus::WaitPay))
                .filter(orders::created_at.le(created_before))
                .filter(orders::expire_at.gt(now))
                .filter(orders::next_query_at.is_null().or(orders::next_query_at.le(now)))
                .order(orders::created_at.asc())
                .select(COLUMNS)
                .limit(limit)
                .load(conn)
                .await?
        });
        self.with_accounts(rows).await
    }

    /// Unpaid orders past `expire_at`, oldest deadline first: those no close at the provider
    /// failed for yet, and those whose backoff after a failed close is over (a query's
    /// `next_query_at` does not hold back expiry).
    pub async fn expired_unpaid(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> Result<Vec<OrderAtProvider>, StoreError> {
        let rows: Vec<Row> = with_conn!(self, conn => {
            orders::table
                .filter(orders::status.eq(OrderStatus::WaitPay))
                .filter(orders::expire_at.le(now))
                .filter(
                    orders::close_attempts
                        .eq(0)
                        .or(orders::next_query_at.is_null())
                        .or(orders::next_query_at.le(now)),
                )
                .order(orders::expire_at.asc())
                .select(COLUMNS)
                .limit(limit)
                .load(conn)
                .await?
        });
        self.with_accounts(rows).await
    }

    /// One order as the jobs see it, whatever its status.
    pub async fn reconcile_target(
        &self,
        order_no: &str,
    ) -> Result<Option<OrderAtProvider>, StoreError> {
        let row: Option<Row> = with_conn!(self, conn => {
            orders::table
                .filter(orders::order_no.eq(order_no))
                .select(COLUMNS)
                .first(conn)
                .await
                .optional()?
        });
        Ok(self.with_accounts(row.into_iter().collect()).await?.pop())
    }

    /// The orders of `rows` with the accounts each names: one query for the whole batch.
    /// An order's accounts are committed with it and never change, so reading them after
    /// the order (on another connection) sees all of them.
    async fn with_accounts(&self, rows: Vec<Row>) -> Result<Vec<OrderAtProvider>, StoreError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let order_nos: Vec<&str> = rows.iter().map(|row| row.order_no.as_str()).collect();
        let named: Vec<(String, String, String)> = with_conn!(self, conn => {
            order_account::table
                .filter(order_account::order_no.eq_any(&order_nos))
                .order((order_account::order_no, order_account::channel))
                .select((
                    order_account::order_no,
                    order_account::channel,
                    order_account::account,
                ))
                .load(conn)
                .await?
        });
        let mut by_order: HashMap<String, Vec<NamedAccount>> = HashMap::new();
        for (order_no, channel, account) in named {
            by_order
                .entry(order_no)
                .or_default()
                .push(NamedAccount { channel, account });
        }
        Ok(rows
            .into_iter()
            .map(|row| OrderAtProvider {
                accounts: by_order.remove(&row.order_no).unwrap_or_default(),
                order_no: row.order_no,
                status: row.status,
                expire_at: row.expire_at,
                close_attempts: row.close_attempts,
                combine_out_trade_no: row.combine_out_trade_no,
            })
            .collect())
    }

    /// Puts off the next query (or close) of an unpaid order until `at`; a failed close at
    /// the provider also counts one more attempt.
    pub async fn query_again_at(
        &self,
        order_no: &str,
        at: Timestamp,
        close_failed: bool,
    ) -> Result<(), StoreError> {
        let more = i32::from(close_failed);
        with_conn!(self, conn => {
            diesel::update(
                orders::table
                    .filter(orders::order_no.eq(order_no))
                    .filter(crate::store::still_waiting()),
            )
            .set((
                orders::next_query_at.eq(Some(at)),
                orders::close_attempts.eq(orders::close_attempts + more),
            ))
            .execute(conn)
            .await?;
            Ok(())
        })
    }
}
