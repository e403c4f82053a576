//! The reports and their items (`bill_report`, `bill_item`): saved per account, read back
//! per day, and settled by a later run.

use diesel::prelude::*;
use diesel::result::Error;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::{PendingElsewhere, Scope};
use crate::bills::report::{Item, ItemType, OurTotals, Report, Resolution, Side, Status};
use crate::channel::bill::BillTotals;
use crate::notice::ChannelId;
use crate::store::schema::{bill_item, bill_report};
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

#[derive(Queryable, Insertable)]
#[diesel(table_name = bill_report)]
struct ReportRow {
    bill_date: String,
    channel: String,
    account: String,
    status: String,
    reason: Option<String>,
    fetched_at: Timestamp,
    provider_count: i64,
    provider_amount_fen: i64,
    provider_refund_count: i64,
    provider_refund_fen: i64,
    provider_fee_fen: i64,
    ours_count: i64,
    ours_amount_fen: i64,
    ours_refund_count: i64,
    ours_refund_fen: i64,
}

#[derive(Clone, Queryable, Insertable)]
#[diesel(table_name = bill_item)]
struct ItemRow {
    bill_date: String,
    channel: String,
    account: String,
    item_type: String,
    out_trade_no: String,
    out_refund_no: String,
    transaction_id: Option<String>,
    provider_status: Option<String>,
    provider_fen: Option<i64>,
    ours_status: Option<String>,
    ours_fen: Option<i64>,
    resolution: String,
}

impl ItemRow {
    fn of(date: &str, channel: ChannelId, account: &str, item: &Item) -> Self {
        Self {
            bill_date: date.to_owned(),
            channel: channel.as_str().to_owned(),
            account: account.to_owned(),
            item_type: item.kind.as_str().to_owned(),
            out_trade_no: item.out_trade_no.clone(),
            out_refund_no: item.out_refund_no.clone().unwrap_or_default(),
            transaction_id: item.transaction_id.clone(),
            provider_status: item.provider.as_ref().map(|s| s.status.clone()),
            provider_fen: item.provider.as_ref().map(|s| s.amount_fen),
            ours_status: item.ours.as_ref().map(|s| s.status.clone()),
            ours_fen: item.ours.as_ref().map(|s| s.amount_fen),
            resolution: item.resolution.as_str().to_owned(),
        }
    }

    fn item(self) -> Option<Item> {
        let side = |status: Option<String>, fen: Option<i64>| match (status, fen) {
            (Some(status), Some(amount_fen)) => Some(Side { status, amount_fen }),
            _ => None,
        };
        Some(Item {
            kind: ItemType::parse(&self.item_type)?,
            out_trade_no: self.out_trade_no,
            out_refund_no: Some(self.out_refund_no).filter(|r| !r.is_empty()),
            transaction_id: self.transaction_id,
            provider: side(self.provider_status, self.provider_fen),
            ours: side(self.ours_status, self.ours_fen),
            resolution: Resolution::parse(&self.resolution)?,
        })
    }
}

impl Store {
    /// Replaces the report of its (date, channel, account) and its items, in one transaction.
    pub async fn save_bill_report(&self, report: &Report) -> Result<(), StoreError> {
        let date = report.date.as_str();
        let channel = report.channel.as_str();
        let account = report.account.as_str();
        let row = ReportRow {
            bill_date: report.date.clone(),
            channel: channel.to_owned(),
            account: account.to_owned(),
            status: report.status.as_str().to_owned(),
            reason: report.reason.clone(),
            fetched_at: report.fetched_at,
            provider_count: report.provider.count,
            provider_amount_fen: report.provider.amount_fen,
            provider_refund_count: report.provider.refund_count,
            provider_refund_fen: report.provider.refund_fen,
            provider_fee_fen: report.provider.fee_fen,
            ours_count: report.ours.count,
            ours_amount_fen: report.ours.amount_fen,
            ours_refund_count: report.ours.refund_count,
            ours_refund_fen: report.ours.refund_fen,
        };
        let items: Vec<ItemRow> = report
            .items
            .iter()
            .map(|i| ItemRow::of(date, report.channel, account, i))
            .collect();
        with_conn!(self, conn => {
            conn.transaction::<_, Error, _>(async |conn| {
                diesel::delete(
                    bill_item::table
                        .filter(bill_item::bill_date.eq(date))
                        .filter(bill_item::channel.eq(channel))
                        .filter(bill_item::account.eq(account)),
                )
                .execute(conn)
                .await?;
                diesel::delete(
                    bill_report::table
                        .filter(bill_report::bill_date.eq(date))
                        .filter(bill_report::channel.eq(channel))
                        .filter(bill_report::account.eq(account)),
                )
                .execute(conn)
                .await?;
                diesel::insert_into(bill_report::table)
                    .values(&row)
                    .execute(conn)
                    .await?;
                for item in &items {
                    diesel::insert_into(bill_item::table)
                        .values(item)
                        .execute(conn)
                        .await?;
                }
                Ok(())
            })
            .await?;
        });
        Ok(())
    }

