//! The Redis gate in front of the ledger: a cached final answer for repeats, and a short
//! "processing" marker that keeps concurrent twins out of the database.
//!
//! Redis is an accelerator, never the guarantee: every call has a tight timeout, any error
//! or timeout sends the notice straight to the ledger (whose unique keys decide), and a
//! breaker stops trying for a while after repeated failures. A cached answer is only used
//! when its digest equals the notice's, so a stale entry can never turn a conflict into a
//! success.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

use crate::config::{ConfigError, RedisNodes, RedisSettings, invalid};
use crate::metrics::{GateResult, Metrics};
use crate::notice::{Notice, NoticeKind, Outcome};

/// Failures in a row that open the breaker, and how long it then stays open.
const BREAKER_THRESHOLD: u32 = 5;
const BREAKER_OPEN: Duration = Duration::from_secs(5);
/// How long a twin waits for the marker holder's answer before asking the provider to retry.
const TWIN_WAIT: Duration = Duration::from_millis(250);
const TWIN_POLL: Duration = Duration::from_millis(10);

/// KEYS: result, marker. ARGV: token, marker TTL (ms). The cached answer (`R{digest}`),
/// else the marker taken (`A`) or held by someone else (`H`).
const ENTER: &str = r#"
local cached = redis.call('GET', KEYS[1])
if cached then return 'R' .. cached end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 'A' end
return 'H'
"#;

/// KEYS: result, marker. ARGV: answer (empty: cache nothing), TTL (s), token. Caches the
/// answer, then compare-and-deletes the marker: only its holder removes it.
const LEAVE: &str = r#"
if ARGV[1] ~= '' then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return 1
"#;

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

#[derive(Debug)]
pub struct Marker {
    key: String,
    token: String,
}

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
/// `MOVED`/`ASK` redirections and refreshes its slot map. Every gate script touches the keys
/// of one order, which share a hash tag and so a slot.
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

