//! Reconcile one order now: ask every provider account of the order (those it names, else
//! every one with API credentials) and apply a paid answer through the ledger as its
//! notification would be. `POST /admin/orders/{order_no}/reconcile` and the console's
//! reconcile page call it.

use super::{Reconciler, Said};
use crate::order::OrderStatus;
use crate::store::StoreError;

/// What `POST /admin/orders/{order_no}/reconcile` found.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Reconciled {
    pub order_no: String,
    /// The order's status after any paid answer was applied.
    #[schema(value_type = String)]
    pub status: OrderStatus,
    /// Every merchant/app asked, in order, with its answer.
    pub providers: Vec<Said>,
}

/// Why an order could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileOrderError {
    #[error(
        "no merchant or app has API credentials (wechat.merchants[].private_key_file, alipay.apps[].app_private_key_file)"
    )]
    NoCredentials,
    #[error("no such order")]
    NoSuchOrder,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Reconciler {
    /// Asks the providers about `order_no` now and applies a paid answer.
    pub async fn reconcile_order(
        &self,
        order_no: String,
    ) -> Result<Reconciled, ReconcileOrderError> {
        if !self.asks_providers() {
            return Err(ReconcileOrderError::NoCredentials);
        }
        let store = self.store();
        let Some(order) = store.reconcile_target(&order_no).await? else {
            return Err(ReconcileOrderError::NoSuchOrder);
        };
        let providers = self.query_order(&order).await?;
        let status = store
            .order(&order_no)
            .await?
            .map_or(order.status, |o| o.status);
        Ok(Reconciled {
            order_no,
            status,
            providers,
        })
    }
}
