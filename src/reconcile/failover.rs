//! After a failover: what this instance acknowledged shortly before it, checked again.
//!
//! With asynchronous replication the new writer may lack payments the old one committed and
//! this instance answered 2xx: the provider will not send them again. When the writer changes
//! (`store/writer.rs`), the outbox's row ids jump past anything the old writer handed out,
//! and every order acknowledged in `database.failover_recheck_secs` before the change that is
//! neither `PAID` nor `REFUNDED` on the new writer is asked about at its providers at once,
//! through the query the reconcile job and `POST /admin/orders/{order_no}/reconcile` use; a
//! paid answer is applied through the ledger as its notification would be.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::Reconciler;
use crate::metrics::Metrics;
use crate::notice::Outcome;
use crate::order::OrderStatus;
use crate::store::StoreError;
use crate::store::writer::Failover;

/// Orders rechecked at once after a failover, at most.
pub const CONCURRENCY: usize = 8;

/// What rechecking one order came to: the `result` label of
/// `paynotify_failover_rechecks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// `PAID` or `REFUNDED` on the new writer: nothing was lost.
    Present,
    /// The provider said paid and the payment was applied again.
    Recovered,
    /// Asked, and no payment was applied (not paid, already applied meanwhile, no answer):
    /// the reconcile job asks again.
    NotRecovered,
    /// The new writer has no such order (its creation was lost too).
    UnknownOrder,
    /// The database failed while checking.
    Error,
}

impl Recheck {
    pub fn label(self) -> &'static str {
        match self {
            Self::Present => "present",
            Self::Recovered => "recovered",
            Self::NotRecovered => "not_recovered",
            Self::UnknownOrder => "unknown_order",
            Self::Error => "error",
        }
    }
}

/// Follows the store's writer: on each failover, the outbox ids jump and the acknowledged
/// orders are rechecked. Ends once the reconciler and its store are gone (it holds neither).
pub fn follow(reconciler: &Arc<Reconciler>, metrics: Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    let writer = reconciler.store().writer();
    writer.count_into(
        metrics.database_failovers.clone(),
        metrics.failover_recheck_forgotten.clone(),
    );
    let mut changes = writer.subscribe();
    let reconciler = Arc::downgrade(reconciler);
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let failover = changes.borrow_and_update().clone();
            let (Some(failover), Some(reconciler)) = (failover, reconciler.upgrade()) else {
                continue;
            };
            after(&reconciler, &metrics, &failover).await;
        }
    })
}

/// What one failover needs: the ids, then the rechecks. Returns each order's result.
pub async fn after(
    reconciler: &Arc<Reconciler>,
    metrics: &Arc<Metrics>,
    failover: &Failover,
) -> Vec<(String, Recheck)> {
    let store = reconciler.store();
    match store.advance_outbox_ids().await {
        Ok(Some(next)) => tracing::info!(next, "outbox ids moved on past the old writer's"),
        Ok(None) => {}
        Err(e) => tracing::error!(
            error = %e,
            "outbox ids not moved on after the failover: an id the old writer gave may be given again"
        ),
    }
    let orders = store.writer().acknowledged_since_window_before(failover.at);
    if !reconciler.asks_providers() && !orders.is_empty() {
        tracing::error!(
            orders = orders.len(),
            "no merchant or app has API credentials: orders acknowledged before the failover \
             and missing on the new writer cannot be asked about; each is logged below"
        );
    }
    tracing::warn!(
        orders = orders.len(),
        "rechecking the orders acknowledged before the failover"
    );
    let mut results = Vec::with_capacity(orders.len());
    let mut running = JoinSet::new();
    for order_no in orders {
        if running.len() >= CONCURRENCY
            && let Some(Ok(done)) = running.join_next().await
        {
            results.push(done);
        }
        let reconciler = Arc::clone(reconciler);
        running.spawn(async move {
            let result = recheck(&reconciler, &order_no).await;
            (order_no, result)
        });
    }
    while let Some(done) = running.join_next().await {
        if let Ok(done) = done {
            results.push(done);
        }
    }
    let mut counts = std::collections::BTreeMap::new();
    for (_, result) in &results {
        metrics
            .failover_rechecks
            .with_label_values(&[result.label()])
            .inc();
        *counts.entry(result.label()).or_insert(0_usize) += 1;
    }
    tracing::warn!(?counts, "orders acknowledged before the failover rechecked");
    results
}

/// One order: present on the new writer, else asked about at its providers.
async fn recheck(reconciler: &Reconciler, order_no: &str) -> Recheck {
    match ask(reconciler, order_no).await {
        Ok(result) => {
            if result != Recheck::Present {
                tracing::warn!(
                    order_no,
                    result = result.label(),
                    "order acknowledged before the failover rechecked"
                );
            }
            result
        }
        Err(e) => {
            tracing::error!(order_no, error = %e, "order acknowledged before the failover not rechecked; the reconcile job asks later");
            Recheck::Error
        }
    }
}

async fn ask(reconciler: &Reconciler, order_no: &str) -> Result<Recheck, StoreError> {
    let store = reconciler.store();
    let Some(order) = store.order(order_no).await? else {
        return Ok(Recheck::UnknownOrder);
    };
    if matches!(order.status, OrderStatus::Paid | OrderStatus::Refunded) {
        return Ok(Recheck::Present);
    }
    if !reconciler.asks_providers() {
        // Nobody to ask: the order is named in the log for an operator.
        return Ok(Recheck::NotRecovered);
    }
    let Some(target) = store.reconcile_target(order_no).await? else {
        return Ok(Recheck::UnknownOrder);
    };
    let said = reconciler.query_order(&target).await?;
    Ok(
        if said
            .iter()
            .any(|s| s.ledger == Some(Outcome::Applied.as_str()))
        {
            Recheck::Recovered
        } else {
            Recheck::NotRecovered
        },
    )
}
