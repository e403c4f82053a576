//! A run's bill rows (`bill_line`): stored in batches while a bill is read, emptied before
//! and after a run.

use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::channel::bill::BillLine;
use crate::notice::ChannelId;
use crate::store::schema::bill_line;
use crate::store::{Pools, Store, StoreError, acquire, with_conn};

#[derive(Insertable)]
#[diesel(table_name = bill_line)]
struct NewLine<'a> {
    bill_date: &'a str,
    channel: &'a str,
    kind: &'a str,
    out_trade_no: &'a str,
    out_refund_no: &'a str,
    account: &'a str,
    transaction_id: &'a str,
    amount_fen: i64,
    status: &'a str,
}

impl Store {
    /// Removes one account's bill rows of (`date`, `channel`): a bill that failed a check
    /// after some of its rows were stored.
    pub async fn clear_account_lines(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
    ) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::delete(
                bill_line::table
                    .filter(bill_line::bill_date.eq(date))
                    .filter(bill_line::channel.eq(channel.as_str()))
                    .filter(bill_line::account.eq(account)),
            )
            .execute(conn)
            .await?;
        });
        Ok(())
    }

    /// Removes the bill rows of (`date`, `channel`): before a run reads its bills (a run
    /// that died left them), and after it.
    pub async fn clear_bill_lines(&self, date: &str, channel: ChannelId) -> Result<(), StoreError> {
        with_conn!(self, conn => {
            diesel::delete(
                bill_line::table
                    .filter(bill_line::bill_date.eq(date))
                    .filter(bill_line::channel.eq(channel.as_str())),
            )
            .execute(conn)
            .await?;
        });
        Ok(())
    }

    /// Stores a batch of one account's bill rows in one statement. A row whose key is in
    /// the account's bill already (the same payment or refund twice in one bill)
    /// is `Ok(Err(..))`: the bill is refused, not the statement retried.
    pub async fn insert_bill_lines(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
        lines: &[BillLine],
    ) -> Result<Result<(), String>, StoreError> {
        let rows: Vec<NewLine<'_>> = lines
            .iter()
            .map(|l| NewLine {
                bill_date: date,
                channel: channel.as_str(),
                kind: l.kind.as_str(),
                out_trade_no: &l.out_trade_no,
                out_refund_no: l.out_refund_no.as_deref().unwrap_or(""),
                account,
                transaction_id: &l.transaction_id,
                amount_fen: l.amount_fen,
                status: &l.status,
            })
            .collect();
        // One multi-row statement; SQLite (no batch insert in diesel's SQLite backend) one
        // row after another in a transaction, which costs it no round trips.
        let inserted: Result<(), Error> = match &*self.pools {
            Pools::Postgres(pool) => {
                let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
                diesel::insert_into(bill_line::table)
                    .values(&rows)
                    .execute(&mut conn)
                    .await
                    .map(drop)
            }
            Pools::Mysql(pool) => {
                let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
                diesel::insert_into(bill_line::table)
                    .values(&rows)
                    .execute(&mut conn)
                    .await
                    .map(drop)
            }
            Pools::Sqlite(pool) => {
                let mut conn = acquire(pool.get(), self.acquire_timeout).await?;
                conn.transaction::<_, Error, _>(async |conn| {
                    for row in &rows {
                        diesel::insert_into(bill_line::table)
                            .values(row)
                            .execute(conn)
                            .await?;
                    }
                    Ok(())
                })
                .await
            }
        };
        match inserted {
            Ok(_) => Ok(Ok(())),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, info)) => {
                Ok(Err(format!(
                    "a payment or refund appears twice in the bill ({})",
                    info.message()
                )))
            }
            Err(e) => Err(e.into()),
        }
    }
}
