//! Redis Sentinel of the test's own: a master, one replica (`--replicaof`) and three
//! sentinels (`redis-server <conf> --sentinel`) on ports of their own, killed when the test
//! ends. The gate and the Redis stream sink find the master through the sentinels, follow it
//! after a failover, and a stream batch counts as sent only once `WAIT` saw a replica have it.
//! A `redis.url` that names a sentinel or a replica is never "up".

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use actix_web::http::StatusCode;
use paynotify::config::{RedisSettings, Secret, SinkKind};
use paynotify::relay::sink::Sink;
use paynotify::relay::sinks::RedisStreamSink;

use crate::support::helpers::{
    Backend, TestApp, eventually, metric, readiness, redis_answers, redis_connection,
    spawn_app_with, stream_entries,
};
use crate::support::test_channel::{TestNotification, deliver};

const MASTER_NAME: &str = "pn-sentinel";

/// A free port in 10000..19000, not in `taken`: below the kernel's ephemeral range
/// (32768..60999 by default), where an outgoing connection's local port (a replica's link to
/// its master, a test's client) could take it between this check and the node's bind.
fn free_port(taken: &[u16]) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7907);
    for _ in 0..500 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(10000 + seed.wrapping_add(n.wrapping_mul(41)) % 9000) else {
            continue;
        };
        if !taken.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port");
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

async fn conn(port: u16) -> redis::aio::MultiplexedConnection {
    redis_connection(&url(port)).await.expect("node answers")
}

/// `command` on the node at `port`; `None` when it cannot be reached or refuses (a node
/// being polled for a state it has not reached yet).
async fn ask<T: redis::FromRedisValue>(port: u16, command: &redis::Cmd) -> Option<T> {
    let mut c = redis_connection(&url(port)).await.ok()?;
    command.query_async(&mut c).await.ok()
}

/// `ROLE`'s first element: `master`, `slave` or `sentinel`; empty when the node does not
/// answer.
async fn role(port: u16) -> String {
    let Ok(mut c) = redis_connection(&url(port)).await else {
        return String::new();
    };
    let answer: Result<Vec<redis::Value>, _> = redis::cmd("ROLE").query_async(&mut c).await;
    match answer.ok().and_then(|v| v.into_iter().next()) {
        Some(first) => redis::from_redis_value::<String>(first).unwrap_or_default(),
        None => String::new(),
    }
}

/// A master, a replica of it and three sentinels; every process is killed on drop (a
/// stopped one too).
struct OwnSentinels {
    /// The first master and its replica, in that order (roles swap in a failover).
    data: [u16; 2],
    sentinels: [u16; 3],
    processes: Vec<(u16, Child)>,
    dir: tempfile::TempDir,
}

