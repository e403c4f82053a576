//! The inbox's statements on MySQL and MariaDB.

use std::future::Future;

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Datetime, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

use super::Stored;
use super::sealed::Statements;

impl Statements for AsyncMysqlConnection {
    fn claim<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
        at: NaiveDateTime,
    ) -> impl Future<Output = QueryResult<bool>> + Send + 'a {
        // A plain INSERT: a duplicate key fails this statement only (InnoDB keeps the
        // transaction), after waiting for a concurrent uncommitted insert of the same key.
        // Not INSERT IGNORE, which would also turn a truncation into a warning.
        let insert = diesel::sql_query(
            "INSERT INTO processed_message (consumer, message_id, processed_at) VALUES (?, ?, ?)",
        )
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(message_id)
        .bind::<Datetime, _>(at);
        async move {
            match insert.execute(self).await {
                Ok(_) => Ok(true),
                Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
                Err(e) => Err(e),
            }
        }
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
            "SELECT result FROM processed_message WHERE consumer = ? AND message_id = ?",
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
            "DELETE FROM processed_message WHERE consumer = ? AND processed_at < ? \
             ORDER BY processed_at LIMIT ?",
        )
        .bind::<Text, _>(consumer)
        .bind::<Datetime, _>(before)
        .bind::<BigInt, _>(limit);
        async move { delete.execute(self).await }
    }

    fn create_table(&mut self) -> impl Future<Output = QueryResult<()>> + Send + '_ {
        self.batch_execute(include_str!("../../sql/mysql.sql"))
    }
}
