//! Orders: creation with `Idempotency-Key` replay, reads, and the callbacks recorded for one.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde::Serialize;

use super::schema::{idempotency_key, orders, pay_callback, refund_callback, status_callback};
use super::statements::{
    ClaimIdempotencyKey, InsertOrder, InsertOrderAccount, PRIMARY, unless_exists,
};
use super::{Store, StoreError, with_conn};
use crate::notice::Digest;
use crate::order::{NewOrder, Order};
use crate::time::Timestamp;

/// What `POST /orders` did, before it is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a short-lived answer, matched at once by its caller"
)]
pub enum CreateOutcome {
    Created(Order),
    /// An order with this `order_no` exists already.
    OrderExists,
}

/// An HTTP answer as stored for replay: status and exact body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateResult {
    /// Processed now.
    Fresh(StoredResponse),
    /// The key was seen with the same request: the first answer, byte for byte.
    Replayed(StoredResponse),
    /// The key was seen with a different request.
    KeyReused,
}

/// A client's `Idempotency-Key` and the digest of the request it came with.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyKey<'a> {
    pub key: &'a str,
    pub request: &'a Digest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable, Selectable)]
#[diesel(table_name = pay_callback)]
pub struct PayCallback {
    pub out_trade_no: String,
    pub channel: String,
    pub transaction_id: String,
    pub amount_fen: i64,
    pub digest: String,
    pub created_at: Timestamp,
    /// When the provider says it was paid, if the notice said.
    pub occurred_at: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable, Selectable)]
#[diesel(table_name = refund_callback)]
pub struct RefundCallback {
    pub out_refund_no: String,
    pub channel: String,
    pub out_trade_no: String,
    pub refund_id: String,
    pub refund_fen: i64,
    pub status: String,
    pub digest: String,
    pub created_at: Timestamp,
    /// When the provider says it was refunded, if the notice said.
    pub occurred_at: Option<Timestamp>,
    /// The trade's running refund total the provider reported with it (Alipay), if any.
    pub running_total_fen: Option<i64>,
}

/// A notification recorded without changing the order (Alipay `TRADE_CLOSED`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable, Selectable)]
#[diesel(table_name = status_callback)]
pub struct StatusCallback {
    pub out_trade_no: String,
    pub channel: String,
    pub transaction_id: String,
    pub status: String,
    pub amount_fen: i64,
    pub created_at: Timestamp,
}

/// Every callback recorded for one order, oldest first in each list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Callbacks {
    pub payments: Vec<PayCallback>,
    pub refunds: Vec<RefundCallback>,
    /// Recorded and acknowledged, no state change.
    pub statuses: Vec<StatusCallback>,
}

impl Store {
    /// Creates an order and the accounts it names, in one transaction: an order that exists
    /// already gets no account written. With a key, the key row is written in the same
    /// transaction and the rendered answer is stored with it, so a repeat gets the same bytes
    /// and a concurrent repeat waits for the first and then reads its answer.
    pub async fn create_order<F>(
        &self,
        new: &NewOrder,
        idempotency: Option<IdempotencyKey<'_>>,
        render: F,
    ) -> Result<CreateResult, StoreError>
    where
        F: Fn(&CreateOutcome) -> StoredResponse + Sync,
    {
        with_conn!(self, conn => {
            conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                if let Some(idem) = idempotency {
                    let claimed = ClaimIdempotencyKey {
                        key: idem.key,
                        request_digest: idem.request.as_str(),
                        created_at: new.created_at,
                    }
                    .execute(conn)
                    .await;
                    if unless_exists(claimed, PRIMARY)? == 0 {
                        let (digest, status, body): (String, i16, String) = idempotency_key::table
                            .find(idem.key)
                            .select((
                                idempotency_key::request_digest,
                                idempotency_key::response_status,
                                idempotency_key::response_body,
                            ))
                            .first(conn)
                            .await?;
                        if digest != idem.request.as_str() {
                            return Ok(CreateResult::KeyReused);
                        }
                        let status = u16::try_from(status).unwrap_or(500);
                        return Ok(CreateResult::Replayed(StoredResponse { status, body }));
                    }
                }
                let written = InsertOrder { order: new }.execute(conn).await;
                let inserted = unless_exists(written, PRIMARY)?;
                let outcome = if inserted == 1 {
                    for (channel, account) in &new.accounts {
                        InsertOrderAccount {
                            order_no: &new.order_no,
                            channel: channel.as_str(),
                            account,
                        }
                        .execute(conn)
                        .await?;
                    }
                    let order = orders::table
                        .find(&new.order_no)
                        .select(Order::as_select())
                        .first(conn)
                        .await?;
                    CreateOutcome::Created(order)
                } else {
                    CreateOutcome::OrderExists
                };
                let response = render(&outcome);
                if let Some(idem) = idempotency {
                    diesel::update(idempotency_key::table.find(idem.key))
                        .set((
                            idempotency_key::response_status
                                .eq(i16::try_from(response.status).unwrap_or(500)),
                            idempotency_key::response_body.eq(&response.body),
                        ))
                        .execute(conn)
                        .await?;
                }
                Ok(CreateResult::Fresh(response))
            })
            .await
            .map_err(StoreError::from)
        })
    }

    pub async fn order(&self, order_no: &str) -> Result<Option<Order>, StoreError> {
        with_conn!(self, conn => {
            Ok(orders::table
                .find(order_no)
                .select(Order::as_select())
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// Every payment, refund and status callback recorded for an order.
    pub async fn callbacks_of(&self, order_no: &str) -> Result<Callbacks, StoreError> {
        with_conn!(self, conn => {
            let payments = pay_callback::table
                .filter(pay_callback::out_trade_no.eq(order_no))
                .order(pay_callback::created_at.asc())
                .select(PayCallback::as_select())
                .load(conn)
                .await?;
            let refunds = refund_callback::table
                .filter(refund_callback::out_trade_no.eq(order_no))
                .order(refund_callback::created_at.asc())
                .select(RefundCallback::as_select())
                .load(conn)
                .await?;
            let statuses = status_callback::table
                .filter(status_callback::out_trade_no.eq(order_no))
                .order(status_callback::created_at.asc())
                .select(StatusCallback::as_select())
                .load(conn)
                .await?;
            Ok(Callbacks { payments, refunds, statuses })
        })
    }
}
