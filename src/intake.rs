//! The notify use case: admit a request (verify and decode it, learning a key it names once),
//! then settle the notice through the gate and the ledger and say what the provider is
//! answered. The notify route (`routes/notify.rs`) calls it for what arrives; re-apply
//! (`receipts/reapply.rs`) for a stored request verified again.

use std::sync::Arc;
use std::time::Instant;

use crate::certificates::{Certificates, Learned};
use crate::channel::{Endpoint, Inbound, Rejection, Reply};
use crate::gate::{Decision, Gate};
use crate::metrics::{Counted, Metrics, Refusal};
use crate::notice::{Notice, NoticeKind, Outcome};
use crate::store::{Store, StoreError};
use crate::time::Timestamp;

/// What a notice needs on its way in: the database, the Redis gate, the counters, the
/// platform keys a request may name before they are known, and the runtime its work is
/// detached onto.
pub struct Intake {
    store: Store,
    /// The Redis gate, when `redis.url` is set.
    gate: Option<Arc<Gate>>,
    metrics: Arc<Metrics>,
    certificates: Arc<Certificates>,
    runtime: tokio::runtime::Handle,
}

/// A request that was not admitted: how it is counted and answered.
#[derive(Debug)]
pub struct Refused {
    pub why: Refusal,
    pub status: u16,
    pub message: String,
    /// Whether its signature verified (it was refused by a later check).
    pub signed: bool,
}

/// The reply the provider gets for what the ledger did.
pub fn reply_for(outcome: Outcome) -> Reply<'static> {
    match outcome {
        Outcome::Applied | Outcome::Duplicate | Outcome::Anomaly(_) | Outcome::Ignored => {
            Reply::Success
        }
        Outcome::Conflict => Reply::Failure {
            status: 409,
            message: "business content differs from the first delivery of this key",
        },
        Outcome::UnknownOrder => Reply::Failure {
            status: 404,
            message: "unknown order",
        },
        Outcome::TooEarly => Reply::Failure {
            status: 404,
            message: "order not paid yet",
        },
        Outcome::Contended => Reply::Failure {
            status: 503,
            message: "order busy, retry",
        },
    }
}

/// What the gate and the ledger made of a verified notice.
enum Settled {
    /// The gate holds this content's final answer.
    Cached,
    /// The same notification is being applied elsewhere right now.
    Busy,
    Applied(Result<Outcome, StoreError>),
}

impl Intake {
    pub fn new(
        store: Store,
        gate: Option<Arc<Gate>>,
        metrics: Arc<Metrics>,
        certificates: Arc<Certificates>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        Self {
            store,
            gate,
            metrics,
            certificates,
            runtime,
        }
    }

    /// The Redis gate, when `redis.url` is set (`/readyz` asks it).
    pub fn gate(&self) -> Option<&Arc<Gate>> {
        self.gate.as_ref()
    }

    /// Verifies and decodes `request` with `channel`. A request naming a key not known yet
    /// (a rotation) waits for the merchant's keys to be fetched, once however many wait,
    /// and is verified again; past the bounded wait it is refused with a 503 so the
    /// provider retries. A refusal is logged once and counted.
    pub async fn admit(
        &self,
        channel: &dyn Endpoint,
        request: &Inbound<'_>,
    ) -> Result<Notice, Refused> {
        let id = channel.id();
        let (mut admitted, mut signed) = channel.admit_signed(request);
        if let Err(Rejection::UnknownSerial(_)) = &admitted {
            match self.certificates.unknown_serial(id, None).await {
                Learned::Asked => (admitted, signed) = channel.admit_signed(request),
                Learned::Nobody => {}
                Learned::TimedOut => {
                    let message = "platform certificates are being fetched; retry";
                    tracing::warn!(channel = %id, "notification names an unknown serial and its merchant's certificates did not arrive in time; answered 503 so the provider retries");
                    return Err(Refused {
                        why: Refusal::UnknownSerial,
                        status: 503,
                        message: message.to_owned(),
                        signed: false,
                    });
                }
            }
        }
        admitted.map_err(|rejection| {
            let why = Refusal::from(&rejection);
            if let Rejection::Undecryptable(_) = rejection {
                // Our key is wrong, not the provider: an operator must act while it retries.
                tracing::error!(channel = %id, detail = %rejection, "notification verified but not decryptable: check the configured key");
            } else {
                tracing::warn!(channel = %id, route = request.route.unwrap_or("-"), reason = why.label(), detail = %rejection, "notification rejected");
            }
            self.metrics.refused(id, why);
            Refused {
                why,
                status: rejection.status(),
                message: rejection.to_string(),
                signed,
            }
        })
    }

