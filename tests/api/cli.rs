//! The `paynotify` command as an operator meets it: start-up messages, replay's flag checks,
//! sandbox-keys' listen address, and what the logs look like in a file.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::helpers::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_paynotify");

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A configuration on an SQLite file in `dir`.
fn sqlite_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        format!(
            "[database]\nurl = \"sqlite://{}\"\n",
            dir.join("data/p.db").display()
        ),
    )
    .expect("write config");
    path
}

fn sandbox(dir: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["sandbox-keys", "--out"])
        .arg(dir)
        .args(extra)
        .output()
        .expect("sandbox-keys runs")
}

#[test]
fn sandbox_keys_listens_on_another_port_than_the_default_config_unless_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = sandbox(dir.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let config = std::fs::read_to_string(dir.path().join("paynotify.toml")).expect("config");
    assert!(config.contains("listen = \"127.0.0.1:8081\""), "{config}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("127.0.0.1:8081"));

    let other = tempfile::tempdir().expect("tempdir");
    let out = sandbox(other.path(), &["--listen", "127.0.0.1:18555"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let config = std::fs::read_to_string(other.path().join("paynotify.toml")).expect("config");
    assert!(config.contains("listen = \"127.0.0.1:18555\""), "{config}");
}

#[test]
fn replay_refuses_a_flag_that_does_not_apply_before_creating_the_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(sandbox(dir.path(), &[]).status.success());
    // Anything replay sends would arrive here.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let target = format!("http://{}", listener.local_addr().expect("addr"));
    let cases: [(&[&str], &str); 3] = [
        (&["alipay", "--stale"], "--stale"),
        (&["alipay", "--probe"], "--probe"),
        (&["wechat", "--refund-fen", "5"], "--refund-fen"),
    ];
    for (args, named) in cases {
        let out = Command::new(BIN)
            .arg("replay")
            .args(args)
            .args(["--order-no", "V1", "--amount-fen", "100", "--create-order"])
            .args(["--config", "paynotify.toml", "--target", &target])
            .current_dir(dir.path())
            .output()
            .expect("replay runs");
        assert!(!out.status.success(), "{args:?} is refused");
        assert!(stderr(&out).contains(named), "{args:?}: {}", stderr(&out));
        assert!(
            matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "{args:?}: nothing was sent (no order created)"
        );
    }
}

#[test]
fn start_up_warns_about_environment_variables_that_configure_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = sqlite_config(dir.path());
    let out = Command::new(BIN)
        .args(["migrate", "--config"])
        .arg(&config)
        .env("PAYNOTIFY_SERVER_LISTEN", "0.0.0.0:9")
        .output()
        .expect("migrate runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("PAYNOTIFY_SERVER_LISTEN is ignored")
            && text.contains("PAYNOTIFY__SERVER__LISTEN"),
        "{text}"
    );
}

/// Both providers' bill days are Beijing days: another `bills.timezone` is warned about at
/// start-up, the default is not.
#[test]
fn start_up_warns_about_a_bill_timezone_other_than_beijing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = sqlite_config(dir.path());
    let migrate = |zone: Option<&str>| {
        let mut command = Command::new(BIN);
        command.args(["migrate", "--config"]).arg(&config);
        if let Some(zone) = zone {
            command.env("PAYNOTIFY__BILLS__TIMEZONE", zone);
        }
        let out = command.output().expect("migrate runs");
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let text = migrate(Some("Europe/Berlin"));
    assert!(
        text.contains("bills.timezone is \"Europe/Berlin\"") && text.contains("Asia/Shanghai"),
        "{text}"
    );
    for zone in [None, Some("Asia/Shanghai")] {
        let text = migrate(zone);
        assert!(!text.contains("bills.timezone"), "{zone:?}: {text}");
    }
}

#[test]
fn an_unreachable_postgres_is_one_line_with_host_port_database_and_cause_never_the_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = sqlite_config(dir.path());
    let port = free_port();
    for command in ["migrate", "serve"] {
        let out = Command::new(BIN)
            .args([command, "--config"])
            .arg(&config)
            .env(
                "PAYNOTIFY__DATABASE__URL",
                format!("postgres://app:pw-SECRET@127.0.0.1:{port}/paydb"),
            )
            .env(
                "PAYNOTIFY__SERVER__LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{command}");
        let text = stderr(&out);
        let expected = format!(
            "cannot connect to PostgreSQL at host 127.0.0.1, port {port}, database \"paydb\", user \"app\": Connection refused"
        );
        assert!(text.contains(&expected), "{command}: {text}");
        assert_eq!(
            text.matches("cannot connect").count(),
            1,
            "{command}: {text}"
        );
        assert!(!text.contains("SECRET"), "{command}: {text}");
    }
}

/// `paynotify serve` on a sandbox, stderr to a file; one WeChat payment replayed at it;
/// SIGTERM. Returns the log file's contents.
fn serve_and_log(dir: &Path, format: &str) -> String {
    let port = free_port();
    let log_path = dir.join(format!("serve-{format}.log"));
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut child = Command::new(BIN)
        .args(["serve", "--config", "paynotify.toml"])
        .current_dir(dir)
        .env("PAYNOTIFY__SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env("PAYNOTIFY__LOG__FORMAT", format)
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(log))
        .stdout(Stdio::null())
        .spawn()
        .expect("serve starts");
    let out = Command::new(BIN)
        .args(["replay", "wechat", "--config", "paynotify.toml"])
        .args([
            "--order-no",
            &format!("LOG-{format}"),
            "--amount-fen",
            "100",
        ])
        .args(["--create-order", "--wait", "30"])
        .args(["--target", &format!("http://127.0.0.1:{port}")])
        .current_dir(dir)
        .output()
        .expect("replay runs");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    std::fs::read_to_string(&log_path).expect("log")
}

