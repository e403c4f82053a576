//! Reading the outbox (the relay that drains it lives beside the scheduler).

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde::Serialize;

use super::schema::local_message;
use super::types::Payload;
use super::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// One `local_message` row.
#[derive(Debug, Clone, PartialEq, Serialize, Queryable, Selectable, utoipa::ToSchema)]
#[diesel(table_name = local_message)]
pub struct StoredMessage {
    pub id: i64,
    pub topic: String,
    pub biz_key: String,
    #[schema(value_type = Object)]
    pub payload: Payload,
    /// 0 pending, 1 sent, 2 dead.
    pub status: i16,
    pub attempts: i32,
    #[schema(value_type = String, format = DateTime)]
    pub next_attempt_at: Timestamp,
    pub locked_by: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub locked_until: Option<Timestamp>,
    pub last_error: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub sent_at: Option<Timestamp>,
}

impl Store {
    /// Records the anomaly `message` announces, with the message, unless an anomaly under its
    /// key is recorded already: raised once however often what raises it runs. Whether it was
    /// written now.
    pub async fn raise_once(
        &self,
        message: &crate::outbox::Message,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        use super::statements::{InsertAnomaly, InsertMessage, PRIMARY, unless_exists};
        with_conn!(self, conn => {
            conn.transaction::<_, StoreError, _>(async |conn| {
                let written = unless_exists(InsertAnomaly::of(message, now).execute(conn).await, PRIMARY)?;
                if written > 0 {
                    InsertMessage::pending(message, now).execute(conn).await?;
                }
                Ok(written > 0)
            })
            .await
        })
    }

    /// Outbox rows, newest first; all statuses when `status` is `None`.
    pub async fn messages(
        &self,
        status: Option<i16>,
        limit: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        with_conn!(self, conn => {
            let mut query = local_message::table
                .select(StoredMessage::as_select())
                .order(local_message::id.desc())
                .limit(limit)
                .into_boxed();
            if let Some(status) = status {
                query = query.filter(local_message::status.eq(status));
            }
            Ok(query.load(conn).await?)
        })
    }

    /// The status of one message, if it exists.
    pub async fn message_status(&self, id: i64) -> Result<Option<i16>, StoreError> {
        with_conn!(self, conn => {
            Ok(local_message::table
                .find(id)
                .select(local_message::status)
                .first(conn)
                .await
                .optional()?)
        })
    }
}
