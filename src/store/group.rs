//! Group apply: payments that arrive together share one transaction, and one commit.
//!
//! A request with a verified payment hands it to a small applier (a queue, and two tasks on
//! the runtime that owns the pool) and waits for its answer. An applier takes whatever is
//! queued — never waiting for more, so a lone notice goes at once — up to
//! `database.group_apply_max`, and applies the common case of all of them together: a first
//! delivery for an order waiting for exactly its amount (`Applied`), or an exact repeat of a
//! committed one (`Duplicate`). PostgreSQL does it in one statement ([`PayGroup`]); MySQL and
//! SQLite in one transaction, each notice in a savepoint of its own. Each notice's three rows
//! still commit together, and nobody is answered before the commit.
//!
//! Whatever the group did not decide wrote nothing, and its caller runs the full transaction
//! of `ledger/` as before (conflicts, anomalies, unknown orders, a repeat racing its first
//! delivery). A group that fails (a deadlock, a statement error) is retried notice by notice
//! through the ordinary path; one that found no connection in time answers every caller with
//! that (503). Refunds, closes and payments signed by another merchant never queue.
//!
//! This file holds what one group does on each backend ([`PaymentGroup`]) and its wiring to
//! the pool (`Store::group`, `Store::pay_together`); the queue is `batch.rs` ([`Batcher`],
//! which knows nothing of payments); `ledger/` submits payments and takes the answers.
//!
//! [`PayGroup`]: super::statements::PayGroup

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use diesel::{QueryDsl, QueryResult};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::schema::pay_callback;
use super::statements::{
    InsertMessage, InsertPayCallback, MarkPaid, PRIMARY, PayGroup, unless_exists,
};
use super::types::Payload;
use super::{Store, StoreError, with_conn};
use crate::batch::{Batcher, GroupStats};
use crate::notice::{Digest, Notice, Outcome};
use crate::outbox::Message;
use crate::time::Timestamp;

/// Appliers per store: while one waits for its commit, the next group forms and goes.
pub(crate) const APPLIERS: usize = 2;

/// A verified payment, signed by its own merchant, as queued.
pub(crate) struct Payment {
    pub notice: Notice,
    pub digest: Digest,
    pub now: Timestamp,
}

/// What the group made of one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupResult {
    /// Applied or a duplicate, committed.
    Decided(Outcome),
    /// Not a common case; nothing was written: the full transaction decides.
    Undecided,
    /// Not tried in a group (another notice of its order was in it, the queue was full, or
    /// the group failed): the ordinary path, from the start.
    Alone,
    /// The database is away or too busy (503): no connection within the wait, a statement
    /// timeout, a lost connection. Retrying every payment alone would only wait as long again.
    Unavailable(Arc<str>),
}

/// What group apply did since start-up: `Store::group_stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GroupCounts {
    /// Groups applied together (one statement or one transaction each).
    pub groups: u64,
    /// Payments those groups carried.
    pub payments: u64,
    /// Payments a group decided (applied, or answered as duplicates); the others went on to
    /// the full transaction.
    pub decided: u64,
    /// Groups that failed as a whole; their payments were applied one by one.
    pub failed: u64,
    /// Payments those failed groups carried.
    pub failed_payments: u64,
}

impl From<&GroupStats> for GroupCounts {
    fn from(stats: &GroupStats) -> Self {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Self {
            groups: read(&stats.groups),
            payments: read(&stats.items),
            decided: read(&stats.decided),
            failed: read(&stats.failed),
            failed_payments: read(&stats.failed_items),
        }
    }
}

impl Store {
    /// The group applier (`group.rs`), started by the first payment that needs it; `None`
    /// when group apply is off or the store was built outside a runtime.
    pub(super) fn group(&self) -> Option<&Batcher<Payment, GroupResult>> {
        if self.group_max == 0 {
            return None;
        }
        let runtime = self.runtime.as_ref()?;
        Some(self.group.get_or_init(|| {
            // The appliers' own handle on the pool, without a group of its own (so the
            // appliers end when the last handle with one is dropped).
            let store = Store {
                group_max: 0,
                group: Default::default(),
                ..self.clone()
            };
            // SQLite has one writer: a second applier would only wait for the first.
            let appliers = if self.url.backend() == "sqlite" {
                1
            } else {
                APPLIERS
            };
            let stats = std::sync::Arc::new(GroupStats::default());
            let failures = stats.clone();
            let linger = std::time::Duration::ZERO;
            Batcher::start(
                self.group_max,
                appliers,
                linger,
                runtime,
                stats,
                move |payments| {
                    let (store, failures) = (store.clone(), failures.clone());
                    async move { store.pay_together(payments, &failures).await }
                },
            )
        }))
    }

