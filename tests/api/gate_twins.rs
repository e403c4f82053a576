//! The Redis gate's commands and its twins: what a notice costs Redis (counted by a recording
//! proxy), and the same notice applied once while its twins, on this instance or another,
//! wait for the answer the key comes to hold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use tokio::net::{TcpListener, TcpStream};

use crate::gate::{
    MARKER, REDIS, app_with_redis_only, cached, flush, from_ledger, gate_calls_reach, prefix, redis,
};
use crate::support::helpers::{Backend, TestApp, metric, released_together};
use crate::support::test_channel::{TestNotification, deliver};

/// What one connection sent to Redis.
type Sent = Arc<std::sync::Mutex<Vec<u8>>>;

/// A TCP proxy to Redis that keeps what its clients sent, to count the gate's commands.
struct Recorder {
    port: u16,
    sent: Arc<std::sync::Mutex<Vec<Sent>>>,
}

impl Recorder {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent: Arc<std::sync::Mutex<Vec<Sent>>> = Arc::default();
        let connections = sent.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let bytes: Sent = Arc::default();
                connections.lock().expect("lock").push(bytes.clone());
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect("127.0.0.1:6379").await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = inbound.into_split();
                    let (mut from_redis, mut to_redis) = upstream.into_split();
                    let back = tokio::spawn(async move {
                        tokio::io::copy(&mut from_redis, &mut to_client).await
                    });
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                        bytes.lock().expect("lock").extend_from_slice(&buf[..n]);
                        if to_redis.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    back.abort();
                });
            }
        });
        Self { port, sent }
    }

    /// Every command sent so far, by name and first argument, in order per connection.
    fn commands(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for bytes in self.sent.lock().expect("lock").iter() {
            let bytes = bytes.lock().expect("lock").clone();
            let mut at = 0;
            // A line up to \r\n from `at`: its text, and where the next one starts.
            let line = |at: usize| {
                let end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
                Some((
                    String::from_utf8_lossy(&bytes[at..end]).into_owned(),
                    end + 2,
                ))
            };
            while at < bytes.len() {
                let Some((head, next)) = line(at) else { break };
                let count: usize = head[1..].parse().expect("*<count>");
                at = next;
                let mut words = Vec::new();
                for _ in 0..count {
                    let (len, next) = line(at).expect("$<len>");
                    let len: usize = len[1..].parse().expect("length");
                    words.push(String::from_utf8_lossy(&bytes[next..next + len]).into_owned());
                    at = next + len + 2;
                }
                let mut words = words.into_iter();
                let name = words.next().unwrap_or_default().to_uppercase();
                out.push((name, words.next().unwrap_or_default()));
            }
        }
        out
    }

    /// The commands sent so far on the keys under `prefix`.
    fn on_keys(&self, prefix: &str) -> Vec<(String, String)> {
        self.commands()
            .into_iter()
            .filter(|(_, key)| key.starts_with(prefix))
            .collect()
    }
}

/// A first delivery costs Redis two commands on one key (the marker taken and the answer
/// read in one, then the answer in place of the marker), and a repeat from Redis one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_delivery_is_two_commands_on_one_key_and_a_repeat_one() {
    let prefix = prefix();
    let recorder = Recorder::start().await;
    let app = app_with_redis_only(
        Backend::Sqlite,
        &format!("redis://127.0.0.1:{}", recorder.port),
        &prefix,
    )
    .await;
    app.create_order("G-CMD", 100).await;
    let n = TestNotification::paid("G-CMD", "T-CMD", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    gate_calls_reach(&app, 2).await;
    let key = format!("{prefix}{{G-CMD}}:pay:wechat");
    let deadline = Instant::now() + Duration::from_secs(10);
    while recorder.on_keys(&prefix).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        recorder.on_keys(&prefix),
        [
            ("SET".to_owned(), key.clone()),
            ("SET".to_owned(), key.clone())
        ],
        "a first delivery"
    );
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(cached(&app), 1);
    assert_eq!(
        recorder.on_keys(&prefix).len(),
        3,
        "a repeat from Redis: {:?}",
        recorder.on_keys(&prefix)
    );
    flush(&prefix).await;
}

