//! The payment fast path: a payment's common cases in one statement where the backend has
//! one, before the full transaction.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::notice::{Digest, Notice, Outcome};
use crate::outbox::Message;
use crate::store::statements::PayFirst;
use crate::store::types::Payload;
use crate::time::Timestamp;

/// A payment's common cases in one statement, where the backend has one: its first delivery
/// (`Applied`) or an exact repeat of a committed one (`Duplicate`). `None` when it is neither
/// or the backend has no such statement; nothing was written then, and the full transaction
/// decides.
pub(crate) trait PaymentFastPath {
    async fn pay_fast(
        &mut self,
        _: &Notice,
        _: &Digest,
        _: Timestamp,
    ) -> QueryResult<Option<Outcome>> {
        // A backend without such a statement: the transaction decides every payment.
        Ok(None)
    }
}

impl PaymentFastPath for diesel_async::AsyncPgConnection {
    async fn pay_fast(
        &mut self,
        n: &Notice,
        digest: &Digest,
        now: Timestamp,
    ) -> QueryResult<Option<Outcome>> {
        if !n.merchant_matches {
            return Ok(None);
        }
        let message = Message::order_paid(n, now);
        // `load`, not `get_result`: the statement commits implicitly, and only the end of its
        // reply says whether that commit succeeded (a deferred constraint, a serialization
        // failure or a server going down report after the row). `get_result` stops at the row.
        let rows: Vec<(i64, Option<String>, i64)> = PayFirst {
            out_trade_no: &n.out_trade_no,
            channel: n.channel.as_str(),
            account: n.account(),
            transaction_id: &n.transaction_id,
            amount_fen: n.amount_fen,
            currency: &n.currency,
            digest: digest.as_str(),
            now,
            occurred_at: n.occurred_at,
            payload: Payload(message.payload),
        }
        .load(self)
        .await?;
        let [(applied, seen_digest, _guard)] = <[_; 1]>::try_from(rows).map_err(|rows| {
            diesel::result::Error::DeserializationError(
                format!(
                    "the payment statement answered {} rows, not one",
                    rows.len()
                )
                .into(),
            )
        })?;
        Ok(if applied == 1 {
            Some(Outcome::Applied)
        } else if seen_digest
            .as_deref()
            .is_some_and(|seen| n.same_content(digest, seen))
        {
            Some(Outcome::Duplicate)
        } else {
            None
        })
    }
}

/// MySQL has no statement that inserts, updates and inserts again at once: the transaction.
impl PaymentFastPath for diesel_async::AsyncMysqlConnection {}

/// SQLite: one writer, no network; the transaction costs no round trips.
impl PaymentFastPath for crate::store::SqliteAsync {}
