//! The Redis gate on a Redis Cluster of the test's own: three masters started on ports of
//! their own (`redis-server --cluster-enabled yes` + `redis-cli --cluster create`), stopped
//! when the test ends.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use actix_web::http::StatusCode;

use crate::support::helpers::{
    Backend, Storm, TestApp, eventually, metric, readiness, redis_answers, released_together,
    spawn_app_with,
};
use crate::support::test_channel::{TestNotification, deliver};

/// Three cluster masters on 127.0.0.1; every node is killed on drop.
struct OwnCluster {
    ports: Vec<u16>,
    nodes: Vec<Child>,
    /// Node configuration files; removed on drop.
    dir: tempfile::TempDir,
}

/// A port in 20000..29000 that is free, and whose cluster bus port (port + 10000) is too.
fn cluster_port(taken: &[u16]) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..500 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(20000 + seed.wrapping_add(n.wrapping_mul(37)) % 9000) else {
            continue;
        };
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if !taken.contains(&port) && free(port) && free(port + 10000) {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    crate::support::helpers::redis_connection(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect("node answers")
}

impl OwnCluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Vec::new();
        for _ in 0..3 {
            let port = cluster_port(&ports);
            ports.push(port);
        }
        let mut cluster = Self {
            ports: Vec::new(),
            nodes: Vec::new(),
            dir,
        };
        for &port in &ports {
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", "2000"])
                .arg("--dir")
                .arg(cluster.dir.path())
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            cluster.nodes.push(child);
            cluster.ports.push(port);
        }
        for &port in &cluster.ports {
            let up = redis_answers(&format!("redis://127.0.0.1:{port}")).await;
            assert!(up, "cluster node on {port} did not start");
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli must be installed");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        for &port in &cluster.ports {
            let ok = eventually(Duration::from_secs(15), || async move {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut node(port).await)
                    .await
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
            })
            .await;
            assert!(ok, "cluster not ok on {port}");
        }
        cluster
    }

    /// The index of the node serving `key`'s slot (masters get slots in creation order).
    async fn owner(&self, key: &str) -> usize {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut node(self.ports[0]).await)
            .await
            .expect("keyslot");
        match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        }
    }

    /// Order numbers whose gate keys live on each of the three nodes, `per_node` each.
    async fn orders_on_every_node(&self, tag: &str, per_node: usize) -> Vec<String> {
        let mut found: [Vec<String>; 3] = Default::default();
        for i in 0..1000 {
            if found.iter().all(|f| f.len() >= per_node) {
                break;
            }
            let order = format!("{tag}-{i}");
            let owner = self.owner(&order).await;
            if found[owner].len() < per_node {
                found[owner].push(order);
            }
        }
        assert!(found.iter().all(|f| f.len() == per_node), "{found:?}");
        found.into_iter().flatten().collect()
    }

    fn kill(&mut self, index: usize) {
        let _ = self.nodes[index].kill();
        let _ = self.nodes[index].wait();
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for child in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `timeout_ms`: a second where the test checks what the gate decides (a timed-out call is a
/// bypass, and 50 ms is too tight on two cores running the whole suite); 50 ms in the fault
/// test, as in production.
async fn app_on(url: String, timeout_ms: u64) -> TestApp {
    spawn_app_with(Backend::Postgres, move |s| {
        s.redis.url = paynotify::config::Secret::new(url);
        s.redis.key_prefix = "pn-cluster:".to_owned();
        s.redis.timeout_ms = timeout_ms;
        s.redis.marker_ttl_ms = 2000;
        // Every repeat asks the cluster: what its nodes do is on trial here.
        s.redis.recent_answers = 0;
    })
    .await
}

fn cached(app: &TestApp) -> u64 {
    metric(
        app,
        "paynotify_notifications_total",
        &["wechat", "duplicate_cached"],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_duplicates_are_served_from_the_cache_on_every_node() {
    let cluster = OwnCluster::start().await;
    // One seed node: the client learns the slot map and follows redirections to the others.
    let app = Arc::new(
        app_on(
            format!("redis+cluster://127.0.0.1:{}", cluster.ports[0]),
            1000,
        )
        .await,
    );
    let orders = cluster.orders_on_every_node("GC", 2).await;
    for order in &orders {
        app.create_order(order, 100).await;
    }
    let statuses = released_together(orders.len() * 5, |i| {
        let (app, order) = (app.clone(), orders[i / 5].clone());
        async move {
            let n = TestNotification::paid(&order, &format!("T-{order}"), 100);
            deliver(&app, &n).await.0
        }
    })
    .await;
    for status in statuses {
        assert!(
            status == StatusCode::NO_CONTENT || status == StatusCode::SERVICE_UNAVAILABLE,
            "{status}"
        );
    }
    assert_eq!(app.messages("ORDER_PAID").await, orders.len() as i64);
    assert_eq!(app.db.count("pay_callback").await, orders.len() as i64);

    // Every order's answer is cached on the node that owns its slot: a repeat of each is
    // answered from the cache, byte for byte like the first answer.
    let before = cached(&app);
    for order in &orders {
        let n = TestNotification::paid(order, &format!("T-{order}"), 100);
        assert_eq!(
            deliver(&app, &n).await,
            (StatusCode::NO_CONTENT, String::new())
        );
        let owner = cluster.owner(order).await;
        let key = format!("pn-cluster:{{{order}}}:pay:wechat");
        let stored: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut node(cluster.ports[owner]).await)
            .await
            .expect("get on the owning node");
        assert!(stored.is_some(), "{key} cached on node {owner}");
    }
    assert_eq!(cached(&app), before + orders.len() as u64);
    let bypassed: u64 = ["bypass_error", "bypass_timeout", "bypass_breaker_open"]
        .iter()
        .map(|r| metric(&app, "paynotify_gate_total", &[r]))
        .sum();
    assert_eq!(bypassed, 0, "the cluster answered every call");
    let (_, ready) = readiness(&app).await;
    assert_eq!(ready["redis"], "up", "{ready}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_killed_mid_storm_leaves_exactly_once_intact() {
    let mut cluster = OwnCluster::start().await;
    // The node-list form of redis.url.
    let url = cluster
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let app = Arc::new(app_on(url, 50).await);
    let orders = cluster.orders_on_every_node("GK", 2).await;
    for order in &orders {
        app.create_order(order, 100).await;
    }
    let storm = Storm::start(&app, &orders, Some(Duration::from_secs(20)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    cluster.kill(1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let statuses = storm.stop().await;
    crate::support::helpers::assert_storm_answers(&statuses);
    assert_eq!(
        app.messages("ORDER_PAID").await,
        orders.len() as i64,
        "one transition per order"
    );
    assert_eq!(app.db.count("pay_callback").await, orders.len() as i64);
    let bypassed: u64 = ["bypass_error", "bypass_timeout", "bypass_breaker_open"]
        .iter()
        .map(|r| metric(&app, "paynotify_gate_total", &[r]))
        .sum();
    assert!(bypassed > 0, "the dead node was felt");
    // The service still answers a repeat for an order whose node is gone.
    let lost = &orders[2];
    assert_eq!(cluster.owner(lost).await, 1, "on the killed node");
    assert_eq!(
        deliver(
            &app,
            &TestNotification::paid(lost, &format!("T-{lost}"), 100)
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.messages("ORDER_PAID").await, orders.len() as i64);
}
