//! Orders and the only moves their status may make.

use diesel::backend::Backend;
use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::Text;
use serde::Serialize;

use crate::notice::ChannelId;
use crate::store::schema::orders;
use crate::time::Timestamp;

/// `WAIT_PAY → PAID → REFUNDED`, `WAIT_PAY → CLOSED`; nothing else, ever.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, AsExpression, FromSqlRow, utoipa::ToSchema,
)]
#[diesel(sql_type = Text)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    WaitPay,
    Paid,
    Refunded,
    Closed,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 4] = [Self::WaitPay, Self::Paid, Self::Refunded, Self::Closed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::WaitPay => "WAIT_PAY",
            Self::Paid => "PAID",
            Self::Refunded => "REFUNDED",
            Self::Closed => "CLOSED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

impl<DB: Backend> ToSql<Text, DB> for OrderStatus
where
    str: ToSql<Text, DB>,
{
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, DB>) -> serialize::Result {
        self.as_str().to_sql(out)
    }
}

impl<DB: Backend> FromSql<Text, DB> for OrderStatus
where
    String: FromSql<Text, DB>,
{
    fn from_sql(bytes: DB::RawValue<'_>) -> deserialize::Result<Self> {
        let s = String::from_sql(bytes)?;
        Self::parse(&s).ok_or_else(|| format!("unknown order status {s:?}").into())
    }
}

/// An order as stored, serialised with exactly the keys of `GET /orders/{order_no}`.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, diesel::Queryable, diesel::Selectable, utoipa::ToSchema,
)]
#[diesel(table_name = orders)]
pub struct Order {
    pub order_no: String,
    pub status: OrderStatus,
    pub amount_fen: i64,
    pub refunded_fen: i64,
    pub currency: String,
    #[serde(skip)]
    #[schema(ignore)]
    pub subject: String,
    pub channel: Option<String>,
    pub transaction_id: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub paid_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub closed_at: Option<Timestamp>,
    #[serde(skip)]
    #[schema(ignore)]
    pub expire_at: Timestamp,
    /// The combination a sub-order belongs to (`POST /combined-orders`); `null` for an
    /// ordinary order.
    pub combine_out_trade_no: Option<String>,
}

/// A refund started through paynotify (`refund_request.status`). Final: `SUCCESS`, `CLOSED`,
/// and `ABNORMAL` with the provider's refusal code (nothing was created under its number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefundStatus {
    /// Recorded and sent (or being sent again): the provider's answer is not known yet.
    Submitting,
    Processing,
    Success,
    Closed,
    Abnormal,
}

impl RefundStatus {
    pub const ALL: [RefundStatus; 5] = [
        Self::Submitting,
        Self::Processing,
        Self::Success,
        Self::Closed,
        Self::Abnormal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitting => "SUBMITTING",
            Self::Processing => "PROCESSING",
            Self::Success => "SUCCESS",
            Self::Closed => "CLOSED",
            Self::Abnormal => "ABNORMAL",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

/// Thirty days: longer than any provider keeps a trade open.
pub const MAX_EXPIRE_AFTER_SECS: u64 = 30 * 24 * 3600;

/// A new order, already validated by the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    pub order_no: String,
    pub amount_fen: i64,
    pub currency: String,
    pub subject: String,
    pub created_at: Timestamp,
    pub expire_at: Timestamp,
    /// The provider account to ask about this order, at most one per channel (the WeChat
    /// `mchid`, the Alipay `app_id`); empty: every account with API credentials.
    pub accounts: Vec<(ChannelId, String)>,
    /// The combination this order is a sub-order of; `None` for an ordinary order.
    pub combine_out_trade_no: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::OrderStatus;

    #[test]
    fn status_names_round_trip() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(OrderStatus::parse("paid"), None);
        for s in super::RefundStatus::ALL {
            assert_eq!(super::RefundStatus::parse(s.as_str()), Some(s));
        }
    }
}
