//! The consumer example (`consumer/examples/inventory.rs`) against the sandbox service, as the
//! README shows it: `paynotify serve` relaying to a Redis stream, `inventory --sink redis`
//! reading it, one order paid with three replayed notifications, and the stock one lower,
//! exactly once. Every command is printed as it runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel::sql_types::BigInt;
use diesel::{Connection, RunQueryDsl};

use crate::support::helpers::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_paynotify");
const REDIS: &str = "redis://127.0.0.1:6379";
const DEADLINE: Duration = Duration::from_secs(60);
/// The example shares the test's build, so only its own code compiles here.
const BUILD_DEADLINE: Duration = Duration::from_secs(15 * 60);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The child processes, killed when the test ends, passed or failed.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The test's own stream (and the consumer's parked stream), deleted at the end.
struct Stream(String);

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(mut c) = redis::Client::open(REDIS).and_then(|c| c.get_connection()) {
            let _: redis::RedisResult<()> = redis::cmd("DEL")
                .arg(&self.0)
                .arg(format!("{}:parked", self.0))
                .query(&mut c);
        }
    }
}

/// The command as a shell line, printed before it runs.
fn show(dir: &Path, cmd: &Command) {
    let envs: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?)))
        .collect();
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let program = Path::new(cmd.get_program())
        .file_name()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let at = cmd.get_current_dir().unwrap_or(dir);
    println!(
        "(cd {}) $ {}{program} {}",
        at.display(),
        envs.iter().map(|e| format!("{e} ")).collect::<String>(),
        args.join(" ")
    );
}

fn log(dir: &Path, name: &str) -> (Stdio, Stdio) {
    let f = std::fs::File::create(dir.join(name)).expect("log file");
    (
        Stdio::from(f.try_clone().expect("log file")),
        Stdio::from(f),
    )
}

