//! Money out, followed to the end: what a refund and a merchant transfer share.
//!
//! Both are a request recorded before its provider is called, sent under a number of the
//! caller's that the provider deduplicates on, and followed by a job until it is final:
//! - no answer (a timeout, a 5xx, an answer that does not verify) is unknown, never failure:
//!   the same request is sent again under the same number, 5 s later, then twice as long each
//!   time, never sooner than one call can take (so two sends never overlap);
//! - once the provider holds it, it is queried `query_after_secs` after, then every
//!   `query_every_secs`, until a signed answer says it is final;
//! - a refusal in the provider's words frees the money only once a query finds nothing under
//!   that number (an earlier send may have created it; the provider's error bodies are not
//!   always signed);
//! - a due request is taken by one instance at a time ([`Followed::claim`]), and its final
//!   answer goes through the ledger, which moves it once whoever applies it.
//!
//! [`Followed`] is that shape; [`follow_due`] is the job's loop over it. `crate::refunds` and
//! `crate::transfers` are its two instances.

use crate::store::StoreError;
use crate::time::Timestamp;

/// The first wait before a request without an answer is sent again; it doubles each time.
const FIRST_RETRY_SECS: i64 = 5;

/// When a followed request is called next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// The first query, this long after the provider accepted the request.
    pub query_after_secs: i64,
    /// Then this often until it is final.
    pub query_every_secs: i64,
    /// An unanswered request is sent again at most this long apart.
    pub max_retry_secs: i64,
    /// How long one provider call may take (`provider_api.timeout_ms`).
    pub call_secs: i64,
}

/// Seconds as the schedule counts them: a `u64` setting, saturated.
pub fn secs(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX / 4)
}

/// How long after its `attempts`-th unanswered send a request is sent again: 5 s, doubling,
/// at most `max` seconds.
pub fn retry_after(attempts: i32, max: i64) -> i64 {
    FIRST_RETRY_SECS
        .saturating_mul(1_i64 << attempts.clamp(0, 20))
        .min(max)
}

impl Schedule {
    /// After the `attempts`-th unanswered send: [`retry_after`], but never sooner than a call
    /// can take and 5 s, so the next send does not overlap this one.
    pub fn resend_after(&self, attempts: i32) -> i64 {
        retry_after(attempts, self.max_retry_secs)
            .max(self.call_secs.saturating_add(FIRST_RETRY_SECS))
    }

    /// The next call of a request taken now: a send again while the provider has not
    /// answered, else a query.
    pub fn next_call(&self, answered: bool, attempts: i32, now: Timestamp) -> Timestamp {
        if answered {
            now.plus_seconds(self.query_every_secs)
        } else {
            now.plus_seconds(self.resend_after(attempts + 1))
        }
    }

    /// The first query of a request the provider accepted now.
    pub fn first_query(&self, now: Timestamp) -> Timestamp {
        now.plus_seconds(self.query_after_secs)
    }
}

/// A kind of money-out request that a job follows until it is final.
pub trait Followed: Send + Sync {
    type Row: Send;

    /// The requests not final whose next call is due, oldest due first, at most `limit`.
    fn due(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Self::Row>, StoreError>> + Send;

    /// When the request is called next if this call gets no usable answer.
    fn next_call(&self, row: &Self::Row, now: Timestamp) -> Timestamp;

    /// Takes a due request for one call, its next call moved to `next`: false when another
    /// instance took it first.
    fn claim(
        &self,
        row: &Self::Row,
        next: Timestamp,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Sends it again (the provider has not answered) or queries it.
    fn call(&self, row: Self::Row) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The job: every due request, one call each. Returns how many it called about.
pub async fn follow_due<F: Followed>(
    followed: &F,
    now: Timestamp,
    limit: i64,
) -> Result<usize, StoreError> {
    let mut called = 0;
    for row in followed.due(now, limit).await? {
        let next = followed.next_call(&row, now);
        if !followed.claim(&row, next).await? {
            continue;
        }
        called += 1;
        followed.call(row).await?;
    }
    Ok(called)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_an_answer_is_sent_again_ever_later_up_to_the_limit() {
        let waits: Vec<i64> = (0..6).map(|n| retry_after(n, 60)).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
        assert_eq!(retry_after(10_000, 60), 60);
        assert_eq!(retry_after(-1, 60), 5);
    }

    #[test]
    fn a_send_again_never_overlaps_a_call_in_flight() {
        let schedule = Schedule {
            query_after_secs: 60,
            query_every_secs: 300,
            max_retry_secs: 300,
            call_secs: 10,
        };
        assert_eq!(schedule.resend_after(0), 15);
        assert_eq!(schedule.resend_after(3), 40);
        assert_eq!(schedule.resend_after(30), 300);
        let now = Timestamp::new(chrono::DateTime::from_timestamp(0, 0).expect("epoch"));
        assert_eq!(schedule.next_call(true, 0, now), now.plus_seconds(300));
        assert_eq!(schedule.next_call(false, 0, now), now.plus_seconds(15));
        assert_eq!(schedule.first_query(now), now.plus_seconds(60));
    }
}
