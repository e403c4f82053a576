//! `combined_order`: a combination and its sub-orders are written in one transaction, or
//! nothing is; read back with each sub-order as it is now.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::order::{NewOrder, Order};
use crate::store::schema::{combined_order, order_account, orders};
use crate::store::statements::{
    InsertCombination, InsertOrder, InsertOrderAccount, PRIMARY, unless_exists,
};
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// A combination as stored.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = combined_order)]
pub struct CombinedRow {
    pub combine_out_trade_no: String,
    pub channel: String,
    pub account: String,
    pub amount_fen: i64,
    pub sub_order_count: i32,
    /// The sub-orders' `order_no`, a JSON array in the order of the request.
    pub sub_orders: String,
    pub request_digest: String,
    pub created_at: Timestamp,
    pub expire_at: Timestamp,
}

impl CombinedRow {
    /// The sub-orders' numbers in the order of the request (empty if the column does not
    /// read as written, which only a hand edit could do).
    pub fn sub_order_nos(&self) -> Vec<String> {
        serde_json::from_str(&self.sub_orders).unwrap_or_default()
    }
}

/// A combination with its sub-orders as they are now, each with the account it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub row: CombinedRow,
    pub subs: Vec<(Order, Option<String>)>,
}

/// What a create found and did, before it is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// Written now.
    Fresh(Stored),
    /// The same request came before: the combination as it is now.
    Repeat(Stored),
    /// The number is another request's combination.
    OtherRequest,
    /// A sub-order's `order_no` exists already (an ordinary order, or another combination's).
    OrderExists(String),
    /// The accounts check failed (checked after the conflicts, as the contract orders).
    BadAccount(String),
}

/// A combination to write: its row, and each sub-order with the account it names.
pub struct NewCombination {
    pub row: CombinedRow,
    pub subs: Vec<NewOrder>,
}

impl Store {
    /// Writes `new` and its sub-orders in one transaction, unless the number or a sub-order's
    /// number is taken; `accounts` is the verdict on the accounts it names, applied after the
    /// conflicts are known.
    pub async fn create_combination(
        &self,
        new: &NewCombination,
        accounts: Result<(), String>,
    ) -> Result<Created, StoreError> {
        let row = &new.row;
        let no = row.combine_out_trade_no.as_str();
        let written = with_conn!(self, conn => {
            Ok::<_, StoreError>(conn.transaction::<_, Undo, _>(async |conn| {
                // Taken first: a concurrent twin waits here for this one's commit.
                let written = InsertCombination {
                    combine_out_trade_no: no,
                    channel: &row.channel,
                    account: &row.account,
                    amount_fen: row.amount_fen,
                    sub_order_count: row.sub_order_count,
                    sub_orders: &row.sub_orders,
                    request_digest: &row.request_digest,
                    created_at: row.created_at,
                    expire_at: row.expire_at,
                }
                .execute(conn)
                .await;
                if unless_exists(written, PRIMARY)? == 0 {
                    return Err(Undo::Taken);
                }
                let nos: Vec<&str> = new.subs.iter().map(|s| s.order_no.as_str()).collect();
                let taken: Vec<String> = orders::table
                    .filter(orders::order_no.eq_any(&nos))
                    .select(orders::order_no)
                    .load(conn)
                    .await?;
                if let Some(first) = nos.iter().find(|no| taken.iter().any(|t| t == *no)) {
                    return Err(Undo::OrderExists((*first).to_owned()));
                }
                if let Err(why) = &accounts {
                    return Err(Undo::BadAccount(why.clone()));
                }
                for sub in &new.subs {
                    let written = InsertOrder { order: sub }.execute(conn).await;
                    if unless_exists(written, PRIMARY)? == 0 {
                        return Err(Undo::OrderExists(sub.order_no.clone()));
                    }
                    for (channel, account) in &sub.accounts {
                        InsertOrderAccount {
                            order_no: &sub.order_no,
                            channel: channel.as_str(),
                            account,
                        }
                        .execute(conn)
                        .await?;
                    }
                }
                Ok(())
            })
            .await)
        })?;
        let found = |stored: Option<Stored>| {
            stored.ok_or(StoreError::Undecided(
                "the combination was not found right after its create".to_owned(),
            ))
        };
        match written {
            Ok(()) => Ok(Created::Fresh(found(self.combination(no).await?)?)),
            Err(Undo::Taken) => Ok(match self.combination(no).await? {
                Some(stored) if stored.row.request_digest == row.request_digest => {
                    Created::Repeat(stored)
                }
                _ => Created::OtherRequest,
            }),
            Err(Undo::OrderExists(no)) => Ok(Created::OrderExists(no)),
            Err(Undo::BadAccount(why)) => Ok(Created::BadAccount(why)),
            Err(Undo::Db(e)) => Err(StoreError::Query(e)),
        }
    }

    /// The combination `no` with its sub-orders in the order of the request.
    pub async fn combination(&self, no: &str) -> Result<Option<Stored>, StoreError> {
        with_conn!(self, conn => {
            let Some(row) = combined_order::table
                .find(no)
                .select(CombinedRow::as_select())
                .first(conn)
                .await
                .optional()?
            else {
                return Ok(None);
            };
            let found: Vec<Order> = orders::table
                .filter(orders::combine_out_trade_no.eq(no))
                .select(Order::as_select())
                .load(conn)
                .await?;
            let accounts: Vec<(String, String)> = order_account::table
                .filter(order_account::order_no.eq_any(found.iter().map(|o| &o.order_no)))
                .filter(order_account::channel.eq(&row.channel))
                .select((order_account::order_no, order_account::account))
                .load(conn)
                .await?;
            let mut subs = Vec::with_capacity(found.len());
            for no in row.sub_order_nos() {
                if let Some(order) = found.iter().find(|o| o.order_no == no) {
                    let account = accounts
                        .iter()
                        .find(|(o, _)| *o == no)
                        .map(|(_, a)| a.clone());
                    subs.push((order.clone(), account));
                }
            }
            Ok(Some(Stored { row, subs }))
        })
    }
}

/// Why a create's transaction was undone: on purpose (nothing is written), or a database
/// error.
#[derive(Debug)]
enum Undo {
    /// The number is taken (by this request before, or another).
    Taken,
    OrderExists(String),
    BadAccount(String),
    Db(diesel::result::Error),
}

impl From<diesel::result::Error> for Undo {
    fn from(e: diesel::result::Error) -> Self {
        Self::Db(e)
    }
}