    /// The stored reports of `date` (of one channel, or all), with their items.
    pub async fn bill_reports(
        &self,
        date: &str,
        channel: Option<ChannelId>,
    ) -> Result<Vec<Report>, StoreError> {
        let (rows, items): (Vec<ReportRow>, Vec<ItemRow>) = with_conn!(self, conn => {
            let mut reports = bill_report::table
                .filter(bill_report::bill_date.eq(date))
                .order((bill_report::channel.asc(), bill_report::account.asc()))
                .into_boxed();
            let mut items = bill_item::table
                .filter(bill_item::bill_date.eq(date))
                .order((
                    bill_item::item_type.asc(),
                    bill_item::out_trade_no.asc(),
                    bill_item::out_refund_no.asc(),
                ))
                .into_boxed();
            if let Some(c) = channel {
                reports = reports.filter(bill_report::channel.eq(c.as_str()));
                items = items.filter(bill_item::channel.eq(c.as_str()));
            }
            (reports.load(conn).await?, items.load(conn).await?)
        });
        let mut reports = Vec::new();
        for r in rows {
            let Some(channel) = ChannelId::parse(&r.channel) else {
                continue;
            };
            let mine = items
                .iter()
                .filter(|i| i.channel == r.channel && i.account == r.account)
                .filter_map(|i| i.clone().item())
                .collect();
            reports.push(Report {
                date: r.bill_date,
                channel,
                account: r.account,
                integrity: crate::channel::bill::Integrity::of(channel),
                status: Status::parse(&r.status).unwrap_or(Status::Unavailable),
                reason: r.reason,
                fetched_at: r.fetched_at,
                provider: BillTotals {
                    count: r.provider_count,
                    amount_fen: r.provider_amount_fen,
                    refund_count: r.provider_refund_count,
                    refund_fen: r.provider_refund_fen,
                    fee_fen: r.provider_fee_fen,
                },
                ours: OurTotals {
                    count: r.ours_count,
                    amount_fen: r.ours_amount_fen,
                    refund_count: r.ours_refund_count,
                    refund_fen: r.ours_refund_fen,
                },
                items: mine,
            });
        }
        Ok(reports)
    }