    /// Gate and ledger for a verified notice, run to its end on the service's runtime even
    /// if the provider hangs up (WeChat does after 5 s), so no transaction or connection is
    /// left half done; what it came to and the reply. Counted and logged once.
    pub async fn settle(
        self: &Arc<Self>,
        notice: &Notice,
        now: Timestamp,
        started: Instant,
    ) -> (Counted, Reply<'static>) {
        let id = notice.channel;
        let settled = {
            let (intake, notice) = (Arc::clone(self), notice.clone());
            self.runtime
                .spawn(async move { intake.gate_and_ledger(notice, now).await })
                .await
        };
        let result = match settled {
            Ok(Settled::Cached) => {
                // The same content was applied before: the same answer, no database.
                self.count(notice, Counted::DuplicateCached);
                return (Counted::DuplicateCached, Reply::Success);
            }
            Ok(Settled::Busy) => {
                self.count(notice, Counted::InFlight);
                return (
                    Counted::InFlight,
                    Reply::Failure {
                        status: 503,
                        message: "the same notification is being processed; retry",
                    },
                );
            }
            Ok(Settled::Applied(result)) => result,
            Err(e) => Err(StoreError::Task(e)),
        };
        match result {
            Ok(outcome) => {
                self.count(notice, Counted::Ledger(outcome));
                tracing::info!(
                    channel = %id,
                    out_trade_no = %notice.out_trade_no,
                    transaction_id = %notice.transaction_id,
                    outcome = outcome.as_str(),
                    anomaly = ?matches!(outcome, Outcome::Anomaly(_)).then_some(outcome),
                    latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                    "notification applied"
                );
                (Counted::Ledger(outcome), reply_for(outcome))
            }
            Err(e) => {
                // The provider retries: 503 when the database is out of reach or the
                // payment's group did not answer in time (it may still commit: the retry
                // finds out), 500 when a statement failed (a bug to look at). Only the first
                // two say nothing about what was stored; a failed statement stored nothing.
                let (counted, status, message) = if let StoreError::Undecided(_) = e {
                    (
                        Counted::Undecided,
                        503,
                        "not known yet whether it was stored; retry",
                    )
                } else if e.is_unavailable() {
                    (Counted::DbUnavailable, 503, "temporarily unavailable")
                } else {
                    (Counted::DbError, 500, "internal error")
                };
                self.count(notice, counted);
                tracing::error!(channel = %id, out_trade_no = %notice.out_trade_no, error = %e, "notification not stored; the provider will retry");
                (counted, Reply::Failure { status, message })
            }
        }
    }

    /// Counts what became of a verified notice: a transfer's anomaly apart from a payment's.
    fn count(&self, notice: &Notice, counted: Counted) {
        if let NoticeKind::Transfer(_) = notice.kind {
            self.metrics.transfer_notified(notice.channel, counted);
        } else {
            self.metrics.notified(notice.channel, counted);
        }
    }

    /// Gate, ledger, gate: everything a verified notice needs, as one task that runs to its
    /// end.
    async fn gate_and_ledger(&self, notice: Notice, now: Timestamp) -> Settled {
        let marker = match &self.gate {
            None => None,
            Some(gate) => match gate.enter(&notice).await {
                Decision::Proceed(marker) => marker,
                Decision::Answered => {
                    self.acknowledged(&notice);
                    return Settled::Cached;
                }
                Decision::Busy => return Settled::Busy,
            },
        };
        let result = self.store.apply(&notice, now).await;
        if let Some(gate) = &self.gate {
            gate.leave(&notice, marker, result.as_ref().ok().copied())
                .await;
        }
        if let Ok(Outcome::Applied | Outcome::Duplicate) = result {
            self.acknowledged(&notice);
        }
        Settled::Applied(result)
    }

    /// Remembers a payment or refund answered 2xx, for the recheck after a failover
    /// (`reconcile/failover.rs`).
    fn acknowledged(&self, notice: &Notice) {
        match &notice.kind {
            NoticeKind::Paid | NoticeKind::Refunded(_) => {
                self.store.writer().acknowledged(&notice.out_trade_no);
            }
            NoticeKind::Combined(combination) => {
                for sub in combination.subs.iter().filter(|s| s.is_paid()) {
                    self.store.writer().acknowledged(&sub.out_trade_no);
                }
            }
            _ => {}
        }
    }
}
