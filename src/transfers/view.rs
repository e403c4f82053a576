//! A transfer as the JSON API and the console show it: never a name.

use serde::Serialize;

use crate::time::Timestamp;
use crate::transfer::TransferStatus;

use super::store::TransferRow;

/// A transfer as `POST`/`GET /transfers` show it. Names are never shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TransferView {
    pub out_bill_no: String,
    pub channel: String,
    pub account: String,
    pub amount_fen: i64,
    pub remark: String,
    /// `{"openid"}` (WeChat) or `{"identity", "identity_type"}` (Alipay).
    #[schema(value_type = Object)]
    pub payee: serde_json::Value,
    pub status: TransferStatus,
    /// The provider's own latest state (`null` until it answered).
    pub provider_state: Option<String>,
    /// WeChat `transfer_bill_no`, Alipay `order_id`, once known.
    pub provider_bill_no: Option<String>,
    /// WeChat's `package_info` for `wx.requestMerchantTransfer` (`WAIT_USER_CONFIRM`).
    pub package_info: Option<String>,
    pub fail_reason: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
}

impl From<TransferRow> for TransferView {
    fn from(row: TransferRow) -> Self {
        Self {
            status: row.status(),
            payee: serde_json::from_str(&row.payee).unwrap_or(serde_json::Value::Null),
            out_bill_no: row.out_bill_no,
            channel: row.channel,
            account: row.account,
            amount_fen: row.amount_fen,
            remark: row.remark,
            provider_state: row.provider_state,
            provider_bill_no: row.provider_bill_no,
            package_info: row.package_info,
            fail_reason: row.fail_reason,
            created_at: row.created_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
        }
    }
}
