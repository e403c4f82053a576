//! Re-apply: a stored request verified again with the keys configured now, at the time it
//! arrived (the receipt proves when: no timestamp window), and applied through the intake
//! like a delivery. `POST /admin/receipts/{id}/reapply`, its bulk form and the console's
//! buttons all come here.

use std::sync::Arc;
use std::time::Instant;

use super::store::{ReceiptFilter, StoredReceipt};
use super::{decode_body, header_map};
use crate::channel::{Inbound, Provider, Reply};
use crate::intake::Intake;
use crate::metrics::Refusal;
use crate::store::{Store, StoreError};
use crate::time::Clock;

/// What one re-apply did.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Reapplied {
    pub id: i64,
    /// A ledger outcome (`applied`, `duplicate`, `anomaly`, `unknown_order`, …) or why it
    /// is still refused (`bad_signature`, `undecryptable`, …).
    pub outcome: String,
    pub detail: Option<String>,
    pub out_trade_no: Option<String>,
}

/// What a bulk re-apply did: each result, and how many came to each outcome.
#[derive(Debug)]
pub struct ReappliedMany {
    pub results: Vec<Reapplied>,
    pub outcomes: std::collections::BTreeMap<String, u64>,
}

/// Re-applies stored requests: what it needs, built once with the application.
pub struct Reapplier {
    intake: Arc<Intake>,
    providers: Vec<Arc<dyn Provider>>,
    store: Store,
    clock: Arc<dyn Clock>,
}

impl Reapplier {
    pub fn new(
        intake: Arc<Intake>,
        providers: Vec<Arc<dyn Provider>>,
        store: Store,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            intake,
            providers,
            store,
            clock,
        }
    }

    /// Every provider's operations side: `explain` verifies stored requests with these too.
    pub fn providers(&self) -> &[Arc<dyn Provider>] {
        &self.providers
    }

    /// Verifies `receipt`'s request again and applies it through the gate and the ledger;
    /// the receipt is marked with what came of it.
    pub async fn reapply(&self, receipt: &StoredReceipt) -> Result<Reapplied, StoreError> {
        let refused = |outcome: &str, detail: String| Reapplied {
            id: receipt.id,
            outcome: outcome.to_owned(),
            detail: Some(detail),
            out_trade_no: None,
        };
        let provider = self
            .providers
            .iter()
            .find(|p| p.channel().as_str() == receipt.channel);
        let result = match (provider, decode_body(&receipt.body_b64)) {
            (None, _) => refused(
                "no_channel",
                format!("channel {} is not configured", receipt.channel),
            ),
            (_, None) => refused("bad_request", "the stored body is not base64".to_owned()),
            (Some(provider), Some(body)) => {
                let headers = header_map(&receipt.headers.0);
                let inbound = Inbound {
                    headers: &headers,
                    body: &body,
                    now: receipt.received_at,
                    route: receipt.route.as_deref(),
                };
                match provider.admit(&inbound) {
                    Err(rejection) => {
                        refused(Refusal::from(&rejection).label(), rejection.to_string())
                    }
                    Ok(notice) => {
                        let now = self.clock.now();
                        let (counted, reply) =
                            self.intake.settle(&notice, now, Instant::now()).await;
                        Reapplied {
                            id: receipt.id,
                            outcome: counted.label().to_owned(),
                            detail: match reply {
                                Reply::Success => None,
                                Reply::Failure { message, .. } => Some(message.to_owned()),
                            },
                            out_trade_no: Some(notice.out_trade_no),
                        }
                    }
                }
            }
        };
        self.store
            .mark_reapplied(receipt.id, &result.outcome, self.clock.now())
            .await?;
        tracing::info!(id = receipt.id, outcome = %result.outcome, "receipt re-applied");
        Ok(result)
    }

    /// Re-applies every receipt `filter` selects, in its order.
    pub async fn reapply_many(&self, filter: &ReceiptFilter) -> Result<ReappliedMany, StoreError> {
        let rows = self.store.receipts(filter).await?;
        let mut results = Vec::with_capacity(rows.len());
        let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
        for receipt in &rows {
            let result = self.reapply(receipt).await?;
            *outcomes.entry(result.outcome.clone()).or_default() += 1;
            results.push(result);
        }
        Ok(ReappliedMany { results, outcomes })
    }
}