#[test]
fn logs_in_a_file_have_no_colour_codes_and_json_lines_parse_with_request_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(sandbox(dir.path(), &[]).status.success());

    let text = serve_and_log(dir.path(), "text");
    assert!(text.contains("notification applied"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in a log file:\n{text}"
    );

    let json = serve_and_log(dir.path(), "json");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let serving = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("paynotify serving"))
        })
        .unwrap_or_else(|| panic!("a start-up line:\n{json}"));
    for key in ["backend", "redis_gate", "relay_sink", "jobs", "listen"] {
        assert!(
            !serving[key].is_null(),
            "start-up line lacks {key}: {serving}"
        );
    }
    let applied = lines
        .iter()
        .find(|l| l["message"] == "notification applied")
        .unwrap_or_else(|| panic!("a notification line:\n{json}"));
    assert_eq!(applied["channel"], "wechat", "{applied}");
    assert_eq!(applied["out_trade_no"], "LOG-json", "{applied}");
    assert_eq!(applied["outcome"], "applied", "{applied}");
    assert!(applied["latency_ms"].is_number(), "{applied}");
    assert!(
        applied["span"]["request_id"].is_string(),
        "the request id: {applied}"
    );
}

/// `server.workers` HTTP workers (threads of their own) and a runtime of `server.io_threads`
/// for the database, Redis and the sinks, as the start-up line says.
#[test]
fn serve_runs_the_threads_its_configuration_asks_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(sandbox(dir.path(), &[]).status.success());
    let port = free_port();
    let log_path = dir.path().join("threads.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut child = Command::new(BIN)
        .args(["serve", "--config", "paynotify.toml"])
        .current_dir(dir.path())
        .env("PAYNOTIFY__SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env("PAYNOTIFY__SERVER__WORKERS", "3")
        .env("PAYNOTIFY__SERVER__IO_THREADS", "2")
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(log))
        .stdout(Stdio::null())
        .spawn()
        .expect("serve starts");
    // actix names each worker's thread "actix-server worker N" (15 bytes of it in `comm`).
    let workers = || {
        std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .map(|tasks| {
                tasks
                    .filter_map(Result::ok)
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.starts_with("actix-server wo"))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut line, mut http) = (None, 0);
    while (line.is_none() || http != 3) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        line = std::fs::read_to_string(&log_path)
            .expect("log")
            .lines()
            .find(|l| l.contains("paynotify serving on"))
            .map(str::to_owned);
        http = workers();
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let line = line.expect("the start-up line");
    assert!(line.contains("workers=3"), "{line}");
    assert!(line.contains("io_threads=2"), "{line}");
    assert_eq!(http, 3, "HTTP worker threads");
}

#[test]
fn secrets_rotate_reseals_every_stored_account_under_the_new_key() {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use paynotify::notice::ChannelId;

    use crate::merchant_store::{account, key};

    let dir = tempfile::tempdir().expect("tempdir");
    let config = sqlite_config(dir.path());
    let migrated = Command::new(BIN)
        .args(["migrate", "--config"])
        .arg(&config)
        .output()
        .expect("migrate runs");
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let (old, new) = (key(1), key(2));
    let url = format!("sqlite://{}", dir.path().join("data/p.db").display());
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store = runtime.block_on(async {
        let store = paynotify::store::Store::connect(
            &crate::support::helpers::test_settings(&url).database,
        )
        .expect("store");
        for id in ["1900000101", "1900000102"] {
            let stored = account(
                &old,
                ChannelId::Wechat,
                id,
                paynotify::time::Timestamp::new(chrono::Utc::now()),
            );
            assert!(store.insert_merchant(&stored).await.expect("insert"));
        }
        store
    });
    let new_key_file = dir.path().join("new.key");
    std::fs::write(&new_key_file, format!("{}\n", STANDARD.encode([2u8; 32]))).expect("key file");
    let rotate = |current: Option<&str>| {
        let mut command = Command::new(BIN);
        command
            .args(["secrets", "rotate", "--new-key-file"])
            .arg(&new_key_file)
            .arg("--config")
            .arg(&config)
            .env_remove("PAYNOTIFY__SECRETS__MASTER_KEY");
        if let Some(current) = current {
            command.env("PAYNOTIFY__SECRETS__MASTER_KEY", current);
        }
        command.output().expect("rotate runs")
    };

    // Without the current key nothing can be opened.
    let out = rotate(None);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("secrets.master_key"),
        "{}",
        stderr(&out)
    );

    let out = rotate(Some(&STANDARD.encode([1u8; 32])));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!(
            "resealed 2 accounts under key id {}; set secrets.master_key to the new key and restart",
            new.id()
        )
    );
    runtime.block_on(async {
        for a in store.all_merchants().await.expect("read") {
            assert!(
                new.open(a.channel, &a.account, &a.sealed).is_ok(),
                "{}",
                a.account
            );
            assert!(
                old.open(a.channel, &a.account, &a.sealed).is_err(),
                "{}",
                a.account
            );
        }
    });

    // The new key as the current one: nothing to rotate.
    let out = rotate(Some(&STANDARD.encode([2u8; 32])));
    assert!(!out.status.success());
    assert!(stderr(&out).contains(new.id()), "{}", stderr(&out));
}