pub struct Gate {
    client: Client,
    enter: redis::Script,
    leave: redis::Script,
    connection: OnceCell<Connection>,
    prefix: String,
    timeout: Duration,
    result_ttl_secs: u64,
    marker_ttl_ms: u64,
    breaker: Breaker,
    metrics: Arc<Metrics>,
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

/// A marker's owner token. A failed RNG gives a fixed token: compare-and-delete then only
/// lets a twin release the marker early, which costs speed, never correctness.
fn random_token() -> String {
    crate::notice::hex(&crate::random::bytes::<16>().unwrap_or_default())
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
        Ok(Self {
            client,
            enter: redis::Script::new(ENTER),
            leave: redis::Script::new(LEAVE),
            connection: OnceCell::new(),
            prefix: prefix.to_owned(),
            timeout,
            result_ttl_secs: settings.result_ttl_secs,
            marker_ttl_ms: settings.marker_ttl_ms,
            breaker: Breaker {
                failures: AtomicU32::new(0),
                open_until_ms: AtomicI64::new(0),
                epoch: Instant::now(),
            },
            metrics,
        })
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

    /// Runs one Redis call under the timeout and the breaker; `None` means "bypass".
    async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Option<T>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // A marker we hold is always given back, breaker or not: it would block its key
        // until its TTL otherwise.
        if what != "release" && self.breaker.is_open() {
            self.metrics.gate_result(GateResult::BypassBreakerOpen);
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
                self.metrics.gate_result(GateResult::BypassError);
                self.breaker.failure();
                None
            }
            Err(_) => {
                self.metrics.gate_result(GateResult::BypassTimeout);
                self.breaker.failure();
                None
            }
        }
    }

    async fn cached(&self, key: &str) -> Option<Option<String>> {
        self.call("GET", |mut c| async move { c.get(key).await })
            .await
    }

    /// Before the ledger: a cached answer for the same content, the marker, or a bypass.
    pub async fn enter(&self, n: &Notice) -> Decision {
        let Some(key) = self.key(n) else {
            return Decision::Proceed(None);
        };
        let digest = n.digest();
        let marker = Self::marker_key(&key);
        let token = random_token();
        let ttl = self.marker_ttl_ms;
        // One round trip: the cached answer, else the marker.
        let reply = self
            .call("enter", |mut c| {
                let mut invocation = self.enter.key(&key);
                invocation.key(&marker).arg(&token).arg(ttl);
                async move { invocation.invoke_async::<String>(&mut c).await }
            })
            .await;
        match reply.as_deref() {
            None => Decision::Proceed(None),
            Some("A") => Decision::Proceed(Some(Marker { key: marker, token })),
            Some("H") => self.wait_for_twin(&key, &marker, digest.as_str()).await,
            Some(cached) if cached.strip_prefix('R') == Some(digest.as_str()) => {
                self.metrics.gate_result(GateResult::Hit);
                Decision::Answered
            }
            // Different content under this key: the ledger decides (a conflict).
            Some(_) => Decision::Proceed(None),
        }
    }

    /// Another request is applying this key now: wait briefly for its answer. When the
    /// holder finishes without caching one (a conflict, an unknown order, an error), the
    /// marker is gone and the ledger answers this request too.
    async fn wait_for_twin(&self, key: &str, marker: &str, digest: &str) -> Decision {
        let deadline = Instant::now() + TWIN_WAIT;
        while Instant::now() < deadline {
            tokio::time::sleep(TWIN_POLL).await;
            match self.cached(key).await {
                None => return Decision::Proceed(None),
                Some(Some(seen)) if seen == digest => {
                    self.metrics.gate_result(GateResult::HitAfterWait);
                    return Decision::Answered;
                }
                Some(Some(_)) => return Decision::Proceed(None),
                Some(None) => {}
            }
            let held = self
                .call("EXISTS", |mut c| async move {
                    c.exists::<_, bool>(marker).await
                })
                .await;
            if held != Some(true) {
                // The holder may have cached its answer and given the marker back between the
                // two reads above: look once more before sending this twin to the ledger.
                return match self.cached(key).await {
                    Some(Some(seen)) if seen == digest => {
                        self.metrics.gate_result(GateResult::HitAfterWait);
                        Decision::Answered
                    }
                    _ => Decision::Proceed(None),
                };
            }
        }
        self.metrics.gate_result(GateResult::Busy);
        Decision::Busy
    }

    /// After the ledger: cache a final answer for the providers' retry window and give the
    /// marker back (only ours: compare-and-delete).
    /// `outcome` is `None` when the ledger failed: nothing is cached then.
    pub async fn leave(&self, n: &Notice, marker: Option<Marker>, outcome: Option<Outcome>) {
        let Some(key) = self.key(n) else { return };
        let settled = matches!(
            outcome,
            Some(Outcome::Applied | Outcome::Duplicate | Outcome::Anomaly(_))
        );
        if !settled && marker.is_none() {
            return;
        }
        let answer = if settled {
            n.digest().as_str().to_owned()
        } else {
            String::new()
        };
        let (marker, token) = match marker {
            Some(Marker { key, token }) => (key, token),
            None => (Self::marker_key(&key), String::new()),
        };
        let ttl = self.result_ttl_secs;
        // One round trip: cache the answer and give our marker back.
        // Giving a held marker back is tried even while the breaker is open.
        let what = if token.is_empty() { "cache" } else { "release" };
        self.call(what, |mut c| {
            let mut invocation = self.leave.key(&key);
            invocation.key(&marker).arg(&answer).arg(ttl).arg(&token);
            async move { invocation.invoke_async::<i64>(&mut c).await }
        })
        .await;
    }

    /// A stored `POST /orders` answer for an `Idempotency-Key`, if Redis has it.
    pub async fn idempotent_answer(&self, key: &str) -> Option<String> {
        let key = format!("{}idem:{key}", self.prefix);
        self.cached(&key).await.flatten()
    }

    pub async fn remember_answer(&self, key: &str, answer: &str) {
        let key = format!("{}idem:{key}", self.prefix);
        let ttl = self.result_ttl_secs;
        self.call("SET EX", |mut c| async move {
            c.set_ex::<_, _, ()>(&key, answer, ttl).await
        })
        .await;
    }

    /// Whether the breaker is open (Redis is being bypassed) right now.
    pub fn breaker_open(&self) -> bool {
        self.breaker.is_open()
    }

    /// Whether Redis answers a PING now.
    pub async fn is_up(&self) -> bool {
        self.call("PING", |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .is_some()
    }
}
