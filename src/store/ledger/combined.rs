//! A combined payment (合单支付): one verified delivery, every sub-order it lists decided in
//! ONE transaction — each by the single-order rules, under its own key `(out_trade_no,
//! channel)` — or nothing at all.
//!
//! The transaction starts by writing the combination's row (a no-op update): on PostgreSQL
//! and MySQL it takes the combination's lock, so two deliveries of one combination run one
//! after the other (the second finds every callback row and is a duplicate), and SQLite takes
//! its write lock at the first statement, as every write transaction here does. Sub-orders
//! are then taken in `out_trade_no` order.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::{Abort, held_by_another_account, load_order, outcome_of, owner_of, payment_anomaly};
use crate::notice::{AnomalyReason, Combination, Notice, Outcome, SubPayment};
use crate::order::Order;
use crate::outbox::Message;
use crate::store::schema::{combined_order, order_account, orders, pay_callback};
use crate::store::statements::{
    InsertAnomaly, InsertMessage, InsertPayCallback, MarkPaid, MarkSubPaid, PRIMARY,
    ReplacePayCallback, unless_exists,
};
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// What became of one sub-order of the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decided {
    Applied,
    /// Its callback row or its anomaly was recorded before: nothing written.
    Repeat,
    Anomaly(AnomalyReason),
}

/// The delivery's outcome from its sub-orders': `Applied` when any moved, else the first
/// anomaly raised now, else a duplicate (`Ignored` when no sub-order says it was paid).
fn overall(decided: &[Decided]) -> Outcome {
    if decided.is_empty() {
        return Outcome::Ignored;
    }
    if decided.contains(&Decided::Applied) {
        return Outcome::Applied;
    }
    decided
        .iter()
        .find_map(|d| match d {
            Decided::Anomaly(reason) => Some(Outcome::Anomaly(*reason)),
            _ => None,
        })
        .unwrap_or(Outcome::Duplicate)
}

/// Records `message`'s anomaly once: `Anomaly` when it is new, `Repeat` when its row exists.
macro_rules! anomaly_once {
    ($conn:expr, $message:expr, $reason:expr, $now:expr) => {{
        let message = $message;
        let written = InsertAnomaly::of(&message, $now).execute($conn).await;
        if unless_exists(written, PRIMARY)? == 0 {
            Decided::Repeat
        } else {
            InsertMessage::pending(&message, $now)
                .execute($conn)
                .await?;
            Decided::Anomaly($reason)
        }
    }};
}

/// One sub-order, inside the delivery's transaction: `Err(Abort::With(Conflict))` undoes
/// the whole delivery (the same `transaction_id` with other content than recorded).
macro_rules! decide_sub {
    ($conn:expr, $n:expr, $sub:expr, $combination:expr, $combine_matches:expr, $now:expr) => {{
        let (n, sub, combination, now): (&Notice, &SubPayment, &str, Timestamp) =
            ($n, $sub, $combination, $now);
        let mut one = n.sub_payment(sub);
        one.merchant_matches = $combine_matches;
        let order = load_order!($conn, &sub.out_trade_no)?;
        match order {
            Some(order) if order.combine_out_trade_no.as_deref() == Some(combination) => {
                let digest = n.sub_digest(sub);
                let written = InsertPayCallback::of(&one, &digest, now)
                    .execute($conn)
                    .await;
                let mut decided = None;
                if unless_exists(written, PRIMARY)? == 0 {
                    let (seen_txn, seen_digest): (String, String) = pay_callback::table
                        .find((&one.out_trade_no, one.channel.as_str()))
                        .select((pay_callback::transaction_id, pay_callback::digest))
                        .first($conn)
                        .await?;
                    if seen_digest == digest.as_str() {
                        decided = Some(Decided::Repeat);
                    } else if seen_txn == one.transaction_id {
                        return Err(Abort::With(Outcome::Conflict));
                    } else if held_by_another_account!($conn, &one, &seen_txn)? {
                        ReplacePayCallback {
                            paid: InsertPayCallback::of(&one, &digest, now),
                            held_by: &seen_txn,
                        }
                        .execute($conn)
                        .await?;
                    } else {
                        let message = Message::payment_anomaly(
                            &one,
                            &one.transaction_id,
                            AnomalyReason::DuplicatePayment,
                            &order,
                        );
                        decided = Some(anomaly_once!(
                            $conn,
                            message,
                            AnomalyReason::DuplicatePayment,
                            now
                        ));
                    }
                }
                match decided {
                    Some(decided) => decided,
                    None => {
                        let moved = if one.merchant_matches {
                            MarkSubPaid {
                                paid: MarkPaid::of(&one, now),
                                combination,
                            }
                            .execute($conn)
                            .await?
                        } else {
                            0
                        };
                        if moved == 1 {
                            let message = Message::sub_order_paid(&one, now, combination);
                            InsertMessage::pending(&message, now).execute($conn).await?;
                            Decided::Applied
                        } else {
                            let order = load_order!($conn, &one.out_trade_no)?.unwrap_or(order);
                            let owner = owner_of!($conn, &one)?;
                            match payment_anomaly(&order, &one, owner.as_deref()) {
                                // The payment the order records, its callback row gone.
                                None => Decided::Repeat,
                                Some(reason) => {
                                    let message = Message::payment_anomaly(
                                        &one,
                                        &one.transaction_id,
                                        reason,
                                        &order,
                                    );
                                    anomaly_once!($conn, message, reason, now)
                                }
                            }
                        }
                    }
                }
            }
            // Unknown, an ordinary order, or another combination's: an anomaly, nothing else.
            other => {
                let message = Message::not_in_combination(&one, combination, other.as_ref());
                anomaly_once!($conn, message, AnomalyReason::NotInCombination, now)
            }
        }
    }};
}

