//! The QA tools end to end, as a tester uses them: `paynotify sandbox-keys`, `paynotify serve`
//! as a child process on that config, `paynotify replay` against it, and `/metrics`.

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use crate::support::helpers::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_paynotify");

/// Where a child service writes: the test's output with `TEST_LOG`, else nowhere.
fn child_log() -> std::process::Stdio {
    if std::env::var_os("TEST_LOG").is_some() {
        std::process::Stdio::inherit()
    } else {
        std::process::Stdio::null()
    }
}

struct Service {
    child: Child,
    base: String,
    token: String,
}

impl Service {
    async fn start(dir: &Path) -> Self {
        // reqwest has no TLS provider of its own in this build: ring, before any client.
        paynotify::https::install_crypto();
        let port = free_port();
        let child = Command::new(BIN)
            .args(["serve", "--config", "paynotify.toml"])
            .current_dir(dir)
            .env("PAYNOTIFY__SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            // Its logs only with TEST_LOG, like the in-process service's.
            .stderr(child_log())
            .stdout(child_log())
            .spawn()
            .expect("paynotify serve starts");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("{base}/healthz")).await.is_err() {
            assert!(Instant::now() < deadline, "paynotify serve did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let config = std::fs::read_to_string(dir.join("paynotify.toml")).expect("config");
        let token = config
            .lines()
            .find_map(|l| l.strip_prefix("api_token = \""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("api_token in the sandbox config")
            .to_owned();
        Self { child, base, token }
    }

    fn replay(&self, dir: &Path, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("replay")
            .args(args)
            .args(["--config", "paynotify.toml", "--target", &self.base])
            .current_dir(dir)
            .output()
            .expect("paynotify replay runs")
    }

    async fn status_of(&self, order_no: &str) -> String {
        let order: serde_json::Value = reqwest::Client::new()
            .get(format!("{}/orders/{order_no}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("GET order")
            .json()
            .await
            .expect("order JSON");
        order["status"].as_str().unwrap_or_default().to_owned()
    }

    async fn metrics(&self) -> Vec<(String, f64)> {
        let text = reqwest::get(format!("{}/metrics", self.base))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("text");
        parse_prometheus(&text)
    }

    /// SIGTERM, and the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("paynotify serve did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Prometheus text format: `# HELP`/`# TYPE` lines, and `name{labels} value` samples.
fn parse_prometheus(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                comment.starts_with("HELP ") || comment.starts_with("TYPE "),
                "bad comment: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels: {line}");
        }
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        samples.push((series.to_owned(), value));
    }
    samples
}

fn sample(samples: &[(String, f64)], series: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s == series)
        .map_or(0.0, |(_, v)| *v)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_keys_serve_and_replay_end_to_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["sandbox-keys", "--out"])
        .arg(dir.path())
        .output()
        .expect("sandbox-keys runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    #[cfg(unix)]
    for private in [
        "keys/wechat_platform_private.pem",
        "keys/alipay_private.pem",
        "keys/wechat_merchant_private.pem",
        "keys/alipay_app_private.pem",
        "paynotify.toml",
    ] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(private))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{private}");
    }
    // Running it again never overwrites keys.
    let again = Command::new(BIN)
        .args(["sandbox-keys", "--out"])
        .arg(dir.path())
        .output()
        .expect("runs");
    assert!(!again.status.success());

    let service = Service::start(dir.path()).await;
    let d = dir.path();

    let wechat = service.replay(
        d,
        &[
            "wechat",
            "--order-no",
            "QA-W",
            "--amount-fen",
            "19900",
            "--times",
            "10",
            "--concurrency",
            "5",
            "--create-order",
        ],
    );
    assert!(
        wechat.status.success(),
        "{}{}",
        stdout(&wechat),
        String::from_utf8_lossy(&wechat.stderr)
    );
    let text = stdout(&wechat);
    assert_eq!(
        text.lines().filter(|l| l.starts_with('#')).count(),
        10,
        "{text}"
    );
    assert!(
        text.contains("summary: sent 10 | 204×10 |") && text.contains("expected 204: ok"),
        "{text}"
    );
    assert_eq!(service.status_of("QA-W").await, "PAID");

    let alipay = service.replay(
        d,
        &[
            "alipay",
            "--order-no",
            "QA-A",
            "--amount-fen",
            "990",
            "--times",
            "10",
            "--concurrency",
            "5",
            "--create-order",
        ],
    );
    assert!(alipay.status.success(), "{}", stdout(&alipay));
    assert!(
        stdout(&alipay).contains("summary: sent 10 | 200×10 |"),
        "{}",
        stdout(&alipay)
    );
    assert_eq!(service.status_of("QA-A").await, "PAID");

    let refund = service.replay(
        d,
        &[
            "wechat-refund",
            "--order-no",
            "QA-W",
            "--amount-fen",
            "19900",
            "--out-refund-no",
            "R1",
            "--refund-fen",
            "19900",
        ],
    );
    assert!(refund.status.success(), "{}", stdout(&refund));
    assert_eq!(service.status_of("QA-W").await, "REFUNDED");

    let alipay_refund = service.replay(
        d,
        &[
            "alipay-refund",
            "--order-no",
            "QA-A",
            "--amount-fen",
            "990",
            "--out-refund-no",
            "R1",
            "--refund-fen",
            "990",
        ],
    );
    assert!(alipay_refund.status.success(), "{}", stdout(&alipay_refund));
    assert_eq!(service.status_of("QA-A").await, "REFUNDED");

    let metrics = service.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            r#"paynotify_notifications_total{channel="wechat",outcome="applied"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(
            &metrics,
            r#"paynotify_notifications_total{channel="wechat",outcome="duplicate"}"#
        ),
        9.0
    );
    assert_eq!(
        sample(
            &metrics,
            r#"paynotify_notifications_total{channel="alipay",outcome="applied"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(
            &metrics,
            r#"paynotify_notifications_total{channel="alipay",outcome="duplicate"}"#
        ),
        9.0
    );
    assert!(
        sample(
            &metrics,
            r#"paynotify_http_request_duration_seconds_count{method="POST",route="/notify/wechat/pay"}"#
        ) >= 10.0
    );
    assert!(
        metrics
            .iter()
            .any(|(s, _)| s.starts_with("paynotify_db_pool_connections{"))
    );
    assert!(metrics.iter().any(|(s, _)| s == "paynotify_relay_pending"));

    // Each way of breaking a notification gets the contract's answer and leaves the order unpaid.
    let cases: [(&str, &str, &str); 8] = [
        ("wechat", "--bad-signature", "bad_signature"),
        ("wechat", "--tamper-amount", "bad_signature"),
        ("wechat", "--stale", "stale"),
        ("wechat", "--unknown-serial", "unknown_serial"),
        ("wechat", "--probe", "bad_signature"),
        ("alipay", "--bad-signature", "bad_signature"),
        ("alipay", "--tamper-amount", "bad_signature"),
        ("alipay", "--unknown-serial", "bad_signature"),
    ];
    for (i, (kind, flag, reason)) in cases.iter().enumerate() {
        let no = format!("QA-N{i}");
        let series =
            format!(r#"paynotify_notify_rejections_total{{channel="{kind}",reason="{reason}"}}"#);
        let before = sample(&service.metrics().await, &series);
        let out = service.replay(
            d,
            &[
                kind,
                "--order-no",
                &no,
                "--amount-fen",
                "100",
                "--create-order",
                flag,
            ],
        );
        let text = stdout(&out);
        assert!(out.status.success(), "{kind} {flag}: {text}");
        assert!(
            text.contains("401×1") && text.contains("expected 401: ok"),
            "{kind} {flag}: {text}"
        );
        assert_eq!(service.status_of(&no).await, "WAIT_PAY", "{kind} {flag}");
        assert_eq!(
            sample(&service.metrics().await, &series),
            before + 1.0,
            "{kind} {flag}"
        );
    }

    // Exit status is non-zero when a response is not what the contract says: an order that
    // does not exist answers 404, not 204.
    let missing = service.replay(
        d,
        &["wechat", "--order-no", "QA-NONE", "--amount-fen", "100"],
    );
    assert!(!missing.status.success());
    assert!(
        stdout(&missing).contains("MISMATCH"),
        "{}",
        stdout(&missing)
    );

    assert!(
        service.stop().success(),
        "a clean shutdown on SIGTERM exits 0"
    );
    assert!(
        d.join("data/paynotify.db").exists(),
        "the sandbox database lives in the sandbox directory"
    );
}

