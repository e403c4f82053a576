//! The set-based comparison of an account's bill rows with the ledger's day: the bill's rows
//! the ledger lacks or disagrees with, the ledger's rows no bill row names, and the ledger's
//! totals of the day.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::RunQueryDsl;

use super::{BillSide, OursOnly, Recorded, Scope};
use crate::bills::report::OurTotals;
use crate::channel::bill::LineKind;
use crate::store::schema::{bill_line, order_account, pay_callback, refund_callback};
use crate::store::types::UtcTs;
use crate::store::{Dialect, Store, StoreError, with_conn};
use crate::time::Timestamp;

/// Keeps the rows of orders that name an account of `scope.covers` on the channel
/// (`order_account`, left-joined), and for the channel's first account those of orders that
/// name none.
macro_rules! of_account {
    ($query:expr, $scope:expr) => {
        if $scope.unnamed {
            $query.filter(
                order_account::account
                    .nullable()
                    .eq_any($scope.covers)
                    .or(order_account::account.nullable().is_null()),
            )
        } else {
            $query.filter(order_account::account.nullable().eq_any($scope.covers))
        }
    };
}

/// A bill row and a ledger payment of one order are the same payment only with the same
/// transaction id, where both have one: a second payment of a paid order (through another
/// merchant of the channel) is another payment.
macro_rules! same_transaction {
    () => {
        bill_line::transaction_id
            .eq("")
            .or(pay_callback::transaction_id.eq(""))
            .or(pay_callback::transaction_id.eq(bill_line::transaction_id))
    };
}

/// The callback rows of the scope's day: dated by the provider's own time of the payment or
/// refund (`occurred_at`) where the notice carried it, else by when the ledger recorded it
/// (`created_at`). Two index ranges, one per column.
macro_rules! dated_in {
    ($table:ident, $scope:expr) => {
        $table::occurred_at
            .ge($scope.start)
            .and($table::occurred_at.lt($scope.end))
            .or($table::occurred_at
                .is_null()
                .and($table::created_at.ge($scope.start))
                .and($table::created_at.lt($scope.end)))
    };
}

/// What dates a callback row (see [`dated_in`]), as SQL.
fn dated(table: &str) -> String {
    format!("COALESCE({table}.occurred_at, {table}.created_at)")
}

/// `(count, sum of $amount)` of the account's rows of a callback table recorded on the
/// scope's day: one statement.
macro_rules! day_totals {
    ($store:expr, $scope:expr, $table:ident, $amount:literal) => {{
        let totals: (i64, i64) = with_conn!($store, conn, dialect => {
            let mut query = $table::table
                .left_join(
                    order_account::table.on(order_account::order_no
                        .eq($table::out_trade_no)
                        .and(order_account::channel.eq($table::channel))),
                )
                .filter($table::channel.eq($scope.channel.as_str()))
                .filter(dated_in!($table, $scope))
                .into_boxed();
            query = of_account!(query, $scope);
            query
                .select((sql::<BigInt>("COUNT(*)"), sql::<BigInt>(&sum_of(dialect, $amount))))
                .first(conn)
                .await?
        });
        totals
    }};
}

/// `CAST(COALESCE(SUM(column), 0) AS …)`: PostgreSQL sums a BIGINT as NUMERIC, MySQL as
/// DECIMAL; each is cast back.
fn sum_of(dialect: Dialect, column: &str) -> String {
    let target = match dialect {
        Dialect::Mysql => "SIGNED",
        Dialect::Postgres | Dialect::Sqlite => "BIGINT",
    };
    format!("CAST(COALESCE(SUM({column}), 0) AS {target})")
}

/// The bill's rows of one kind (`$lines`) that `$table`, joined `on` its key, lacks
/// (`key` is null), records with another amount (`fen`), or dates outside the scope's day; with
/// the ledger's amount, date and `status`. Payments and refunds differ only in these.
macro_rules! bill_differences {
    ($store:expr, $lines:expr, $scope:expr, $limit:expr, $table:ident,
     on: $on:expr, key: $key:expr, fen: $fen:expr, status: $status:expr) => {
        with_conn!($store, conn => {
            $lines
                .left_join($table::table.on($on))
                .filter(
                    $key.nullable()
                        .is_null()
                        .or($fen.nullable().ne(bill_line::amount_fen.nullable()))
                        .or(sql::<Nullable<UtcTs>>(&dated(stringify!($table))).lt($scope.start))
                        .or(sql::<Nullable<UtcTs>>(&dated(stringify!($table))).ge($scope.end)),
                )
                .select((
                    bill_line::out_trade_no,
                    bill_line::out_refund_no,
                    bill_line::transaction_id,
                    bill_line::amount_fen,
                    bill_line::status,
                    $fen.nullable(),
                    sql::<Nullable<UtcTs>>(&dated(stringify!($table))),
                    $status,
                ))
                .limit($limit)
                .load(conn)
                .await?
        })
    };
}