    /// The items of `channel` of the `kinds` for one payment or refund, in the reports of
    /// every date but `except`, whatever their resolution.
    pub async fn items_elsewhere(
        &self,
        channel: ChannelId,
        kinds: &[ItemType],
        out_trade_no: &str,
        out_refund_no: &str,
        except: &str,
    ) -> Result<Vec<PendingElsewhere>, StoreError> {
        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let rows: Vec<ItemRow> = with_conn!(self, conn => {
            bill_item::table
                .filter(bill_item::channel.eq(channel.as_str()))
                .filter(bill_item::out_trade_no.eq(out_trade_no))
                .filter(bill_item::out_refund_no.eq(out_refund_no))
                .filter(bill_item::item_type.eq_any(&kinds))
                .filter(bill_item::bill_date.ne(except))
                .load(conn)
                .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let (date, account) = (r.bill_date.clone(), r.account.clone());
                r.item().map(|item| PendingElsewhere {
                    date,
                    account,
                    item,
                })
            })
            .collect())
    }

    /// The stored item of the scope's report of `kind` for one payment or refund, if any.
    pub async fn item_of(
        &self,
        scope: &Scope<'_>,
        kind: ItemType,
        out_trade_no: &str,
        out_refund_no: &str,
    ) -> Result<Option<Item>, StoreError> {
        let row: Option<ItemRow> = with_conn!(self, conn => {
            bill_item::table
                .filter(bill_item::bill_date.eq(scope.date))
                .filter(bill_item::channel.eq(scope.channel.as_str()))
                .filter(bill_item::account.eq(scope.account))
                .filter(bill_item::item_type.eq(kind.as_str()))
                .filter(bill_item::out_trade_no.eq(out_trade_no))
                .filter(bill_item::out_refund_no.eq(out_refund_no))
                .first(conn)
                .await
                .optional()?
        });
        Ok(row.and_then(ItemRow::item))
    }

    /// The status of the report of (`date`, `channel`, `account`), if there is one.
    pub async fn report_status(
        &self,
        date: &str,
        channel: ChannelId,
        account: &str,
    ) -> Result<Option<Status>, StoreError> {
        let status: Option<String> = with_conn!(self, conn => {
            bill_report::table
                .filter(bill_report::bill_date.eq(date))
                .filter(bill_report::channel.eq(channel.as_str()))
                .filter(bill_report::account.eq(account))
                .select(bill_report::status)
                .first(conn)
                .await
                .optional()?
        });
        Ok(status.as_deref().and_then(Status::parse))
    }

    /// Whether `channel` has a report of a date before `date` (the daily job ran then).
    pub async fn reported_before(
        &self,
        channel: ChannelId,
        date: &str,
    ) -> Result<bool, StoreError> {
        let earlier: i64 = with_conn!(self, conn => {
            bill_report::table
                .filter(bill_report::channel.eq(channel.as_str()))
                .filter(bill_report::bill_date.lt(date))
                .count()
                .get_result(conn)
                .await?
        });
        Ok(earlier > 0)
    }

    /// The pending items of `channel` in reports dated `until` or before.
    pub async fn pending_until(
        &self,
        channel: ChannelId,
        until: &str,
    ) -> Result<Vec<PendingElsewhere>, StoreError> {
        let rows: Vec<ItemRow> = with_conn!(self, conn => {
            bill_item::table
                .filter(bill_item::channel.eq(channel.as_str()))
                .filter(bill_item::resolution.eq(Resolution::Pending.as_str()))
                .filter(bill_item::bill_date.le(until))
                .load(conn)
                .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let (date, account) = (r.bill_date.clone(), r.account.clone());
                r.item().map(|item| PendingElsewhere {
                    date,
                    account,
                    item,
                })
            })
            .collect())
    }

    /// Settles a pending item of another report: removed (`None`: the other day's bill
    /// matched it) or given a new resolution; that report's status follows its items.
    pub async fn settle_item(
        &self,
        channel: ChannelId,
        pending: &PendingElsewhere,
        resolution: Option<Resolution>,
    ) -> Result<(), StoreError> {
        let c = channel.as_str();
        let key = bill_item::table
            .filter(bill_item::bill_date.eq(&pending.date))
            .filter(bill_item::channel.eq(c))
            .filter(bill_item::account.eq(&pending.account))
            .filter(bill_item::item_type.eq(pending.item.kind.as_str()))
            .filter(bill_item::out_trade_no.eq(&pending.item.out_trade_no))
            .filter(
                bill_item::out_refund_no.eq(pending.item.out_refund_no.clone().unwrap_or_default()),
            );
        with_conn!(self, conn => {
            conn.transaction::<_, Error, _>(async |conn| {
                match resolution {
                    None => {
                        diesel::delete(key).execute(conn).await?;
                    }
                    Some(r) => {
                        diesel::update(key)
                            .set(bill_item::resolution.eq(r.as_str()))
                            .execute(conn)
                            .await?;
                    }
                }
                let open: i64 = bill_item::table
                    .filter(bill_item::bill_date.eq(&pending.date))
                    .filter(bill_item::channel.eq(c))
                    .filter(bill_item::account.eq(&pending.account))
                    .filter(bill_item::resolution.eq(Resolution::Open.as_str()))
                    .count()
                    .get_result(conn)
                    .await?;
                let status = if open > 0 { Status::Mismatched } else { Status::Balanced };
                diesel::update(
                    bill_report::table
                        .filter(bill_report::bill_date.eq(&pending.date))
                        .filter(bill_report::channel.eq(c))
                        .filter(bill_report::account.eq(&pending.account))
                        .filter(bill_report::status.ne(Status::Unavailable.as_str())),
                )
                .set(bill_report::status.eq(status.as_str()))
                .execute(conn)
                .await?;
                Ok(())
            })
            .await?;
        });
        Ok(())
    }
}