impl Drop for OwnSentinels {
    fn drop(&mut self) {
        for (_, child) in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl OwnSentinels {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut taken = Vec::new();
        for _ in 0..5 {
            let port = free_port(&taken);
            taken.push(port);
        }
        let mut own = Self {
            data: [taken[0], taken[1]],
            sentinels: [taken[2], taken[3], taken[4]],
            processes: Vec::new(),
            dir,
        };
        let master = own.data[0];
        for (i, port) in own.data.into_iter().enumerate() {
            let mut command = Command::new("redis-server");
            command
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dbfilename", &format!("dump-{port}.rdb")])
                .arg("--logfile")
                .arg(own.dir.path().join(format!("node-{port}.log")))
                .arg("--dir")
                .arg(own.dir.path());
            if i == 1 {
                command.args(["--replicaof", "127.0.0.1", &master.to_string()]);
            }
            own.spawn(port, &mut command);
        }
        for port in own.data {
            assert!(
                redis_answers(&url(port)).await,
                "redis on {port}: {}",
                own.log_tail(port)
            );
        }
        let replica = own.data[1];
        let linked = eventually(Duration::from_secs(10), || async move {
            let info: Option<String> = ask(replica, redis::cmd("INFO").arg("replication")).await;
            info.is_some_and(|i| i.contains("master_link_status:up"))
        })
        .await;
        assert!(linked, "the replica follows the master");
        for port in own.sentinels {
            let conf = own.dir.path().join(format!("sentinel-{port}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/node-{port}.log\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = own.dir.path().display(),
            );
            std::fs::write(&conf, text).expect("sentinel conf");
            let mut command = Command::new("redis-server");
            command.arg(&conf).arg("--sentinel");
            own.spawn(port, &mut command);
        }
        for port in own.sentinels {
            assert!(
                redis_answers(&url(port)).await,
                "sentinel on {port}: {}",
                own.log_tail(port)
            );
            // The sentinel has found the replica (INFO on the master) and it is usable.
            let knows = eventually(Duration::from_secs(10), || async move {
                let replicas: Vec<std::collections::HashMap<String, String>> = ask(
                    port,
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME),
                )
                .await
                .unwrap_or_default();
                replicas.iter().any(|r| {
                    r.get("flags").is_some_and(|f| f == "slave")
                        && r.get("master-link-status").is_some_and(|s| s == "ok")
                })
            })
            .await;
            assert!(knows, "sentinel {port} knows the replica");
        }
        own
    }

    /// The last lines of the node's log (its `dir` holds it), for a failed start's message.
    fn log_tail(&self, port: u16) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(format!("node-{port}.log")))
            .unwrap_or_else(|e| format!("(no log: {e})"));
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    fn spawn(&mut self, port: u16, command: &mut Command) {
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        self.processes.push((port, child));
    }

    fn pid(&self, port: u16) -> String {
        let (_, child) = self
            .processes
            .iter()
            .find(|(p, _)| *p == port)
            .expect("a process of ours");
        child.id().to_string()
    }

    fn signal(&self, port: u16, signal: &str) {
        let done = Command::new("kill")
            .args([signal, &self.pid(port)])
            .status()
            .expect("kill");
        assert!(done.success(), "kill {signal}");
    }

    fn addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// The master's port as the first sentinel names it.
    async fn master(&self) -> u16 {
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query_async(&mut conn(self.sentinels[0]).await)
            .await
            .expect("the sentinel names a master");
        port
    }

    /// `SENTINEL FAILOVER`, then waits until the other node is master and every sentinel
    /// names it, and with `settled` until the old master is its replica too (the sentinels
    /// demote a reachable old master some 8 s later; it takes writes until then); the new
    /// master's port.
    async fn fail_over(&self, settled: bool) -> u16 {
        let old = self.master().await;
        let new = if old == self.data[0] {
            self.data[1]
        } else {
            self.data[0]
        };
        let sentinel = self.sentinels[0];
        let started = eventually(Duration::from_secs(10), || async move {
            ask::<()>(
                sentinel,
                redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
            )
            .await
            .is_some()
        })
        .await;
        assert!(started, "SENTINEL FAILOVER accepted");
        let sentinels = self.sentinels;
        let done = eventually(Duration::from_secs(20), || async move {
            if role(new).await != "master" || (settled && role(old).await != "slave") {
                return false;
            }
            for port in sentinels {
                let named: Option<(String, u16)> = ask(
                    port,
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(MASTER_NAME),
                )
                .await;
                if named.map(|(_, p)| p) != Some(new) {
                    return false;
                }
            }
            if !settled {
                return true;
            }
            let info: Option<String> = ask(old, redis::cmd("INFO").arg("replication")).await;
            info.is_some_and(|i| i.contains("master_link_status:up"))
        })
        .await;
        assert!(done, "failed over from {old} to {new}");
        new
    }

    /// `[redis]` through these sentinels.
    fn settings(&self) -> RedisSettings {
        RedisSettings {
            sentinels: self.addresses(),
            sentinel_master: MASTER_NAME.to_owned(),
            key_prefix: "pn-sentinel:".to_owned(),
            // A second, where the test checks what the gate decides (a timed-out call is a
            // bypass, and 50 ms is too tight on two cores running the whole suite).
            timeout_ms: 1000,
            marker_ttl_ms: 2000,
            // Every repeat asks Redis: what it does is on trial here.
            recent_answers: 0,
            wait_timeout_ms: 300,
            ..RedisSettings::default()
        }
    }
}

