//! Reading one account's bill: fetched from its provider, checked, and streamed into
//! `bill_line` in batches.

use chrono::NaiveDate;

use super::Bills;
use super::store::MAX_ID;
use crate::channel::api::Failure;
use crate::channel::bill::{BillError, BillLine, BillSource, BillTotals, Fetched, LineKind};
use crate::store::StoreError;

/// The longest provider status a bill row may carry (`bill_line.status`).
const MAX_STATUS: usize = 32;

/// Bill rows per insert statement.
const LINE_BATCH: usize = 1000;

/// One account's bill, as far as it got.
pub(super) enum Got {
    Read(BillTotals),
    NoBill(String),
    Unavailable(BillError),
}

impl Bills {
    /// Fetches one account's bill and streams its rows into `bill_line`. A key the provider
    /// names that is not known makes the channel's keys be fetched, then the bill once more.
    pub(super) async fn read(
        &self,
        source: &dyn BillSource,
        account: &str,
        date: NaiveDate,
        day: &str,
    ) -> Result<Got, StoreError> {
        let fetched = self
            .certificates
            .relearned(
                source.channel(),
                account,
                self.clock.now(),
                |fetched| matches!(fetched, Err(BillError::Failed(Failure::UnknownKey(_)))),
                |_| source.fetch(account, date, self.download_timeout, self.clock.now()),
            )
            .await;
        let file = match fetched {
            Ok(Fetched::Bill(file)) => file,
            Ok(Fetched::NoBill(why)) => return Ok(Got::NoBill(why)),
            Err(e) => return Ok(Got::Unavailable(e)),
        };
        // Parsed on a blocking thread, in batches handed to this task to insert: memory
        // stays at a few batches whatever the bill's size.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<BillLine>>(4);
        let parse = tokio::task::spawn_blocking(move || {
            let mut batch = Vec::with_capacity(LINE_BATCH);
            let totals = file.read(&mut |line: BillLine| {
                for (what, id) in [
                    ("out_trade_no", line.out_trade_no.as_str()),
                    ("transaction_id", line.transaction_id.as_str()),
                    ("out_refund_no", line.out_refund_no.as_deref().unwrap_or("")),
                ] {
                    if id.len() > MAX_ID {
                        return Err(BillError::Format(format!(
                            "{what} {id:?} is longer than {MAX_ID} characters"
                        )));
                    }
                }
                if line.status.chars().count() > MAX_STATUS {
                    return Err(BillError::Format(format!(
                        "status {:?} is longer than {MAX_STATUS} characters",
                        line.status
                    )));
                }
                if line.kind == LineKind::Payment && line.out_trade_no.is_empty() {
                    return Err(BillError::Format(
                        "a payment row without out_trade_no".into(),
                    ));
                }
                batch.push(line);
                if batch.len() == LINE_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(LINE_BATCH));
                    tx.blocking_send(full)
                        .map_err(|_| BillError::Format("the comparison stopped reading".into()))?;
                }
                Ok(())
            })?;
            if !batch.is_empty() {
                tx.blocking_send(batch)
                    .map_err(|_| BillError::Format("the comparison stopped reading".into()))?;
            }
            Ok::<BillTotals, BillError>(totals)
        });
        let channel = source.channel();
        let mut refused = None;
        while let Some(batch) = rx.recv().await {
            if let Err(why) = self
                .store
                .insert_bill_lines(day, channel, account, &batch)
                .await?
            {
                refused = Some(BillError::Format(why));
                break;
            }
        }
        drop(rx);
        let parsed = parse.await.map_err(StoreError::Task)?;
        Ok(match (refused, parsed) {
            (Some(e), _) | (None, Err(e)) => Got::Unavailable(e),
            (None, Ok(totals)) => Got::Read(totals),
        })
    }
}
