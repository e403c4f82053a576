//! The Redis gate in front of the ledger: a cached final answer for repeats, and a short
//! "processing" marker that keeps concurrent twins out of the database.
//!
//! Redis is an accelerator, never the guarantee: every call has a tight timeout, any error
//! or timeout sends the notice straight to the ledger (whose unique keys decide), and a
//! breaker stops trying for a while after repeated failures. A cached answer is only used
//! when its digest equals the notice's, so a stale entry can never turn a conflict into a
//! success.
//!
//! A notice makes two calls. Before the ledger, one round trip reads the cached answer and
//! takes the marker (`GET`, `SET NX PX`, pipelined); the request waits for it. After the
//! ledger, caching the answer and deleting the marker is queued ([`Batcher`]) and goes once
//! the provider has its answer, [`LINGER`] later, in one pipeline with those of the notices
//! answered meanwhile (on a cluster, whose pipelines stay within one slot, one pipeline per
//! notice, all at once).

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

use crate::batch::{Batcher, GroupStats};
use crate::config::{ConfigError, RedisNodes, RedisSettings, invalid};
use crate::metrics::{GateResult, Metrics};
use crate::notice::{Notice, NoticeKind, Outcome};

/// Failures in a row that open the breaker, and how long it then stays open.
const BREAKER_THRESHOLD: u32 = 5;
const BREAKER_OPEN: Duration = Duration::from_secs(5);
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

/// A marker this request took: its key.
#[derive(Debug)]
pub struct Marker(String);

/// Consecutive failures and, when open, until when (ms since the gate was made).
struct Breaker {
    failures: AtomicU32,
    open_until_ms: AtomicI64,
    epoch: Instant,
}

impl Breaker {
    fn now_ms(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
    fn is_open(&self) -> bool {
        self.now_ms() < self.open_until_ms.load(Ordering::Acquire)
    }
    fn success(&self) {
        self.failures.store(0, Ordering::Release);
    }
    fn failure(&self) {
        if self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= BREAKER_THRESHOLD {
            let until = self.now_ms() + i64::try_from(BREAKER_OPEN.as_millis()).unwrap_or(5000);
            self.open_until_ms.store(until, Ordering::Release);
            // Half-open after the pause: the next call probes, one failure reopens it.
            self.failures
                .store(BREAKER_THRESHOLD - 1, Ordering::Release);
        }
    }
}

/// Where the gate's keys live: one Redis node, or a Redis Cluster.
enum Client {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

/// A connection to either. Both reconnect by themselves; the cluster connection also follows
/// `MOVED`/`ASK` redirections and refreshes its slot map. Every notice's pipeline touches the
/// keys of one order, which share a hash tag and so a slot.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// One notice's gate call, queued for the next round trip.
enum Call {
    /// Before the ledger: read the cached answer under `key`, take `marker` if nobody holds
    /// it. Replies: the cached answer, and `OK` if the marker was taken.
    Enter {
        key: String,
        marker: String,
        ttl_ms: u64,
    },
    /// After the ledger: cache `answer` under `key` (`None`: nothing final to cache) and give
    /// `marker` back (`None`: none was taken). No reply; nobody waits for it.
    Leave {
        key: String,
        answer: Option<String>,
        marker: Option<String>,
        ttl_secs: u64,
    },
}

impl Call {
    fn commands(&self, pipe: &mut Pipeline) {
        match self {
            Self::Enter {
                key,
                marker,
                ttl_ms,
            } => {
                pipe.get(key)
                    .cmd("SET")
                    .arg(marker)
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
            }
            Self::Leave {
                key,
                answer,
                marker,
                ttl_secs,
            } => {
                if let Some(answer) = answer {
                    pipe.set_ex(key, answer, *ttl_secs).ignore();
                }
                if let Some(marker) = marker {
                    pipe.del(marker).ignore();
                }
            }
        }
    }

    /// How many replies its commands give (the others are ignored).
    fn replies(&self) -> usize {
        match self {
            Self::Enter { .. } => 2,
            Self::Leave { .. } => 0,
        }
    }

    /// Whether it gives a marker back, which is tried even while the breaker is open (the
    /// marker would block its key until its TTL otherwise).
    fn releases(&self) -> bool {
        matches!(
            self,
            Self::Leave {
                marker: Some(_),
                ..
            }
        )
    }
}

/// The connection side of the gate: the client, the timeout and the breaker.
struct Link {
    client: Client,
    connection: OnceCell<Connection>,
    timeout: Duration,
    breaker: Breaker,
    metrics: Arc<Metrics>,
}

impl Link {
    async fn connection(&self) -> Result<Connection, String> {
        let connect = async {
            match &self.client {
                Client::Single(client) => {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout))
                        .set_number_of_retries(1);
                    client
                        .get_connection_manager_with_config(config)
                        .await
                        .map(Connection::Single)
                }
                Client::Cluster(client) => {
                    client.get_async_connection().await.map(Connection::Cluster)
                }
            }
            .map_err(|e| e.to_string())
        };
        self.connection.get_or_try_init(|| connect).await.cloned()
    }

