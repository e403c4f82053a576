//! The Redis gate in front of the ledger: a cached final answer for repeats, and a short
//! "processing" marker that keeps concurrent twins out of the database.
//!
//! Redis is an accelerator, never the guarantee: every call has a tight timeout, any error
//! or timeout sends the notice straight to the ledger (whose unique keys decide), and a
//! breaker stops trying for a while after repeated failures. A cached answer is only used
//! when its digest equals the notice's, so a stale entry can never turn a conflict into a
//! success.
//!
//! A notice has one key, whose value is either the marker ([`call::MARKER`]: someone is
//! applying it) or its final answer. A first delivery makes two calls of one command each.
//! Before the ledger, `SET key marker NX PX ttl GET` takes the marker if the key is free and
//! reads what it held otherwise (the answer, or another request's marker); the request waits
//! for it. After the ledger, `SET key answer EX ttl` replaces the marker with the answer
//! (`DEL` when there is no final answer to cache); it is queued ([`Batcher`]) and goes once
//! the provider has its answer, [`LINGER`] later, in one pipeline with those of the notices
//! answered meanwhile (on a cluster, whose pipelines stay within one slot, one pipeline per
//! notice, all at once). A repeat answered from Redis makes one call, and writes nothing.
//!
//! Every cached answer carries the database writer's tag (`store/writer.rs`), `{tag:x}:{digest}`:
//! after a failover the tag changes and an answer cached before it counts as absent, so a
//! repeat goes to the ledger of the new writer, which may not have the payment.

mod call;
mod link;
mod recent;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::{AsyncCommands, Value};

use crate::batch::{Batcher, GroupStats};
use crate::config::{ConfigError, RedisSettings};
use crate::metrics::{GateResult, Metrics};
use crate::notice::{Notice, NoticeKind, Outcome};
use crate::store::writer::Writer;

use call::{Call, MARKER};
use link::Link;
use recent::Recent;

/// How long a twin waits for the marker holder's answer before asking the provider to retry.
const TWIN_WAIT: Duration = Duration::from_millis(250);
const TWIN_POLL: Duration = Duration::from_millis(10);
/// After-ledger calls sent together at most, and how long the first of them waits for others
/// (notices are answered a few hundred microseconds apart under load, and a round trip costs
/// Redis and us far more than its commands do). A repeat that comes meanwhile finds the
/// marker still held and waits for it, as for any holder.
const ROUND_TRIP_MAX: usize = 512;
const LINGER: Duration = Duration::from_millis(2);

/// What the gate decided for a notice.
#[derive(Debug)]
pub enum Decision {
    /// The same business content was already applied: answer success without the database.
    Answered,
    /// Another request holds this key's marker and did not finish in time: 503, retry.
    Busy,
    /// Go to the ledger; hand the marker (if one was taken) back to [`Gate::leave`].
    Proceed(Option<Marker>),
}

/// A marker this request took (on the notice's key), and the writer's tag when it was taken
/// (the answer is cached under that tag, so one applied before a failover is never trusted
/// after it).
#[derive(Debug)]
pub struct Marker(u64);

