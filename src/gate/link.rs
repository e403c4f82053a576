//! The gate's transport: one Redis node, the master Redis Sentinel names, or a cluster; a
//! connection made on first use, a tight timeout on every call and a breaker that stops
//! trying for a while after repeated failures. It knows how to send [`Call`]s and hand each
//! its replies, not what they mean.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::OnceCell;

use super::call::Call;
use crate::config::{ConfigError, RedisNodes, RedisSettings, RedisTarget, invalid};
use crate::metrics::{GateResult, Metrics};
use crate::redis_master::Master;

/// The longest a connection to one node may take to open. It is opened in a task of its
/// own, so a call gives up after `redis.timeout_ms` (and is bypassed) while it goes on.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Failures in a row that open the breaker, and how long it then stays open.
const BREAKER_THRESHOLD: u32 = 5;
const BREAKER_OPEN: Duration = Duration::from_secs(5);

/// Consecutive failures and, when open, until when (ms since the gate was made).
pub(super) struct Breaker {
    failures: AtomicU32,
    open_until_ms: AtomicI64,
    epoch: Instant,
}

impl Breaker {
    pub(super) fn now_ms(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
    pub(super) fn is_open(&self) -> bool {
        self.now_ms() < self.open_until_ms.load(Ordering::Acquire)
    }
    pub(super) fn success(&self) {
        self.failures.store(0, Ordering::Release);
    }
    pub(super) fn failure(&self) {
        if self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= BREAKER_THRESHOLD {
            let until = self.now_ms() + i64::try_from(BREAKER_OPEN.as_millis()).unwrap_or(5000);
            self.open_until_ms.store(until, Ordering::Release);
            // Half-open after the pause: the next call probes, one failure reopens it.
            self.failures
                .store(BREAKER_THRESHOLD - 1, Ordering::Release);
        }
    }
}

/// Where the gate's keys live: one Redis node or the master sentinels name, or a Redis
/// Cluster.
enum Client {
    Master(Arc<Master>),
    Cluster(Box<ClusterClient>),
}

/// A connection to either. Both reconnect by themselves (through sentinels, a lost master is
/// asked for again: [`Master`]); the cluster connection also follows `MOVED`/`ASK`
/// redirections and refreshes its slot map. Every notice's pipeline touches the
/// keys of one order, which share a hash tag and so a slot.
#[derive(Clone)]
pub(super) enum Connection {
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

/// The connection side of the gate: the client, the timeout and the breaker.
pub(super) struct Link {
    client: Client,
    cluster: OnceCell<ClusterConnection>,
    timeout: Duration,
    pub(super) breaker: Breaker,
    pub(super) metrics: Arc<Metrics>,
    /// Whether a command refused by Redis itself (`ERR`) was logged: once, at warn.
    refused: AtomicBool,
}

impl Link {
    /// The client for `redis.url` (one node or a cluster) or `redis.sentinels`; nothing
    /// connects until first use.
    pub(super) fn new(
        settings: &RedisSettings,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ConfigError> {
        let timeout = Duration::from_millis(settings.timeout_ms);
        let connect = CONNECT_TIMEOUT.max(timeout);
        let client = match settings.target()? {
            None => return Err(invalid("redis.url", "(or redis.sentinels) is not set")),
            Some(RedisTarget::Nodes(RedisNodes::Single(url))) => {
                Client::Master(Arc::new(Master::node(&url, "redis.url", connect, timeout)?))
            }
            Some(RedisTarget::Sentinels(sentinels)) => {
                Client::Master(Arc::new(Master::sentinels(&sentinels, connect, timeout)?))
            }
            // The same bounds as one node: a slow or dead node costs one timeout, then the
            // breaker. The client retries a redirection (MOVED/ASK) within the call.
            Some(RedisTarget::Nodes(RedisNodes::Cluster(nodes))) => Client::Cluster(Box::new(
                ClusterClient::builder(nodes)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(1)
                    .build()
                    .map_err(|e| invalid("redis.url", e.to_string()))?,
            )),
        };
        Ok(Link {
            client,
            cluster: OnceCell::new(),
            timeout,
            breaker: Breaker {
                failures: AtomicU32::new(0),
                open_until_ms: AtomicI64::new(0),
                epoch: Instant::now(),
            },
            metrics,
            refused: AtomicBool::new(false),
        })
    }

    /// The connection and its number (0 for a cluster), made now if there is none.
    async fn connection(&self) -> Result<(Connection, u64), RedisError> {
        match &self.client {
            Client::Master(master) => master
                .connection()
                .await
                .map(|held| (Connection::Single(held.connection), held.generation)),
            Client::Cluster(client) => self
                .cluster
                .get_or_try_init(|| client.get_async_connection())
                .await
                .map(|c| (Connection::Cluster(c.clone()), 0)),
        }
    }

    /// A call on connection `generation` failed (`None`: timed out): through sentinels, the
    /// master is asked for again on the next call.
    fn failed(&self, generation: u64, error: Option<&RedisError>) {
        if let (Client::Master(master), 1..) = (&self.client, generation) {
            master.failed(generation, error);
        }
    }

    /// Runs one Redis call (carrying `calls` gate calls) under the timeout and the breaker;
    /// `None` means "bypass".
    pub(super) async fn call<T, F, Fut>(&self, what: &'static str, calls: u64, f: F) -> Option<T>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        if what != "release" && self.breaker.is_open() {
            self.metrics
                .gate_results(GateResult::BypassBreakerOpen, calls);
            return None;
        }
        let generation = AtomicU64::new(0);
        let result = tokio::time::timeout(self.timeout, async {
            let (conn, number) = self.connection().await?;
            generation.store(number, Ordering::Relaxed);
            f(conn).await
        })
        .await;
        match result {
            Ok(Ok(value)) => {
                self.breaker.success();
                Some(value)
            }
            Ok(Err(error)) => {
                // Redis refusing the command itself is no passing failure: an older Redis
                // than the gate needs. Said once, where operators look.
                if error.code() == Some("ERR") && !self.refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        what,
                        %error,
                        "redis refused a gate command (the gate needs Redis 7.0 or later); \
                         notices go to the database without it"
                    );
                }
                tracing::debug!(what, %error, "redis gate bypassed");
                self.failed(generation.load(Ordering::Relaxed), Some(&error));
                self.metrics.gate_results(GateResult::BypassError, calls);
                self.breaker.failure();
                None
            }
            Err(_) => {
                self.failed(generation.load(Ordering::Relaxed), None);
                self.metrics.gate_results(GateResult::BypassTimeout, calls);
                self.breaker.failure();
                None
            }
        }
    }

    pub(super) async fn cached(&self, key: &str) -> Option<Option<String>> {
        self.call("GET", 1, |mut c| async move { c.get(key).await })
            .await
    }

    /// One round trip for many notices' calls: one pipeline on one node; on a cluster, one
    /// pipeline per call (its keys share a slot), all at once. Each call's replies, `None`
    /// where Redis was bypassed.
    pub(super) async fn round_trip(self: Arc<Self>, calls: Vec<Call>) -> Vec<Option<Vec<Value>>> {
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