    /// Runs one Redis call (carrying `calls` gate calls) under the timeout and the breaker;
    /// `None` means "bypass".
    async fn call<T, F, Fut>(&self, what: &'static str, calls: u64, f: F) -> Option<T>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        if what != "release" && self.breaker.is_open() {
            self.metrics
                .gate_results(GateResult::BypassBreakerOpen, calls);
            return None;
        }
        let result = tokio::time::timeout(self.timeout, async {
            let conn = self.connection().await?;
            f(conn).await.map_err(|e| e.to_string())
        })
        .await;
        match result {
            Ok(Ok(value)) => {
                self.breaker.success();
                Some(value)
            }
            Ok(Err(error)) => {
                tracing::debug!(what, %error, "redis gate bypassed");
                self.metrics.gate_results(GateResult::BypassError, calls);
                self.breaker.failure();
                None
            }
            Err(_) => {
                self.metrics.gate_results(GateResult::BypassTimeout, calls);
                self.breaker.failure();
                None
            }
        }
    }

    async fn cached(&self, key: &str) -> Option<Option<String>> {
        self.call("GET", 1, |mut c| async move { c.get(key).await })
            .await
    }

    /// One round trip for many notices' calls: one pipeline on one node; on a cluster, one
    /// pipeline per call (its keys share a slot), all at once. Each call's replies, `None`
    /// where Redis was bypassed.
    async fn round_trip(self: Arc<Self>, calls: Vec<Call>) -> Vec<Option<Vec<Value>>> {
        // Counted when sent (not when the breaker or a lost connection kept them back).
        let sent = |metrics: Arc<Metrics>, calls: u64| {
            metrics.gate_round_trips.inc();
            metrics.gate_calls.inc_by(calls);
        };
        if let Client::Cluster(_) = self.client {
            let mut pending = tokio::task::JoinSet::new();
            for (i, call) in calls.iter().enumerate() {
                let (link, mut pipe) = (self.clone(), redis::pipe());
                call.commands(&mut pipe);
                let what = if call.releases() { "release" } else { "call" };
                pending.spawn(async move {
                    let metrics = link.metrics.clone();
                    let replies = link
                        .call(what, 1, |mut c| async move {
                            sent(metrics, 1);
                            pipe.query_async::<Vec<Value>>(&mut c).await
                        })
                        .await;
                    (i, replies)
                });
            }
            let mut replies = vec![None; calls.len()];
            for (i, reply) in pending.join_all().await {
                replies[i] = reply;
            }
            return replies;
        }
        // A marker given back goes even while the breaker is open, and takes the calls queued
        // with it along.
        let what = if calls.iter().any(Call::releases) {
            "release"
        } else {
            "round trip"
        };
        let mut pipe = redis::pipe();
        for call in &calls {
            call.commands(&mut pipe);
        }
        let (metrics, n) = (self.metrics.clone(), calls.len() as u64);
        let replies = self
            .call(what, n, |mut c| async move {
                sent(metrics, n);
                pipe.query_async::<Vec<Value>>(&mut c).await
            })
            .await;
        let Some(replies) = replies else {
            return vec![None; calls.len()];
        };
        let mut replies = replies.into_iter();
        calls
            .iter()
            .map(|call| {
                let mine: Vec<Value> = replies.by_ref().take(call.replies()).collect();
                (mine.len() == call.replies()).then_some(mine)
            })
            .collect()
    }
}

pub struct Gate {
    link: Arc<Link>,
    /// After-ledger calls, queued; started by the first notice that needs it.
    queue: OnceLock<Batcher<Call, Option<Vec<Value>>>>,
    prefix: String,
    marker_ttl_ms: u64,
    result_ttl_secs: u64,
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
        let timeout = Duration::from_millis(settings.timeout_ms);
        let client = match RedisNodes::parse(settings.url.expose())? {
            RedisNodes::Single(url) => Client::Single(
                redis::Client::open(url).map_err(|e| invalid("redis.url", e.to_string()))?,
            ),
            // The same bounds as one node: a slow or dead node costs one timeout, then the
            // breaker. The client retries a redirection (MOVED/ASK) within the call.
            RedisNodes::Cluster(nodes) => Client::Cluster(Box::new(
                ClusterClient::builder(nodes)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(1)
                    .build()
                    .map_err(|e| invalid("redis.url", e.to_string()))?,
            )),
        };
        let link = Link {
            client,
            connection: OnceCell::new(),
            timeout,
            breaker: Breaker {
                failures: AtomicU32::new(0),
                open_until_ms: AtomicI64::new(0),
                epoch: Instant::now(),
            },
            metrics,
        };
        Ok(Self {
            link: Arc::new(link),
            queue: OnceLock::new(),
            prefix: prefix.to_owned(),
            marker_ttl_ms: settings.marker_ttl_ms,
            result_ttl_secs: settings.result_ttl_secs,
        })
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