pub struct Gate {
    link: Arc<Link>,
    /// After-ledger calls, queued; started by the first notice that needs it.
    queue: OnceLock<Batcher<Call, Option<Vec<Value>>>>,
    /// The final answers this instance gave lately (`redis.recent_answers`), in front of
    /// Redis.
    recent: Recent,
    prefix: String,
    marker_ttl_ms: u64,
    result_ttl_secs: u64,
    /// The database's writer, whose tag every cached answer carries; `None`: tag 0.
    writer: Option<Arc<Writer>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A key part as it goes into a key: characters that structure keys (`{`, `}`, `:`) and
/// anything unusual are percent-escaped, so two different parts never make one key.
fn escape(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b"_-|*.".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Gate {
    /// A gate for `redis.url`; nothing connects until the first use, and Redis being down
    /// at start-up only means the gate is bypassed until it answers.
    pub fn new(
        settings: &RedisSettings,
        prefix: &str,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ConfigError> {
        let link = Link::new(settings, metrics)?;
        Ok(Self {
            link: Arc::new(link),
            queue: OnceLock::new(),
            recent: Recent::new(
                settings.recent_answers,
                Duration::from_secs(settings.result_ttl_secs),
            ),
            prefix: prefix.to_owned(),
            marker_ttl_ms: settings.marker_ttl_ms,
            result_ttl_secs: settings.result_ttl_secs,
            writer: None,
        })
    }

    /// Caches answers under `writer`'s tag, and trusts only those of its current tag.
    #[must_use]
    pub fn with_writer(mut self, writer: Arc<Writer>) -> Self {
        self.writer = Some(writer);
        self
    }

    /// The database writer's tag now.
    fn tag(&self) -> u64 {
        self.writer.as_ref().map_or(0, |w| w.tag())
    }

    /// A cached value: the answer under the writer's tag.
    fn stamped(tag: u64, answer: &str) -> String {
        format!("{tag:x}:{answer}")
    }

    /// The queue of after-ledger calls, its sender started on the runtime of the first notice;
    /// `None` outside a runtime.
    fn queue(&self) -> Option<&Batcher<Call, Option<Vec<Value>>>> {
        if let Some(queue) = self.queue.get() {
            return Some(queue);
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(self.queue.get_or_init(|| {
            let link = self.link.clone();
            Batcher::start(
                ROUND_TRIP_MAX,
                1,
                LINGER,
                &runtime,
                Arc::new(GroupStats::default()),
                move |calls| link.clone().round_trip(calls),
            )
        }))
    }

    /// The key of a notice, which holds its marker or its final answer, hash-tagged by order
    /// so the keys of one order share a Redis Cluster slot. Only payments and refunds have
    /// one: other kinds (transfers among them, rare and where money leaves) never skip the
    /// ledger.
    fn key(&self, n: &Notice) -> Option<String> {
        let order = escape(&n.out_trade_no);
        match &n.kind {
            NoticeKind::Paid => Some(format!("{}{{{order}}}:pay:{}", self.prefix, n.channel)),
            NoticeKind::Refunded(r) => Some(format!(
                "{}{{{order}}}:refund:{}:{}",
                self.prefix,
                n.channel,
                escape(&r.out_refund_no)
            )),
            // The combination's key: its sub-orders' keys are the ledger's alone.
            NoticeKind::Combined(_) => {
                Some(format!("{}{{{order}}}:combine:{}", self.prefix, n.channel))
            }
            NoticeKind::Closed | NoticeKind::Other { .. } | NoticeKind::Transfer(_) => None,
        }
    }

    /// Before the ledger: a cached answer for the same content, the marker, or a bypass.
    pub async fn enter(&self, n: &Notice) -> Decision {
        let Some(key) = self.key(n) else {
            return Decision::Proceed(None);
        };
        let digest = n.digest();
        let tag = self.tag();
        if self.recent.answered(&digest, tag) {
            // This instance gave this content its final answer lately: no round trip, and
            // no Redis needed at all.
            self.link.metrics.gate_result(GateResult::HitLocal);
            return Decision::Answered;
        }
        if self.link.breaker.is_open() {
            self.link.metrics.gate_result(GateResult::BypassBreakerOpen);
            return Decision::Proceed(None);
        }
        // One command: the marker if the key is free, else what the key holds.
        let call = Call::Enter {
            key: key.clone(),
            ttl_ms: self.marker_ttl_ms,
        };
        let reply = self
            .link
            .clone()
            .round_trip(vec![call])
            .await
            .pop()
            .flatten()
            .and_then(|replies| {
                let [held]: [Value; 1] = replies.try_into().ok()?;
                redis::from_redis_value::<Option<String>>(held).ok()
            });
        let Some(held) = reply else {
            return Decision::Proceed(None);
        };
        let expected = Self::stamped(tag, digest.as_str());
        match held {
            // The key was free: the marker is ours.
            None => Decision::Proceed(Some(Marker(tag))),
            Some(seen) if seen == expected => {
                self.link.metrics.gate_result(GateResult::Hit);
                self.recent.remember(&digest, tag);
                Decision::Answered
            }
            Some(seen) if seen == MARKER => {
                let decision = self.wait_for_twin(&key, &expected).await;
                if let Decision::Answered = decision {
                    self.recent.remember(&digest, tag);
                }
                decision
            }
            // Different content under this key (a conflict), or an answer cached under
            // another writer (before a failover): the ledger decides, and no marker is taken.
            Some(_) => Decision::Proceed(None),
        }
    }

    /// Another request is applying this key now: wait briefly for its answer. When the
    /// holder finishes without caching one (a conflict, an unknown order, an error), the
    /// key is gone and the ledger answers this request too; so it does when the key holds
    /// another answer than `digest` (as cached: under the writer's tag).
    async fn wait_for_twin(&self, key: &str, digest: &str) -> Decision {
        let deadline = Instant::now() + TWIN_WAIT;
        while Instant::now() < deadline {
            tokio::time::sleep(TWIN_POLL).await;
            match self.link.cached(key).await {
                Some(Some(seen)) if seen == digest => {
                    self.link.metrics.gate_result(GateResult::HitAfterWait);
                    return Decision::Answered;
                }
                Some(Some(seen)) if seen == MARKER => {}
                // Bypassed, given back without an answer, or another answer.
                None | Some(None) | Some(Some(_)) => return Decision::Proceed(None),
            }
        }
        self.link.metrics.gate_result(GateResult::Busy);
        Decision::Busy
    }

    /// After the ledger: cache a final answer for the providers' retry window and give the
    /// marker back, without waiting (see [`LINGER`]). `outcome` is `None` when the
    /// ledger failed: nothing is cached then.
    ///
    /// The marker is overwritten (or deleted), not compared first: it is ours unless it
    /// outlived its TTL while the ledger worked and a twin took it, and replacing that one
    /// only lets a third twin on to the ledger (or answers it with this final answer of the
    /// same key), and deleting a twin's answer only sends its repeats to the ledger, whose
    /// unique keys decide.
    pub async fn leave(&self, n: &Notice, marker: Option<Marker>, outcome: Option<Outcome>) {
        let Some(key) = self.key(n) else { return };
        let settled = matches!(
            outcome,
            Some(Outcome::Applied | Outcome::Duplicate | Outcome::Anomaly(_))
        );
        // The tag before the ledger ran: an answer given by the writer before a failover
        // is cached as that writer's.
        let tag = marker.as_ref().map_or_else(|| self.tag(), |m| m.0);
        let answer = settled.then(|| {
            let digest = n.digest();
            self.recent.remember(&digest, tag);
            Self::stamped(tag, digest.as_str())
        });
        let leave = Call::Leave {
            key,
            answer,
            held: marker.is_some(),
            ttl_secs: self.result_ttl_secs,
        };
        self.post(leave).await;
    }

    /// Queues a `Leave` without waiting (or, when the queue is full, sends it now).
    async fn post(&self, leave: Call) {
        if leave.is_empty() {
            return;
        }
        if !leave.releases() && self.link.breaker.is_open() {
            self.link.metrics.gate_result(GateResult::BypassBreakerOpen);
            return;
        }
        let leave = match self.queue() {
            Some(queue) => match queue.post(leave) {
                Ok(()) => return,
                Err(leave) => leave,
            },
            None => leave,
        };
        self.link.clone().round_trip(vec![leave]).await;
    }

    /// A stored `POST /orders` answer for an `Idempotency-Key`, if Redis has it under the
    /// current writer's tag (an order created before a failover may be gone).
    pub async fn idempotent_answer(&self, key: &str) -> Option<String> {
        let key = format!("{}idem:{key}", self.prefix);
        let stored = self.link.cached(&key).await.flatten()?;
        let (tag, answer) = stored.split_once(':')?;
        (tag == format!("{:x}", self.tag())).then(|| answer.to_owned())
    }

    pub async fn remember_answer(&self, key: &str, answer: &str) {
        let key = format!("{}idem:{key}", self.prefix);
        let answer = Self::stamped(self.tag(), answer);
        let answer = answer.as_str();
        let ttl = self.result_ttl_secs;
        self.link
            .call("SET EX", 1, |mut c| async move {
                c.set_ex::<_, _, ()>(&key, answer, ttl).await
            })
            .await;
    }

    /// Whether the breaker is open (Redis is being bypassed) right now.
    pub fn breaker_open(&self) -> bool {
        self.link.breaker.is_open()
    }

    /// Whether Redis answers a PING now.
    pub async fn is_up(&self) -> bool {
        self.link
            .call("PING", 1, |mut c| async move {
                redis::cmd("PING").query_async::<String>(&mut c).await
            })
            .await
            .is_some()
    }
}