/// The account's rows of `$table` of the scope's day that no bill row of `$kind` of the day
/// names (an anti-join on `bill_line`'s key: the order, and what makes it the `same`
/// payment or refund), as `select`. Payments and refunds differ only in these.
macro_rules! ours_only {
    ($store:expr, $scope:expr, $limit:expr, $table:ident, $kind:expr,
     same: $same:expr, select: $select:expr) => {
        with_conn!($store, conn => {
            let mut query = $table::table
                .left_join(
                    order_account::table.on(order_account::order_no
                        .eq($table::out_trade_no)
                        .and(order_account::channel.eq($table::channel))),
                )
                .left_join(
                    bill_line::table.on(bill_line::bill_date
                        .eq($scope.date)
                        .and(bill_line::channel.eq($table::channel))
                        .and(bill_line::kind.eq($kind.as_str()))
                        .and(bill_line::out_trade_no.eq($table::out_trade_no))
                        .and($same)),
                )
                .filter($table::channel.eq($scope.channel.as_str()))
                .filter(dated_in!($table, $scope))
                .filter(bill_line::out_trade_no.nullable().is_null())
                .into_boxed();
            query = of_account!(query, $scope);
            query.select($select).limit($limit).load(conn).await?
        })
    };
}

impl Store {
    /// The account's bill rows of `kind` the ledger lacks, records with another amount, or
    /// records on another day: at most `limit` + 1 (one more says there are too many).
    pub async fn bill_differences(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        limit: usize,
    ) -> Result<Vec<BillSide>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
        let channel = scope.channel.as_str();
        let lines = bill_line::table
            .filter(bill_line::bill_date.eq(scope.date))
            .filter(bill_line::channel.eq(channel))
            .filter(bill_line::account.eq(scope.account))
            .filter(bill_line::kind.eq(kind.as_str()));
        type Row = (
            String,
            String,
            String,
            i64,
            String,
            Option<i64>,
            Option<Timestamp>,
            Option<String>,
        );
        let rows: Vec<Row> = match kind {
            LineKind::Payment => bill_differences!(
                self,
                lines,
                scope,
                limit,
                pay_callback,
                on: pay_callback::out_trade_no
                    .eq(bill_line::out_trade_no)
                    .and(pay_callback::channel.eq(bill_line::channel))
                    .and(same_transaction!()),
                key: pay_callback::out_trade_no,
                fen: pay_callback::amount_fen,
                status: sql::<Nullable<Text>>("NULL")
            ),
            LineKind::Refund => bill_differences!(
                self,
                lines,
                scope,
                limit,
                refund_callback,
                on: refund_callback::out_refund_no
                    .eq(bill_line::out_refund_no)
                    .and(refund_callback::out_trade_no.eq(bill_line::out_trade_no))
                    .and(refund_callback::channel.eq(bill_line::channel)),
                key: refund_callback::out_refund_no,
                fen: refund_callback::refund_fen,
                status: refund_callback::status.nullable()
            ),
        };
        Ok(rows
            .into_iter()
            .map(
                |(
                    out_trade_no,
                    out_refund_no,
                    transaction_id,
                    fen,
                    status,
                    our_fen,
                    our_at,
                    our_status,
                )| BillSide {
                    out_trade_no,
                    out_refund_no,
                    transaction_id,
                    fen,
                    status,
                    ours: our_fen.zip(our_at).map(|(fen, at)| Recorded {
                        fen,
                        at,
                        status: our_status.unwrap_or_else(|| "PAID".to_owned()),
                    }),
                },
            )
            .collect())
    }

    /// The account's ledger rows of `kind` recorded that day that no bill row of the day
    /// (of any account of the channel) names: at most `limit` + 1.
    pub async fn ours_only(
        &self,
        scope: &Scope<'_>,
        kind: LineKind,
        limit: usize,
    ) -> Result<Vec<OursOnly>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
        let rows: Vec<(String, String, String, i64, Timestamp, String)> = match kind {
            LineKind::Payment => ours_only!(
                self,
                scope,
                limit,
                pay_callback,
                LineKind::Payment,
                same: bill_line::out_refund_no.eq("").and(same_transaction!()),
                select: (
                    pay_callback::out_trade_no,
                    sql::<Text>("''"),
                    pay_callback::transaction_id,
                    pay_callback::amount_fen,
                    sql::<UtcTs>(&dated("pay_callback")),
                    sql::<Text>("'PAID'"),
                )
            ),
            LineKind::Refund => ours_only!(
                self,
                scope,
                limit,
                refund_callback,
                LineKind::Refund,
                same: bill_line::out_refund_no.eq(refund_callback::out_refund_no),
                select: (
                    refund_callback::out_trade_no,
                    refund_callback::out_refund_no,
                    refund_callback::refund_id,
                    refund_callback::refund_fen,
                    sql::<UtcTs>(&dated("refund_callback")),
                    refund_callback::status,
                )
            ),
        };
        Ok(rows
            .into_iter()
            .map(
                |(out_trade_no, out_refund_no, transaction_id, fen, at, status)| OursOnly {
                    // A refund's row holds its refund id there, not the payment's.
                    transaction_id: (kind == LineKind::Payment).then_some(transaction_id),
                    out_trade_no,
                    out_refund_no,
                    fen,
                    at,
                    status,
                },
            )
            .collect())
    }

    /// The ledger's payments and refunds of the account that day: counts and sums.
    pub async fn ours_totals(&self, scope: &Scope<'_>) -> Result<OurTotals, StoreError> {
        let (count, amount_fen) = day_totals!(self, scope, pay_callback, "pay_callback.amount_fen");
        let (refund_count, refund_fen) =
            day_totals!(self, scope, refund_callback, "refund_callback.refund_fen");
        Ok(OurTotals {
            count,
            amount_fen,
            refund_count,
            refund_fen,
        })
    }
}
