//! The inbox's statements on SQLite.

use std::future::Future;

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::sql_types::{BigInt, Text, Timestamp};
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

use super::Stored;
use super::sealed::Statements;

impl Statements for SyncConnectionWrapper<SqliteConnection> {
    fn claim<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
        at: NaiveDateTime,
    ) -> impl Future<Output = QueryResult<bool>> + Send + 'a {
        // The insert takes the database's write lock (waiting up to the connection's
        // busy_timeout), which the transaction keeps until it ends.
        let insert = diesel::sql_query(
            "INSERT INTO processed_message (consumer, message_id, processed_at) \
             VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind::<Text, _>(consumer.to_owned())
        .bind::<Text, _>(message_id.to_owned())
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
            "UPDATE processed_message SET result = ? WHERE consumer = ? AND message_id = ?",
        )
        .bind::<Text, _>(result.to_owned())
        .bind::<Text, _>(consumer.to_owned())
        .bind::<Text, _>(message_id.to_owned());
        async move { update.execute(self).await.map(drop) }
    }

    fn stored_result<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = QueryResult<Option<Option<String>>>> + Send + 'a {
        let select = diesel::sql_query(
            "SELECT result FROM processed_message WHERE consumer = ? AND message_id = ?",
        )
        .bind::<Text, _>(consumer.to_owned())
        .bind::<Text, _>(message_id.to_owned());
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
            "DELETE FROM processed_message WHERE consumer = ? AND message_id IN ( \
               SELECT message_id FROM processed_message \
               WHERE consumer = ? AND processed_at < ? LIMIT ?)",
        )
        .bind::<Text, _>(consumer.to_owned())
        .bind::<Text, _>(consumer.to_owned())
        .bind::<Timestamp, _>(before)
        .bind::<BigInt, _>(limit);
        async move { delete.execute(self).await }
    }

    fn create_table(&mut self) -> impl Future<Output = QueryResult<()>> + Send + '_ {
        self.batch_execute(include_str!("../../sql/sqlite.sql"))
    }
}
