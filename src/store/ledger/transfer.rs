//! A transfer's news, applied: what a verified notification or a signed provider answer says
//! about one merchant transfer becomes, in one transaction, the transfer's move and its final
//! event — or a `TRANSFER_ANOMALY`, or nothing. Notifications (through [`Store::apply`]) and
//! the transfers room's answers come through here alike, so whichever arrives first moves the
//! transfer and the other is a duplicate.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::{Abort, outcome_of};
use crate::notice::{AnomalyReason, ChannelId, Outcome};
use crate::outbox::{FinishedTransfer, Message};
use crate::store::schema::{transfer, transfer_anomaly};
use crate::store::statements::InsertMessage;
use crate::store::types::Payload;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;
use crate::transfer::{TransferSeen, TransferState, TransferStatus};

/// What the ledger reads of a transfer before it moves it.
#[derive(Debug, Clone, Queryable)]
struct Held {
    channel: String,
    account: String,
    amount_fen: i64,
    status: String,
    provider_state: Option<String>,
    provider_bill_no: Option<String>,
    fail_reason: Option<String>,
}

/// What `seen` does to the transfer held as `held`: moves it (to which status), or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferVerdict {
    Move(TransferStatus),
    /// Older or the same news, or news about a final transfer: nothing written.
    Stale,
    Anomaly(AnomalyReason),
}

/// The rules, apart from the database: the merchant, then the amount, then whether the news
/// is newer than what is recorded. A final status never moves.
pub fn transfer_verdict(
    account: &str,
    amount_fen: i64,
    status: TransferStatus,
    provider_state: Option<&str>,
    seen: &TransferSeen,
    merchant_matches: bool,
) -> TransferVerdict {
    if !merchant_matches || seen.account != account {
        return TransferVerdict::Anomaly(AnomalyReason::MerchantMismatch);
    }
    if seen.amount_fen.is_some_and(|fen| fen != amount_fen) {
        return TransferVerdict::Anomaly(AnomalyReason::AmountMismatch);
    }
    if status.is_final() {
        return TransferVerdict::Stale;
    }
    if let Some(recorded) = provider_state.and_then(TransferState::parse) {
        let same = provider_state == seen.provider_state.as_deref();
        if seen.state.rank() < recorded.rank() || same {
            return TransferVerdict::Stale;
        }
    }
    TransferVerdict::Move(seen.state.status().unwrap_or(status))
}