/// A fresh sandbox (`paynotify sandbox-keys`) served by `paynotify serve`.
async fn served_sandbox() -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["sandbox-keys", "--out"])
        .arg(dir.path())
        .output()
        .expect("sandbox-keys runs");
    assert!(out.status.success());
    let service = Service::start(dir.path()).await;
    (dir, service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_wechat_combined_pays_every_sub_order_once() {
    let (dir, service) = served_sandbox().await;
    let d = dir.path();
    let client = reqwest::Client::new();
    let created = client
        .post(format!("{}/combined-orders", service.base))
        .bearer_auth(&service.token)
        .json(&serde_json::json!({
            "combine_out_trade_no": "QA-C1",
            "channel": "wechat",
            "account": paynotify::qa::sandbox::WECHAT_MCHID,
            "sub_orders": [
                {"order_no": "QA-C1-1", "amount_fen": 1000},
                {"order_no": "QA-C1-2", "amount_fen": 2500}
            ]
        }))
        .send()
        .await
        .expect("POST /combined-orders");
    assert_eq!(created.status(), 201, "{:?}", created.text().await);
    let args = [
        "wechat-combined",
        "--combine-no",
        "QA-C1",
        "--sub",
        "QA-C1-1:1000",
        "--sub",
        "QA-C1-2:2500",
    ];
    let first = service.replay(d, &args);
    assert!(
        first.status.success(),
        "{}{}",
        stdout(&first),
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        stdout(&first).contains("expected 204: ok"),
        "{}",
        stdout(&first)
    );
    assert_eq!(service.status_of("QA-C1-1").await, "PAID");
    assert_eq!(service.status_of("QA-C1-2").await, "PAID");
    let combination = || async {
        client
            .get(format!("{}/combined-orders/QA-C1", service.base))
            .bearer_auth(&service.token)
            .send()
            .await
            .expect("GET /combined-orders")
            .json::<serde_json::Value>()
            .await
            .expect("JSON")
    };
    assert_eq!(combination().await["status"], "PAID");
    let paid_events = || async {
        client
            .get(format!("{}/admin/messages?limit=1000", service.base))
            .bearer_auth(&service.token)
            .send()
            .await
            .expect("GET /admin/messages")
            .text()
            .await
            .expect("text")
            .matches("ORDER_PAID")
            .count()
    };
    let paid = paid_events().await;
    assert!(paid >= 2, "one ORDER_PAID per sub-order: {paid}");

    // WeChat's retry: re-encrypted, re-signed, the same content. Acknowledged, nothing new.
    let second = service.replay(d, &args);
    assert!(second.status.success(), "{}", stdout(&second));
    assert_eq!(paid_events().await, paid);
    assert_eq!(combination().await["status"], "PAID");

    // Flags of the other kinds are refused before anything is sent.
    let mixed = service.replay(d, &["wechat-combined", "--combine-no", "QA-C2"]);
    assert!(!mixed.status.success());
    let bad_sub = service.replay(
        d,
        &[
            "wechat-combined",
            "--combine-no",
            "QA-C2",
            "--sub",
            "QA-C2-1",
        ],
    );
    assert!(!bad_sub.status.success());
    assert!(service.stop().success());
}

/// `paynotify forge` then `paynotify load` (the open-loop benchmark's two tools) against a
/// served sandbox: every forged notification is answered 204 once, every order is paid, and
/// the same file sent again is answered 204 again as repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forge_then_load_pays_every_order_once_at_a_fixed_rate() {
    let (dir, service) = served_sandbox().await;
    let d = dir.path();
    let client = reqwest::Client::new();
    const N: usize = 30;
    for i in 1..=N {
        let created = client
            .post(format!("{}/orders", service.base))
            .bearer_auth(&service.token)
            .json(&serde_json::json!({ "order_no": format!("QA-L{i}"), "amount_fen": 700, "subject": "load" }))
            .send()
            .await
            .expect("POST /orders");
        assert_eq!(created.status(), 201, "{:?}", created.text().await);
    }
    let file = d.join("requests");
    let forged = Command::new(BIN)
        .args([
            "forge",
            "wechat",
            "--prefix",
            "QA-L",
            "--count",
            &N.to_string(),
        ])
        .args(["--amount-fen", "700", "--config", "paynotify.toml", "--out"])
        .arg(&file)
        .current_dir(d)
        .output()
        .expect("forge runs");
    assert!(
        forged.status.success(),
        "{}",
        String::from_utf8_lossy(&forged.stderr)
    );
    let target = service.base.trim_start_matches("http://").to_owned();
    let load = |rate: &str| {
        let out = Command::new(BIN)
            .args([
                "load",
                "--target",
                &target,
                "--rate",
                rate,
                "--connections",
                "4",
                "--requests",
            ])
            .arg(&file)
            .output()
            .expect("load runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout(&out)
    };
    let started = Instant::now();
    let first = load("100");
    // Thirty requests due 10 ms apart: the last is due 290 ms after the first.
    assert!(started.elapsed() >= Duration::from_millis(290), "{first}");
    assert!(
        first.contains(&format!(" sent={N} ok={N} errors=0 statuses=- ")),
        "{first}"
    );
    for i in [1, N / 2, N] {
        assert_eq!(service.status_of(&format!("QA-L{i}")).await, "PAID");
    }
    let again = load("500");
    assert!(
        again.contains(&format!(" sent={N} ok={N} errors=0 ")),
        "{again}"
    );
    // Each order applied once, then answered as a duplicate once.
    let metrics = service.metrics().await;
    for (outcome, want) in [("applied", N), ("duplicate", N)] {
        let series =
            format!(r#"paynotify_notifications_total{{channel="wechat",outcome="{outcome}"}}"#);
        assert_eq!(sample(&metrics, &series), want as f64, "{series}");
    }
    assert!(service.stop().success());
}