    /// One group: one notice per order goes in (sorted by order, so groups lock orders in
    /// the same order), its twins go alone.
    async fn pay_together(&self, payments: Vec<Payment>, stats: &GroupStats) -> Vec<GroupResult> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut answers = vec![GroupResult::Alone; payments.len()];
        let mut orders = std::collections::HashSet::with_capacity(payments.len());
        let mut chosen: Vec<usize> = (0..payments.len())
            .filter(|&i| orders.insert(payments[i].notice.out_trade_no.as_str()))
            .collect();
        chosen.sort_by(|&a, &b| {
            payments[a]
                .notice
                .out_trade_no
                .cmp(&payments[b].notice.out_trade_no)
        });
        let group: Vec<&Payment> = chosen.iter().map(|&i| &payments[i]).collect();
        let result: Result<_, StoreError> =
            async { with_conn!(self, conn => Ok(conn.pay_group(&group).await?)) }.await;
        match result {
            Ok(outcomes) => {
                let decided = outcomes.iter().flatten().count();
                stats.decided.fetch_add(decided as u64, Relaxed);
                for (&i, outcome) in chosen.iter().zip(outcomes) {
                    answers[i] = outcome.map_or(GroupResult::Undecided, GroupResult::Decided);
                }
            }
            // A deadlock, or a statement that cannot be written (a row of one of the payments):
            // the payments are retried one by one, and only the one at fault fails again.
            Err(e @ StoreError::Query(_)) if !e.is_unavailable() || e.is_deadlock() => {
                stats.failed.fetch_add(1, Relaxed);
                stats.failed_items.fetch_add(group.len() as u64, Relaxed);
                tracing::warn!(
                    payments = group.len(),
                    error = %e,
                    "group apply failed; its payments are applied one by one"
                )
            }
            // The database is away or too busy (no connection within the wait, a statement
            // timeout, a lost connection): each payment alone would wait as long again.
            Err(e) => {
                let why: std::sync::Arc<str> = e.to_string().into();
                for &i in &chosen {
                    answers[i] = GroupResult::Unavailable(why.clone());
                }
            }
        }
        answers
    }
}

/// A group of payments, every one of a different order: for each, `Some(Applied)`,
/// `Some(Duplicate)` or `None` (it wrote nothing), in order. `Err` undid the whole group.
pub(crate) trait PaymentGroup {
    async fn pay_group(&mut self, payments: &[&Payment]) -> QueryResult<Vec<Option<Outcome>>>;
}

impl PaymentGroup for diesel_async::AsyncPgConnection {
    async fn pay_group(&mut self, payments: &[&Payment]) -> QueryResult<Vec<Option<Outcome>>> {
        let statement = PayGroup {
            out_trade_no: payments
                .iter()
                .map(|p| p.notice.out_trade_no.as_str())
                .collect(),
            channel: payments.iter().map(|p| p.notice.channel.as_str()).collect(),
            account: payments.iter().map(|p| p.notice.account()).collect(),
            transaction_id: payments
                .iter()
                .map(|p| p.notice.transaction_id.as_str())
                .collect(),
            amount_fen: payments.iter().map(|p| p.notice.amount_fen).collect(),
            currency: payments
                .iter()
                .map(|p| p.notice.currency.as_str())
                .collect(),
            digest: payments.iter().map(|p| p.digest.as_str()).collect(),
            payload: payments
                .iter()
                .map(|p| Payload(Message::order_paid(&p.notice, p.now).payload))
                .collect(),
            now: payments.iter().map(|p| p.now).collect(),
            occurred_at: payments.iter().map(|p| p.notice.occurred_at).collect(),
        };
        let rows: Vec<(i64, bool, Option<String>, i64)> = statement.load(self).await?;
        let mut outcomes = vec![None; payments.len()];
        for (position, applied, seen_digest, _guard) in rows {
            let Some(index) = usize::try_from(position - 1)
                .ok()
                .filter(|i| *i < payments.len())
            else {
                continue;
            };
            let (notice, digest) = (&payments[index].notice, &payments[index].digest);
            outcomes[index] = if applied {
                Some(Outcome::Applied)
            } else if seen_digest
                .as_deref()
                .is_some_and(|seen| notice.same_content(digest, seen))
            {
                Some(Outcome::Duplicate)
            } else {
                None
            };
        }
        Ok(outcomes)
    }
}

/// Undoes one notice's savepoint, or the whole group on a database error.
enum Undo {
    Db(diesel::result::Error),
    Notice,
}

impl From<diesel::result::Error> for Undo {
    fn from(e: diesel::result::Error) -> Self {
        Self::Db(e)
    }
}

/// MySQL and SQLite: one transaction (one commit, one sync) for the group, each notice in a
/// savepoint of its own: the callback row, the compare-and-set and `ORDER_PAID`, or — when
/// the order did not move — nothing.
macro_rules! pay_each {
    ($conn:expr, $payments:expr) => {{
        let payments: &[&Payment] = $payments;
        $conn
            .transaction::<_, diesel::result::Error, _>(async |conn| {
                let mut outcomes = Vec::with_capacity(payments.len());
                for p in payments {
                    let (n, digest, now) = (&p.notice, &p.digest, p.now);
                    let channel = n.channel.as_str();
                    let one = conn
                        .transaction::<_, Undo, _>(async |conn| {
                            let written = InsertPayCallback::of(n, digest, now).execute(conn).await;
                            if unless_exists(written, PRIMARY)? == 0 {
                                let seen: String = pay_callback::table
                                    .find((&n.out_trade_no, channel))
                                    .select(pay_callback::digest)
                                    .first(conn)
                                    .await?;
                                return Ok(n
                                    .same_content(digest, &seen)
                                    .then_some(Outcome::Duplicate));
                            }
                            let moved = MarkPaid::of(n, now).execute(conn).await?;
                            if moved != 1 {
                                return Err(Undo::Notice);
                            }
                            let message = Message::order_paid(n, now);
                            InsertMessage::pending(&message, now).execute(conn).await?;
                            Ok(Some(Outcome::Applied))
                        })
                        .await;
                    outcomes.push(match one {
                        Ok(outcome) => outcome,
                        Err(Undo::Notice) => None,
                        Err(Undo::Db(e)) => return Err(e),
                    });
                }
                Ok(outcomes)
            })
            .await
    }};
}

impl PaymentGroup for diesel_async::AsyncMysqlConnection {
    async fn pay_group(&mut self, payments: &[&Payment]) -> QueryResult<Vec<Option<Outcome>>> {
        pay_each!(self, payments)
    }
}

impl PaymentGroup for super::SqliteAsync {
    async fn pay_group(&mut self, payments: &[&Payment]) -> QueryResult<Vec<Option<Outcome>>> {
        pay_each!(self, payments)
    }
}