impl Store {
    /// Applies what a verified notification or signed answer says about one transfer of
    /// `channel`. `merchant_matches`: the account named is the one whose key signed it.
    ///
    /// `Applied`: the transfer moved (to a final status with its event). `Duplicate`: nothing
    /// newer. `Anomaly`: a `TRANSFER_ANOMALY`, once per key; the transfer did not move.
    pub async fn apply_transfer(
        &self,
        channel: ChannelId,
        seen: &TransferSeen,
        merchant_matches: bool,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let result = with_conn!(self, conn => {
            conn.transaction::<_, Abort, _>(async |conn| {
                // The row's lock first (an update that changes nothing), so two deliveries of
                // one transfer's news take turns.
                diesel::update(transfer::table.find(&seen.out_bill_no))
                    .set(transfer::attempts.eq(transfer::attempts))
                    .execute(conn)
                    .await?;
                let held: Option<Held> = transfer::table
                    .find(&seen.out_bill_no)
                    .select((
                        transfer::channel,
                        transfer::account,
                        transfer::amount_fen,
                        transfer::status,
                        transfer::provider_state,
                        transfer::provider_bill_no,
                        transfer::fail_reason,
                    ))
                    .first(conn)
                    .await
                    .optional()?;
                let held = held.filter(|h| h.channel == channel.as_str());
                let verdict = match &held {
                    None => TransferVerdict::Anomaly(AnomalyReason::UnknownTransfer),
                    Some(h) => transfer_verdict(
                        &h.account,
                        h.amount_fen,
                        TransferStatus::parse(&h.status).unwrap_or(TransferStatus::Processing),
                        h.provider_state.as_deref(),
                        seen,
                        merchant_matches,
                    ),
                };
                let (h, to) = match (held, verdict) {
                    (_, TransferVerdict::Stale) => return Ok(Outcome::Duplicate),
                    (h, TransferVerdict::Anomaly(reason)) => {
                        let ours = h.as_ref().map(|h| (h.account.as_str(), h.amount_fen));
                        let message = Message::transfer_anomaly(channel, seen, ours, reason);
                        let written = conn
                            .transaction::<_, diesel::result::Error, _>(async |conn| {
                                diesel::insert_into(transfer_anomaly::table)
                                    .values((
                                        transfer_anomaly::biz_key.eq(&message.biz_key),
                                        transfer_anomaly::out_bill_no.eq(&seen.out_bill_no),
                                        transfer_anomaly::payload
                                            .eq(Payload(message.payload.clone())),
                                        transfer_anomaly::created_at.eq(now),
                                    ))
                                    .execute(conn)
                                    .await
                            })
                            .await;
                        return match written {
                            Ok(_) => {
                                InsertMessage::pending(&message, now).execute(conn).await?;
                                Ok(Outcome::Anomaly(reason))
                            }
                            Err(diesel::result::Error::DatabaseError(
                                diesel::result::DatabaseErrorKind::UniqueViolation,
                                _,
                            )) => Ok(Outcome::Duplicate),
                            Err(e) => Err(Abort::Db(e)),
                        };
                    }
                    (Some(h), TransferVerdict::Move(to)) => (h, to),
                    (None, TransferVerdict::Move(_)) => return Ok(Outcome::Duplicate),
                };
                let finished = to.is_final();
                let bill_no = seen.provider_bill_no.clone().or(h.provider_bill_no);
                let fail_reason = match to {
                    TransferStatus::Fail => seen.fail_reason.clone().or(h.fail_reason),
                    _ => None,
                };
                let moved = diesel::update(
                    transfer::table
                        .find(&seen.out_bill_no)
                        .filter(transfer::status.eq(&h.status)),
                )
                .set((
                    transfer::status.eq(to.as_str()),
                    transfer::provider_state.eq(&seen.provider_state),
                    transfer::provider_bill_no.eq(&bill_no),
                    transfer::fail_reason.eq(&fail_reason),
                    transfer::updated_at.eq(now),
                    transfer::finished_at.eq(finished.then_some(now)),
                ))
                .execute(conn)
                .await?;
                if moved != 1 {
                    return Ok(Outcome::Duplicate);
                }
                if let Some(package_info) = &seen.package_info {
                    diesel::update(transfer::table.find(&seen.out_bill_no))
                        .set(transfer::package_info.eq(package_info))
                        .execute(conn)
                        .await?;
                }
                let done = FinishedTransfer {
                    out_bill_no: &seen.out_bill_no,
                    channel,
                    account: &h.account,
                    amount_fen: h.amount_fen,
                    status: to,
                    provider_bill_no: bill_no.as_deref(),
                    fail_reason: fail_reason.as_deref(),
                    finished_at: now,
                };
                if let Some(message) = Message::transfer_final(&done) {
                    InsertMessage::pending(&message, now).execute(conn).await?;
                }
                Ok(Outcome::Applied)
            })
            .await
        });
        outcome_of(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(state: TransferState, provider_state: &str) -> TransferSeen {
        TransferSeen {
            out_bill_no: "T1".into(),
            provider_bill_no: Some("B1".into()),
            state,
            provider_state: Some(provider_state.into()),
            amount_fen: Some(100),
            account: "1900000001".into(),
            package_info: None,
            fail_reason: None,
            occurred_at: None,
        }
    }

    fn verdict(
        status: TransferStatus,
        recorded: Option<&str>,
        s: &TransferSeen,
    ) -> TransferVerdict {
        transfer_verdict("1900000001", 100, status, recorded, s, true)
    }

    #[test]
    fn news_moves_a_transfer_forward_only() {
        use TransferState::*;
        use TransferStatus as S;
        let success = seen(Success, "SUCCESS");
        assert_eq!(
            verdict(S::Processing, None, &success),
            TransferVerdict::Move(S::Success)
        );
        assert_eq!(
            verdict(S::WaitUserConfirm, Some("WAIT_USER_CONFIRM"), &success),
            TransferVerdict::Move(S::Success)
        );
        // A final status never moves, not even to another final one.
        for status in [S::Success, S::Fail, S::Cancelled] {
            assert_eq!(
                verdict(status, Some("SUCCESS"), &seen(Fail, "FAIL")),
                TransferVerdict::Stale
            );
        }
        // Older news, and the same news again, write nothing.
        let confirm = seen(WaitUserConfirm, "WAIT_USER_CONFIRM");
        assert_eq!(
            verdict(S::Processing, Some("TRANSFERING"), &confirm),
            TransferVerdict::Stale
        );
        assert_eq!(
            verdict(S::WaitUserConfirm, Some("WAIT_USER_CONFIRM"), &confirm),
            TransferVerdict::Stale
        );
        assert_eq!(
            verdict(S::Processing, Some("ACCEPTED"), &confirm),
            TransferVerdict::Move(S::WaitUserConfirm)
        );
        // CANCELING keeps the status; TRANSFERING is PROCESSING again.
        assert_eq!(
            verdict(
                S::WaitUserConfirm,
                Some("WAIT_USER_CONFIRM"),
                &seen(Canceling, "CANCELING")
            ),
            TransferVerdict::Move(S::WaitUserConfirm)
        );
        assert_eq!(
            verdict(
                S::WaitUserConfirm,
                Some("WAIT_USER_CONFIRM"),
                &seen(Transfering, "TRANSFERING")
            ),
            TransferVerdict::Move(S::Processing)
        );
    }

    #[test]
    fn another_merchant_or_amount_is_an_anomaly_whatever_the_status() {
        let mut other = seen(TransferState::Success, "SUCCESS");
        other.account = "1900000002".into();
        assert_eq!(
            verdict(TransferStatus::Processing, None, &other),
            TransferVerdict::Anomaly(AnomalyReason::MerchantMismatch)
        );
        let same = seen(TransferState::Success, "SUCCESS");
        assert_eq!(
            transfer_verdict(
                "1900000001",
                100,
                TransferStatus::Processing,
                None,
                &same,
                false
            ),
            TransferVerdict::Anomaly(AnomalyReason::MerchantMismatch)
        );
        let mut more = seen(TransferState::Success, "SUCCESS");
        more.amount_fen = Some(101);
        assert_eq!(
            verdict(TransferStatus::Success, Some("SUCCESS"), &more),
            TransferVerdict::Anomaly(AnomalyReason::AmountMismatch)
        );
        // An answer that names no amount is not a mismatch.
        let mut quiet = seen(TransferState::Success, "SUCCESS");
        quiet.amount_fen = None;
        assert_eq!(
            verdict(TransferStatus::Processing, None, &quiet),
            TransferVerdict::Move(TransferStatus::Success)
        );
    }
}