/// Whether every sub-order of `subs` has its callback row with its own digest: the whole
/// delivery is a repeat of a recorded one (one statement, the common retry).
macro_rules! all_recorded {
    ($conn:expr, $subs:expr, $digests:expr) => {{
        let subs: &[&SubPayment] = $subs;
        let keys: Vec<&str> = subs.iter().map(|s| s.out_trade_no.as_str()).collect();
        let recorded: Vec<(String, String)> = pay_callback::table
            .filter(pay_callback::channel.eq(crate::notice::ChannelId::Wechat.as_str()))
            .filter(pay_callback::out_trade_no.eq_any(&keys))
            .select((pay_callback::out_trade_no, pay_callback::digest))
            .load($conn)
            .await?;
        !subs.is_empty()
            && subs
                .iter()
                .zip($digests)
                .all(|(s, d): (&&SubPayment, &String)| {
                    recorded
                        .iter()
                        .any(|(no, seen)| *no == s.out_trade_no && seen == d)
                })
    }};
}

impl Store {
    /// Applies a verified combined payment `n` (its sub-orders `c`) in one transaction. An
    /// unknown combination is `UnknownOrder` (404) and writes nothing: it may be created
    /// late, and the provider retries.
    pub(super) async fn apply_combined(
        &self,
        n: &Notice,
        c: &Combination,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let combination = n.out_trade_no.as_str();
        let mut subs: Vec<&SubPayment> = c.subs.iter().filter(|s| s.is_paid()).collect();
        subs.sort_by(|a, b| a.out_trade_no.cmp(&b.out_trade_no));
        let digests: Vec<String> = subs
            .iter()
            .map(|s| n.sub_digest(s).as_str().to_owned())
            .collect();
        let result = with_conn!(self, conn => {
            // A retry of a delivery recorded whole needs no lock and writes nothing.
            if all_recorded!(conn, &subs, &digests) {
                return Ok(Outcome::Duplicate);
            }
            conn.transaction::<_, Abort, _>(async |conn| {
                let held = diesel::update(combined_order::table.find(combination))
                    .set(combined_order::sub_order_count.eq(combined_order::sub_order_count))
                    .execute(conn)
                    .await?;
                if held == 0 {
                    return Err(Abort::With(Outcome::UnknownOrder));
                }
                // A twin that held the lock before this one may have recorded it all.
                if all_recorded!(conn, &subs, &digests) {
                    return Err(Abort::With(Outcome::Duplicate));
                }
                let (channel, account): (String, String) = combined_order::table
                    .find(combination)
                    .select((combined_order::channel, combined_order::account))
                    .first(conn)
                    .await?;
                let combine_matches = n.merchant_matches
                    && channel == n.channel.as_str()
                    && account == n.merchant.merchant_id;
                let mut decided = Vec::with_capacity(subs.len());
                for sub in &subs {
                    decided.push(decide_sub!(conn, n, sub, combination, combine_matches, now));
                }
                let outcome = overall(&decided);
                if outcome == Outcome::Duplicate {
                    // Nothing was written but the combination's no-op: a plain duplicate.
                    return Err(Abort::With(Outcome::Duplicate));
                }
                Ok(outcome)
            })
            .await
        });
        outcome_of(result)
    }
}

#[cfg(test)]
mod tests {
    use super::{Decided, overall};
    use crate::notice::{AnomalyReason, Outcome};

    #[test]
    fn a_delivery_is_applied_when_any_sub_order_moved() {
        let mixed = [
            Decided::Repeat,
            Decided::Anomaly(AnomalyReason::AmountMismatch),
            Decided::Applied,
        ];
        assert_eq!(overall(&mixed), Outcome::Applied);
        let anomalies = [
            Decided::Repeat,
            Decided::Anomaly(AnomalyReason::NotInCombination),
        ];
        assert_eq!(
            overall(&anomalies),
            Outcome::Anomaly(AnomalyReason::NotInCombination)
        );
        assert_eq!(
            overall(&[Decided::Repeat, Decided::Repeat]),
            Outcome::Duplicate
        );
        assert_eq!(overall(&[]), Outcome::Ignored);
    }
}