fn cached(app: &TestApp) -> u64 {
    metric(
        app,
        "paynotify_notifications_total",
        &["wechat", "duplicate_cached"],
    )
}

async fn gate_key(port: u16, order: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(format!("pn-sentinel:{{{order}}}:pay:wechat"))
        .query_async(&mut conn(port).await)
        .await
        .expect("GET")
}

/// Delivers `order`'s payment until a repeat is answered from the cache (at most 10 s).
async fn served_from_the_cache(app: &TestApp, order: &str) -> bool {
    let n = TestNotification::paid(order, &format!("T-{order}"), 100);
    eventually(Duration::from_secs(10), || {
        let n = n.clone();
        async move {
            let before = cached(app);
            let (status, _) = deliver(app, &n).await;
            assert_eq!(status, StatusCode::NO_CONTENT);
            cached(app) > before
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinels_the_gate_caches_on_the_master_and_follows_a_failover() {
    let own = OwnSentinels::start().await;
    let redis = own.settings();
    let app = spawn_app_with(Backend::Postgres, move |s| s.redis = redis).await;
    let first = own.master().await;
    assert_eq!(first, own.data[0]);

    app.create_order("GS-1", 100).await;
    assert!(
        served_from_the_cache(&app, "GS-1").await,
        "a repeat is cached"
    );
    assert!(gate_key(first, "GS-1").await.is_some(), "on the master");
    let (_, ready) = readiness(&app).await;
    assert_eq!(ready["redis"], "up", "{ready}");

    // The old master still answers as one until the sentinels demote it: the gate must leave
    // it for the master they name now, whose cache then answers the repeats.
    let second = own.fail_over(false).await;
    app.create_order("GS-2", 100).await;
    let n = TestNotification::paid("GS-2", "T-GS-2", 100);
    // Well before the sentinels demote the old master (some 8 s): the gate asks them again
    // every second while calls come.
    let moved = eventually(Duration::from_secs(6), || {
        let (app, n) = (&app, n.clone());
        async move {
            assert_eq!(deliver(app, &n).await.0, StatusCode::NO_CONTENT);
            gate_key(second, "GS-2").await.is_some()
        }
    })
    .await;
    assert!(moved, "the gate caches on the new master");
    assert!(
        served_from_the_cache(&app, "GS-2").await,
        "the new master's cache answers"
    );
    assert_eq!(role(second).await, "master");
    let (_, ready) = readiness(&app).await;
    assert_eq!(ready["redis"], "up", "{ready}");
    // Exactly once all along: the database decided whatever the gate could not.
    assert_eq!(app.messages("ORDER_PAID").await, 2);
    assert_eq!(app.db.count("pay_callback").await, 2);
}

/// The stream sink on `[redis]` as the service builds it (the sentinels, `WAIT` for one
/// replica by default).
fn stream_sink(redis: &RedisSettings, stream: &str) -> Arc<dyn Sink> {
    let target = redis.target().expect("valid").expect("set");
    assert_eq!(
        redis.wait_replicas_for(&target),
        1,
        "one replica by default"
    );
    Arc::new(
        RedisStreamSink::on(
            "redis.sentinels",
            &target,
            stream,
            // The service gives a batch max(redis.timeout_ms, 1 s); these tests are about
            // `WAIT`, and on a loaded machine a sentinel lookup, a connect and a pipeline can
            // take longer than a second, which would fail a batch for another reason.
            Duration::from_secs(5),
            redis.wait_replicas_for(&target),
            Duration::from_millis(redis.wait_timeout_ms),
        )
        .expect("sink"),
    )
}

/// Ticks `relay` (each retry due at once) until it has published `want` rows or 30 s have
/// passed; how many it published. Bounded by time, not by a count of ticks: a tick whose
/// `WAIT` is not answered takes the whole `redis.wait_timeout_ms`, and how many of those a
/// restarted replica or a failover takes depends on the machine's load.
async fn publish_all(app: &TestApp, relay: &paynotify::relay::Relay, want: usize) -> usize {
    let started = std::time::Instant::now();
    let mut published = 0;
    while published < want && started.elapsed() < Duration::from_secs(30) {
        app.clock.advance(3600);
        published += relay.tick().await.expect("tick").published;
        if published < want {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    published
}

fn biz_keys(entries: &[(String, Vec<(String, String)>)]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|(_, fields)| {
            fields
                .iter()
                .find(|(k, _)| k == "biz_key")
                .map(|(_, v)| v.clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_batch_no_replica_confirmed_is_not_marked_sent_until_one_does() {
    let own = OwnSentinels::start().await;
    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    let stream = "pn-sentinel:events";
    let relay = crate::relay::relay(&app, stream_sink(&own.settings(), stream), 1000);
    crate::relay::pending_tagged(&app, "w", 3).await;

    let replica = own.data[1];
    own.signal(replica, "-STOP");
    let report = relay.tick().await.expect("tick");
    own.signal(replica, "-CONT");
    assert_eq!((report.published, report.failed), (0, 3), "{report:?}");
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 0);
    // The master took the XADDs (a retry adds them again: at least once).
    assert_eq!(stream_entries(&url(own.data[0]), stream).await.len(), 3);

    // Once the replica answers again, the retry is confirmed and marked sent.
    assert_eq!(publish_all(&app, &relay, 3).await, 3);
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 3);
    let on_the_replica = biz_keys(&stream_entries(&url(replica), stream).await);
    for key in ["w0", "w1", "w2"] {
        assert!(
            on_the_replica.iter().any(|k| k == key),
            "{key} on the replica"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_sink_follows_the_new_master_after_a_failover() {
    let own = OwnSentinels::start().await;
    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    let stream = "pn-sentinel:events";
    let relay = crate::relay::relay(&app, stream_sink(&own.settings(), stream), 1000);
    crate::relay::pending_tagged(&app, "a", 2).await;
    assert_eq!(relay.tick().await.expect("tick").published, 2);

    let second = own.fail_over(true).await;
    crate::relay::pending_tagged(&app, "b", 2).await;
    assert_eq!(
        publish_all(&app, &relay, 2).await,
        2,
        "the new rows reached the new master"
    );
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 4);
    let on_the_new_master = biz_keys(&stream_entries(&url(second), stream).await);
    for key in ["a0", "a1", "b0", "b1"] {
        assert!(
            on_the_new_master.iter().any(|k| k == key),
            "{key} on the new master: {on_the_new_master:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_url_naming_a_sentinel_or_a_replica_is_not_up() {
    let own = OwnSentinels::start().await;
    let (sentinel, replica) = (own.sentinels[0], own.data[1]);
    let app = spawn_app_with(Backend::Sqlite, move |s| {
        s.redis.url = Secret::new(url(sentinel));
        s.redis.timeout_ms = 1000;
        // Every repeat asks Redis, not this instance's memory.
        s.redis.recent_answers = 0;
        s.relay.sink = SinkKind::RedisStream;
        s.relay.redis_url = Secret::new(url(replica));
    })
    .await;
    let (status, ready) = readiness(&app).await;
    assert_eq!(
        status, 200,
        "Redis never makes the service unready: {ready}"
    );
    assert_eq!(ready["redis"], "down", "a sentinel is no master: {ready}");
    assert_eq!(ready["sink"], "down", "a replica is no master: {ready}");
    // The notify endpoints work: the gate is bypassed, the database decides.
    app.create_order("GW-1", 100).await;
    let n = TestNotification::paid("GW-1", "T-GW-1", 100);
    for _ in 0..2 {
        assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    }
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(cached(&app), 0, "nothing was served from a sentinel");

    // The master itself is up.
    let master = own.data[0];
    let app = spawn_app_with(Backend::Sqlite, move |s| {
        s.redis.url = Secret::new(url(master));
        s.redis.timeout_ms = 1000;
    })
    .await;
    let (_, ready) = readiness(&app).await;
    assert_eq!(ready["redis"], "up", "{ready}");
}
