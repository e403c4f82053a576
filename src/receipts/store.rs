//! The `notify_receipt` table: what arrived at a notify URL and what it was answered.
//! Diagnostics, not the ledger: written in batches by the receipt writer (`crate::receipts`),
//! read by the admin endpoints and `paynotify explain`, purged by the retention job.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde::Serialize;

use crate::store::schema::notify_receipt;
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// A receipt to write.
#[derive(Debug, Clone, PartialEq, Insertable)]
#[diesel(table_name = notify_receipt, treat_none_as_default_value = false)]
pub struct NewReceipt {
    pub channel: String,
    pub route: Option<String>,
    pub received_at: Timestamp,
    pub peer: Option<String>,
    pub request_id: Option<String>,
    /// `{"header-name": ["value", …]}`.
    pub headers: Payload,
    pub body_b64: String,
    pub body_bytes: i32,
    pub status: i16,
    pub outcome: String,
    pub detail: Option<String>,
    pub out_trade_no: Option<String>,
}

/// One stored receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Queryable, Selectable, utoipa::ToSchema)]
#[diesel(table_name = notify_receipt)]
pub struct StoredReceipt {
    pub id: i64,
    pub channel: String,
    /// The notify route it came to (`/notify/wechat/refund`); `null` for a receipt stored
    /// before routes were kept.
    pub route: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub received_at: Timestamp,
    /// The TCP peer (a proxy in front of the service shows here, not the provider).
    pub peer: Option<String>,
    pub request_id: Option<String>,
    /// `{"header-name": ["value", …]}`: Wechatpay-*, Content-Type, Content-Length, User-Agent.
    #[schema(value_type = Object)]
    pub headers: Payload,
    /// The raw body, base64; only its first `receipts.junk_prefix_bytes` when it is not in
    /// the provider's shape (`detail` then says so, with its SHA-256).
    pub body_b64: String,
    /// The length of the body as it arrived.
    pub body_bytes: i32,
    /// The HTTP status answered.
    pub status: i16,
    /// What became of it: a ledger outcome (`applied`, `duplicate`, …) or a rejection
    /// (`bad_signature`, `stale`, `bad_request`, `wrong_event_type`, `undecryptable`,
    /// `too_large`, …).
    pub outcome: String,
    /// Why, in words, when it was refused (control characters written out as `\xNN`).
    pub detail: Option<String>,
    pub out_trade_no: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub reapplied_at: Option<Timestamp>,
    /// What the last re-apply did.
    pub reapply_outcome: Option<String>,
}

/// Which receipts to list.
#[derive(Debug, Clone, Default)]
pub struct ReceiptFilter {
    pub channel: Option<String>,
    pub outcome: Option<String>,
    pub order_no: Option<String>,
    pub since: Option<Timestamp>,
    pub limit: i64,
    /// Oldest first (re-apply in arrival order) instead of newest first.
    pub oldest_first: bool,
    /// Only requests answered with something other than a 2xx (the console's refused
    /// deliveries: the provider was told to try again).
    pub refused_only: bool,
    /// Only those never re-applied.
    pub not_reapplied: bool,
}

impl Store {
    /// Writes a batch of receipts in one transaction (it starts with a write, so SQLite
    /// takes its write lock at once). One insert per row: SQLite has no multi-row insert
    /// in diesel.
    pub async fn insert_receipts(&self, receipts: &[NewReceipt]) -> Result<usize, StoreError> {
        if receipts.is_empty() {
            return Ok(0);
        }
        with_conn!(self, conn => {
            Ok(conn
                .transaction::<_, diesel::result::Error, _>(async |conn| {
                    let mut written = 0;
                    for receipt in receipts {
                        written += diesel::insert_into(notify_receipt::table)
                            .values(receipt)
                            .execute(conn)
                            .await?;
                    }
                    Ok(written)
                })
                .await?)
        })
    }

    pub async fn receipts(&self, filter: &ReceiptFilter) -> Result<Vec<StoredReceipt>, StoreError> {
        with_conn!(self, conn => {
            let mut query = notify_receipt::table
                .select(StoredReceipt::as_select())
                .limit(filter.limit)
                .into_boxed();
            query = if filter.oldest_first {
                query.order(notify_receipt::id.asc())
            } else {
                query.order(notify_receipt::id.desc())
            };
            if let Some(channel) = &filter.channel {
                query = query.filter(notify_receipt::channel.eq(channel.clone()));
            }
            if let Some(outcome) = &filter.outcome {
                query = query.filter(notify_receipt::outcome.eq(outcome.clone()));
            }
            if let Some(order_no) = &filter.order_no {
                query = query.filter(notify_receipt::out_trade_no.eq(order_no.clone()));
            }
            if let Some(since) = filter.since {
                query = query.filter(notify_receipt::received_at.ge(since));
            }
            if filter.not_reapplied {
                query = query.filter(notify_receipt::reapplied_at.is_null());
            }
            if filter.refused_only {
                query = query.filter(
                    notify_receipt::status
                        .lt(200)
                        .or(notify_receipt::status.ge(300)),
                );
            }
            Ok(query.load(conn).await?)
        })
    }

    pub async fn receipt(&self, id: i64) -> Result<Option<StoredReceipt>, StoreError> {
        with_conn!(self, conn => {
            Ok(notify_receipt::table
                .find(id)
                .select(StoredReceipt::as_select())
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// Records what a re-apply of receipt `id` did.
    pub async fn mark_reapplied(
        &self,
        id: i64,
        outcome: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::update(notify_receipt::table.find(id))
                .set((
                    notify_receipt::reapplied_at.eq(Some(now)),
                    notify_receipt::reapply_outcome.eq(Some(outcome)),
                ))
                .execute(conn)
                .await?;
            Ok(())
        })
    }
}
