//! What only the console reads: recorded anomalies and recent orders by status.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::order::{Order, OrderStatus};
use crate::store::schema::{orders, payment_anomaly};
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// A `PAYMENT_ANOMALY` as recorded (`payment_anomaly`).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = payment_anomaly)]
pub struct Anomaly {
    pub biz_key: String,
    pub order_no: String,
    pub payload: Payload,
    pub created_at: Timestamp,
}

impl Store {
    /// The newest anomalies.
    pub async fn recent_anomalies(&self, limit: i64) -> Result<Vec<Anomaly>, StoreError> {
        with_conn!(self, conn => {
            Ok(payment_anomaly::table
                .select(Anomaly::as_select())
                .order(payment_anomaly::created_at.desc())
                .limit(limit)
                .load(conn)
                .await?)
        })
    }

    /// The newest orders, of one status or all (`orders_created_at` keeps this an index
    /// scan on a year of orders).
    pub async fn recent_orders(
        &self,
        status: Option<OrderStatus>,
        limit: i64,
    ) -> Result<Vec<Order>, StoreError> {
        with_conn!(self, conn => {
            let mut query = orders::table
                .select(Order::as_select())
                .order(orders::created_at.desc())
                .limit(limit)
                .into_boxed();
            if let Some(status) = status {
                query = query.filter(orders::status.eq(status));
            }
            Ok(query.load(conn).await?)
        })
    }
}