    /// The result key of a notice, hash-tagged by order so a notice's keys share a Redis
    /// Cluster slot. Only payments and refunds have one: other kinds never skip the ledger.
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
            NoticeKind::Closed | NoticeKind::Other { .. } => None,
        }
    }

    /// The marker of a result key, in a namespace of its own so no result key equals it.
    fn marker_key(result_key: &str) -> String {
        match result_key.split_once("}:") {
            Some((head, tail)) => format!("{head}}}:marker:{tail}"),
            None => format!("{result_key}:marker"),
        }
    }

    /// Before the ledger: a cached answer for the same content, the marker, or a bypass.
    pub async fn enter(&self, n: &Notice) -> Decision {
        let Some(key) = self.key(n) else {
            return Decision::Proceed(None);
        };
        let digest = n.digest();
        let marker = Self::marker_key(&key);
        if self.link.breaker.is_open() {
            self.link.metrics.gate_result(GateResult::BypassBreakerOpen);
            return Decision::Proceed(None);
        }
        // One round trip: the cached answer, and the marker if nobody holds it.
        let call = Call::Enter {
            key: key.clone(),
            marker: marker.clone(),
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
                let [cached, taken]: [Value; 2] = replies.try_into().ok()?;
                let cached = redis::from_redis_value::<Option<String>>(cached).ok()?;
                let taken = redis::from_redis_value::<Option<String>>(taken).ok()?;
                Some((cached, taken))
            });
        let Some((cached, taken)) = reply else {
            return Decision::Proceed(None);
        };
        let taken = taken.map(|_| Marker(marker.clone()));
        match cached {
            Some(seen) if seen == digest.as_str() => {
                self.link.metrics.gate_result(GateResult::Hit);
                if let Some(Marker(marker)) = taken {
                    self.post(Call::Leave {
                        key,
                        answer: None,
                        marker: Some(marker),
                        ttl_secs: self.result_ttl_secs,
                    })
                    .await;
                }
                Decision::Answered
            }
            // Different content under this key: the ledger decides (a conflict).
            Some(_) => Decision::Proceed(taken),
            None if taken.is_some() => Decision::Proceed(taken),
            None => self.wait_for_twin(&key, &marker, digest.as_str()).await,
        }
    }

    /// Another request is applying this key now: wait briefly for its answer. When the
    /// holder finishes without caching one (a conflict, an unknown order, an error), the
    /// marker is gone and the ledger answers this request too.
    async fn wait_for_twin(&self, key: &str, marker: &str, digest: &str) -> Decision {
        let deadline = Instant::now() + TWIN_WAIT;
        while Instant::now() < deadline {
            tokio::time::sleep(TWIN_POLL).await;
            match self.link.cached(key).await {
                None => return Decision::Proceed(None),
                Some(Some(seen)) if seen == digest => {
                    self.link.metrics.gate_result(GateResult::HitAfterWait);
                    return Decision::Answered;
                }
                Some(Some(_)) => return Decision::Proceed(None),
                Some(None) => {}
            }
            let held = self
                .link
                .call("EXISTS", 1, |mut c| async move {
                    c.exists::<_, bool>(marker).await
                })
                .await;
            if held != Some(true) {
                // The holder may have cached its answer and given the marker back between the
                // two reads above: look once more before sending this twin to the ledger.
                return match self.link.cached(key).await {
                    Some(Some(seen)) if seen == digest => {
                        self.link.metrics.gate_result(GateResult::HitAfterWait);
                        Decision::Answered
                    }
                    _ => Decision::Proceed(None),
                };
            }
        }
        self.link.metrics.gate_result(GateResult::Busy);
        Decision::Busy
    }

    /// After the ledger: cache a final answer for the providers' retry window and give the
    /// marker back, without waiting (see [`LINGER`]). `outcome` is `None` when the
    /// ledger failed: nothing is cached then.
    ///
    /// The marker is deleted, not compared first: it is ours unless it outlived its TTL while
    /// the ledger worked and a twin took it, and deleting that one only lets a third twin on
    /// to the ledger, whose unique keys decide.
    pub async fn leave(&self, n: &Notice, marker: Option<Marker>, outcome: Option<Outcome>) {
        let Some(key) = self.key(n) else { return };
        let settled = matches!(
            outcome,
            Some(Outcome::Applied | Outcome::Duplicate | Outcome::Anomaly(_))
        );
        let leave = Call::Leave {
            key,
            answer: settled.then(|| n.digest().as_str().to_owned()),
            marker: marker.map(|Marker(key)| key),
            ttl_secs: self.result_ttl_secs,
        };
        self.post(leave).await;
    }

    /// Queues a `Leave` without waiting (or, when the queue is full, sends it now).
    async fn post(&self, leave: Call) {
        if let Call::Leave {
            answer: None,
            marker: None,
            ..
        } = leave
        {
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

    /// A stored `POST /orders` answer for an `Idempotency-Key`, if Redis has it.
    pub async fn idempotent_answer(&self, key: &str) -> Option<String> {
        let key = format!("{}idem:{key}", self.prefix);
        self.link.cached(&key).await.flatten()
    }

    pub async fn remember_answer(&self, key: &str, answer: &str) {
        let key = format!("{}idem:{key}", self.prefix);
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