/// The example binary, built now (the service's tests build no examples of the consumer
/// crate): `target/<profile>/examples/inventory`.
fn inventory_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    let mut build = Command::new(env!("CARGO"));
    build.args([
        "build",
        "-p",
        "paynotify-consumer",
        "--example",
        "inventory",
    ]);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    if let Some(target) = profile_dir.parent() {
        build.env("CARGO_TARGET_DIR", target);
    }
    let mut child = build.spawn().expect("cargo build the example");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for cargo build") {
            break status;
        }
        if start.elapsed() > BUILD_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("building the example took over {BUILD_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "building the example failed");
    let bin = profile_dir.join("examples").join("inventory");
    assert!(bin.exists(), "{} after the build", bin.display());
    bin
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// One number from the example's SQLite file; `None` while it is not there yet.
fn sqlite_number(path: &Path, sql: &str) -> Option<i64> {
    let mut c = diesel::sqlite::SqliteConnection::establish(path.to_str()?).ok()?;
    diesel::sql_query(sql)
        .get_result::<N>(&mut c)
        .ok()
        .map(|r| r.n)
}

/// The group read every entry of the stream and has none pending.
fn drained(stream: &str, group: &str) -> bool {
    let Ok(mut c) = redis::Client::open(REDIS).and_then(|c| c.get_connection()) else {
        return false;
    };
    let last: redis::RedisResult<redis::streams::StreamRangeReply> = redis::cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(&mut c);
    let Some(last) = last.ok().and_then(|r| r.ids.into_iter().next()) else {
        return false;
    };
    let groups: redis::RedisResult<Vec<std::collections::HashMap<String, redis::Value>>> =
        redis::cmd("XINFO").arg("GROUPS").arg(stream).query(&mut c);
    let Ok(groups) = groups else { return false };
    groups.iter().any(|g| {
        let s = |k: &str| -> Option<String> {
            g.get(k).and_then(|v| redis::from_redis_value_ref(v).ok())
        };
        s("name").as_deref() == Some(group)
            && s("last-delivered-id").as_deref() == Some(last.id.as_str())
            && s("pending").as_deref() == Some("0")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_example_takes_one_unit_per_paid_order_from_the_sandbox_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let port = free_port();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let stream = Stream(format!(
        "paynotify:test:consumer:{}:{n}",
        std::process::id()
    ));
    let order_no = format!("CE{}N{n}", std::process::id());
    let inventory = inventory_binary();
    let db = d.join("inventory.db");
    let mut children = Children(Vec::new());

    // The sandbox's keys and config, on a port of the test's own.
    let mut keys = Command::new(BIN);
    keys.args(["sandbox-keys", "--out"])
        .arg(d)
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    show(d, &keys);
    let out = keys.output().expect("sandbox-keys runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The service, relaying to the test's stream.
    let mut serve = Command::new(BIN);
    serve
        .args(["serve", "--config", "paynotify.toml"])
        .current_dir(d)
        .env("PAYNOTIFY__RELAY__SINK", "redis-stream")
        .env("PAYNOTIFY__RELAY__REDIS_URL", REDIS)
        .env("PAYNOTIFY__RELAY__REDIS_STREAM", &stream.0)
        .env("RUST_LOG", "warn");
    show(d, &serve);
    let (o, e) = log(d, "serve.log");
    children
        .0
        .push(serve.stdout(o).stderr(e).spawn().expect("serve starts"));

    // The consumer.
    let mut consume = Command::new(&inventory);
    consume
        // The group may be made after the service relayed the payment: take the stream's
        // history (the test's own stream).
        .args(["--sink", "redis", "--stream", &stream.0, "--start-id", "0"])
        .arg("--database")
        .arg(&db)
        .current_dir(d);
    show(d, &consume);
    let (o, e) = log(d, "inventory.log");
    children.0.push(
        consume
            .stdout(o)
            .stderr(e)
            .spawn()
            .expect("inventory starts"),
    );

    // One order, paid with the same notification three times.
    let mut replay = Command::new(BIN);
    replay
        .args([
            "replay",
            "wechat",
            "--config",
            "paynotify.toml",
            "--wait",
            "30",
        ])
        .args([
            "--order-no",
            &order_no,
            "--amount-fen",
            "19900",
            "--times",
            "3",
        ])
        .arg("--create-order")
        .current_dir(d);
    show(d, &replay);
    let out = replay.output().expect("replay runs");
    let logs = || {
        format!(
            "--- serve ---\n{}\n--- inventory ---\n{}",
            std::fs::read_to_string(d.join("serve.log")).unwrap_or_default(),
            std::fs::read_to_string(d.join("inventory.log")).unwrap_or_default()
        )
    };
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        logs()
    );

    let paid = format!("ORDER_PAID:{order_no}");
    let on_hand = "SELECT on_hand AS n FROM stock WHERE sku = 'SKU-1'";
    let moves = format!("SELECT COUNT(*) AS n FROM stock_move WHERE message_id = '{paid}'");
    let start = Instant::now();
    loop {
        if sqlite_number(&db, &moves) == Some(1) && drained(&stream.0, "inventory") {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the payment did not reach the inventory within {DEADLINE:?}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("(cd {}) $ sqlite3 inventory.db \"{on_hand}\"", d.display());
    assert_eq!(
        sqlite_number(&db, on_hand),
        Some(99),
        "one unit left the default 100"
    );
    assert_eq!(sqlite_number(&db, &moves), Some(1), "moved once");
    assert_eq!(
        sqlite_number(&db, "SELECT COUNT(*) AS n FROM stock_move"),
        Some(1),
        "nothing else moved"
    );
    assert_eq!(
        sqlite_number(
            &db,
            &format!("SELECT COUNT(*) AS n FROM processed_message WHERE message_id = '{paid}'")
        ),
        Some(1)
    );

    // The service relayed one event for the three notifications; a copy of it written to
    // the stream again (a relay that re-sent after a lost answer) moves nothing more.
    let mut c = redis::Client::open(REDIS)
        .and_then(|c| c.get_connection())
        .expect("redis");
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&stream.0)
        .arg("-")
        .arg("+")
        .query(&mut c)
        .expect("XRANGE");
    assert_eq!(entries.ids.len(), 1, "one event relayed for one payment");
    let mut again = redis::cmd("XADD");
    again.arg(&stream.0).arg("*");
    for (field, value) in &entries.ids[0].map {
        let value: Vec<u8> = redis::from_redis_value_ref(value).expect("a bulk string field");
        again.arg(field).arg(value);
    }
    println!("$ redis-cli XADD {} '*' <the same fields>", stream.0);
    let _: String = again.query(&mut c).expect("XADD");
    let start = Instant::now();
    while !drained(&stream.0, "inventory") {
        assert!(
            start.elapsed() < DEADLINE,
            "the copy was not read within {DEADLINE:?}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        sqlite_number(&db, on_hand),
        Some(99),
        "the copy moved nothing"
    );
    assert_eq!(
        sqlite_number(&db, "SELECT COUNT(*) AS n FROM stock_move"),
        Some(1),
        "the copy moved nothing"
    );
}