/// The same notification delivered to two instances sharing Redis at once: one applies it,
/// the twins on both instances find its marker and wait for its answer (or, if it is too
/// slow, are told to retry); few of them, if any, reach the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twins_on_two_instances_one_applies_the_others_get_its_answer() {
    let prefix = prefix();
    let first = Arc::new(app_with_redis_only(Backend::Postgres, REDIS, &prefix).await);
    let p = prefix.clone();
    let second = Arc::new(
        first
            .spawn_beside(move |s| {
                s.redis.url = paynotify::config::Secret::new(REDIS.to_owned());
                s.redis.key_prefix = p;
                s.redis.timeout_ms = 1000;
                s.redis.marker_ttl_ms = 2000;
                s.redis.recent_answers = 0;
            })
            .await,
    );
    first.create_order("G-TWIN", 100).await;
    let n = TestNotification::paid("G-TWIN", "T-TWIN", 100);
    let apps = [first.clone(), second.clone()];
    let statuses = released_together(40, |i| {
        let (app, n) = (apps[i % 2].clone(), n.clone());
        async move { deliver(&app, &n).await.0 }
    })
    .await;
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::NO_CONTENT || *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_eq!(first.messages("ORDER_PAID").await, 1);
    assert_eq!(first.db.count("pay_callback").await, 1);
    let applied =
        |app: &TestApp| metric(app, "paynotify_notifications_total", &["wechat", "applied"]);
    assert_eq!(applied(&first) + applied(&second), 1);
    let busy = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count() as u64;
    let from_cache = cached(&first) + cached(&second);
    let ledger = from_ledger(&first) + from_ledger(&second);
    assert_eq!(from_cache + ledger + busy, 39, "{statuses:?}");
    assert!(
        from_cache >= 20,
        "most twins answered from the cache: {from_cache} of 39 ({ledger} from the ledger)"
    );
    // The instance that did not apply it answered twins from the other's answer.
    let other = if applied(&first) == 1 {
        &second
    } else {
        &first
    };
    assert!(cached(other) >= 1, "{statuses:?}");
    flush(&prefix).await;
}

/// A request on another instance holds the key (its marker): a twin waits and takes the
/// holder's answer when it comes; a conflicting notice for the same order that waits the same
/// way is never answered with it, but by the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_waits_for_the_holders_answer_and_a_conflict_never_takes_it() {
    let prefix = prefix();
    let app = Arc::new(app_with_redis_only(Backend::Sqlite, REDIS, &prefix).await);
    app.create_order("G-HOLD", 100).await;
    let n = TestNotification::paid("G-HOLD", "T-HOLD", 100);
    assert_eq!(deliver(&app, &n).await.0, StatusCode::NO_CONTENT);
    let key = format!("{prefix}{{G-HOLD}}:pay:wechat");
    let mut c = redis().await;
    let get = |mut c: redis::aio::MultiplexedConnection, key: String| async move {
        redis::cmd("GET")
            .arg(&key)
            .query_async::<Option<String>>(&mut c)
            .await
            .expect("get")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match get(c.clone(), key.clone()).await {
            Some(v) if v != MARKER => break v,
            _ => assert!(Instant::now() < deadline, "the answer was never cached"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let hold = |mut c: redis::aio::MultiplexedConnection, key: String| async move {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(MARKER)
            .arg("PX")
            .arg(5000)
            .query_async(&mut c)
            .await
            .expect("set");
    };
    let finish = |c: redis::aio::MultiplexedConnection, key: String, answer: String| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut c = c;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&answer)
            .arg("EX")
            .arg(60)
            .query_async(&mut c)
            .await
            .expect("set");
    };
    let waited = |app: &TestApp| {
        metric(app, "paynotify_gate_total", &["hit"])
            + metric(app, "paynotify_gate_total", &["hit_after_wait"])
    };
    let before = waited(&app);

    hold(c.clone(), key.clone()).await;
    let holder = tokio::spawn(finish(c.clone(), key.clone(), answer.clone()));
    assert_eq!(
        deliver(&app, &n).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    holder.await.expect("holder");
    assert_eq!(
        waited(&app),
        before + 1,
        "answered with the holder's answer"
    );
    assert_eq!(from_ledger(&app), 0);

    // The same order, other content, while the holder applies: the ledger's 409.
    hold(c.clone(), key.clone()).await;
    let holder = tokio::spawn(finish(c.clone(), key.clone(), answer.clone()));
    let conflict = TestNotification::paid("G-HOLD", "T-HOLD", 99);
    assert_eq!(deliver(&app, &conflict).await.0, StatusCode::CONFLICT);
    holder.await.expect("holder");
    assert_eq!(waited(&app), before + 1);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // And the holder's answer is still there for the real repeats.
    assert_eq!(get(c.clone(), key.clone()).await, Some(answer));
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("del");
    flush(&prefix).await;
}
