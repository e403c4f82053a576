//! The inbox's statements on PostgreSQL.

use std::future::Future;

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::sql_types::{BigInt, Text, Timestamp};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use super::Stored;
use super::sealed::Statements;

impl Statements for AsyncPgConnection {
    fn claim<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
        at: NaiveDateTime,
    ) -> impl Future<Output = QueryResult<bool>> + Send + 'a {
        // Waits for a concurrent, uncommitted insert of the same key; does nothing once it
        // committed, inserts if it rolled back.
        let insert = diesel::sql_query(
            "INSERT INTO processed_message (consumer, message_id, processed_at) \
             VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(message_id)
        .bind::<Timestamp, _>(at);
        async move { Ok(insert.execute(self).await? == 1) }
    }

    fn store_result<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
        result: &'a str,
    ) -> impl Future<Output = QueryResult<()>> + Send + 'a {
        let update = diesel::sql_query(
            "UPDATE processed_message SET result = $1 WHERE consumer = $2 AND message_id = $3",
        )
        .bind::<Text, _>(result)
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(message_id);
        async move { update.execute(self).await.map(drop) }
    }

    fn stored_result<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = QueryResult<Option<Option<String>>>> + Send + 'a {
        let select = diesel::sql_query(
            "SELECT result FROM processed_message WHERE consumer = $1 AND message_id = $2",
        )
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(message_id);
        async move {
            let rows: Vec<Stored> = select.load(self).await?;
            Ok(rows.into_iter().next().map(|row| row.result))
        }
    }

    fn purge_batch<'a>(
        &'a mut self,
        consumer: &'a str,
        before: NaiveDateTime,
        limit: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send + 'a {
        let delete = diesel::sql_query(
            "DELETE FROM processed_message WHERE ctid = ANY(ARRAY( \
               SELECT ctid FROM processed_message \
               WHERE consumer = $1 AND processed_at < $2 LIMIT $3))",
        )
        .bind::<Text, _>(consumer)
        .bind::<Timestamp, _>(before)
        .bind::<BigInt, _>(limit);
        async move { delete.execute(self).await }
    }

    fn create_table(&mut self) -> impl Future<Output = QueryResult<()>> + Send + '_ {
        self.batch_execute(include_str!("../../sql/postgres.sql"))
    }
}
