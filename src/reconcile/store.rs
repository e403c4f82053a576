//! The queries of the reconcile and expiry jobs: which unpaid orders to ask the providers
//! about, and when to ask again.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::order::OrderStatus;
use crate::store::schema::orders;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// An order as the reconcile and expiry jobs see it (unpaid, but for the admin endpoint).
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct OrderAtProvider {
    pub order_no: String,
    pub status: OrderStatus,
    /// The merchant/app named at creation; `None`: every one with credentials.
    pub wechat_mchid: Option<String>,
    pub alipay_app_id: Option<String>,
    pub expire_at: Timestamp,
    /// Closes at the provider that failed so far (the backoff's exponent).
    pub close_attempts: i32,
}

type Columns = (
    orders::order_no,
    orders::status,
    orders::wechat_mchid,
    orders::alipay_app_id,
    orders::expire_at,
    orders::close_attempts,
);

const COLUMNS: Columns = (
    orders::order_no,
    orders::status,
    orders::wechat_mchid,
    orders::alipay_app_id,
    orders::expire_at,
    orders::close_attempts,
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
        with_conn!(self, conn => {
            Ok(orders::table
                .filter(orders::status.eq(OrderStatus::WaitPay))
                .filter(orders::created_at.le(created_before))
                .filter(orders::expire_at.gt(now))
                .filter(orders::next_query_at.is_null().or(orders::next_query_at.le(now)))
                .order(orders::created_at.asc())
                .select(COLUMNS)
                .limit(limit)
                .load(conn)
                .await?)
        })
    }

    /// Unpaid orders past `expire_at`, oldest deadline first: those no close at the provider
    /// failed for yet, and those whose backoff after a failed close is over (a query's
    /// `next_query_at` does not hold back expiry).
    pub async fn expired_unpaid(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> Result<Vec<OrderAtProvider>, StoreError> {
        with_conn!(self, conn => {
            Ok(orders::table
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
                .await?)
        })
    }

    /// One order as the jobs see it, whatever its status.
    pub async fn reconcile_target(
        &self,
        order_no: &str,
    ) -> Result<Option<OrderAtProvider>, StoreError> {
        with_conn!(self, conn => {
            Ok(orders::table
                .filter(orders::order_no.eq(order_no))
                .select(COLUMNS)
                .first(conn)
                .await
                .optional()?)
        })
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
                    .filter(orders::status.eq(OrderStatus::WaitPay)),
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
